"""The holders of the vacuum horizon that need a server of their own to exist: a prepared transaction
(the tests' server allows none: max_prepared_transactions = 0) and a replication slot whose standby keeps
a snapshot open with hot_standby_feedback. A primary and a streaming standby are made here with initdb and
pg_basebackup; the service on the primary must name each holder in its gauges and in /readyz."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.db import migrations
from tests.fixtures import tool_missing
from tests.service_process import free_port
from tests.waiting import until

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def _as_postgres(*command: str) -> list[str]:
    """PostgreSQL will not run as root: its tools run as the postgres user then."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else list(command)


def _run(*command: str) -> None:
    done = subprocess.run(_as_postgres(*command), capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def _pg_ctl(data: Path, *args: str) -> None:
    _run(str(PG_BIN / "pg_ctl"), "-D", str(data), *args)


def _start(data: Path, port: int, *settings: str) -> None:
    """Start the server in `data` on 127.0.0.1:`port` (its socket beside its data), with `settings`."""
    options = [f"port={port}", "listen_addresses=127.0.0.1", f"unix_socket_directories={data.parent}"]
    options += ["max_prepared_transactions=4", *settings]
    _pg_ctl(data, "-o", " ".join(f"-c {o}" for o in options), "-l", f"{data}.log", "-w", "start")


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[str, str]]:
    """A primary allowing prepared transactions, and a standby streaming from it through the physical
    slot `standby_slot` with hot_standby_feedback on: the DSNs of a database `jobq` on each."""
    if not (PG_BIN / "initdb").exists() or (os.geteuid() == 0 and shutil.which("runuser") is None):
        tool_missing("PostgreSQL 15's server binaries are not installed (apt-get install postgresql-15)")
    with tempfile.TemporaryDirectory(prefix="jobq-test-horizon-", ignore_cleanup_errors=True) as root:
        os.chmod(root, 0o777)
        primary, standby = Path(root, "primary"), Path(root, "standby")
        ports = free_port(), free_port()
        _run(str(PG_BIN / "initdb"), "-D", str(primary), "-U", "postgres", "--auth=trust")
        _start(primary, ports[0])
        try:
            base = ["-h", "127.0.0.1", "-p", str(ports[0]), "-U", "postgres"]
            _run(str(PG_BIN / "pg_basebackup"), *base, "-D", str(standby), "-R", "-C", "-S", "standby_slot")
            _start(standby, ports[1], "hot_standby_feedback=on")
            try:
                _run("psql", *base, "-c", "CREATE DATABASE jobq")
                dsn = f"postgresql://postgres@127.0.0.1:{ports[0]}/jobq"
                migrations.upgrade(dsn)
                yield dsn, f"postgresql://postgres@127.0.0.1:{ports[1]}/jobq"
            finally:
                _pg_ctl(standby, "-m", "immediate", "stop")
        finally:
            _pg_ctl(primary, "-m", "immediate", "stop")


def gauge(text: str, name: str, holder: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("holder") == holder:
                return sample.value
    raise AssertionError(f"no {name}{{holder={holder!r}}}")


async def test_a_prepared_transaction_and_a_standbys_slot_are_named(servers, start_service):
    primary, standby = servers
    service = start_service(database_url=primary, metrics_interval=0.2)
    conn = await asyncpg.connect(primary)
    reader = await asyncpg.connect(standby)
    try:
        # A standby query holding its snapshot: hot_standby_feedback pins the slot's xmin on the primary.
        snapshot = reader.transaction(isolation="repeatable_read")
        await snapshot.start()
        await reader.fetchval("SELECT count(*) FROM jobq.jobs")
        # A prepared transaction left behind by a two-phase commit that never finished.
        await conn.execute(
            "BEGIN; INSERT INTO jobq.queues (name) VALUES ('prepared'); PREPARE TRANSACTION 'export-42'"
        )
        for n in range(30):  # transactions go by: both holders fall behind
            await conn.execute("INSERT INTO jobq.queues (name) VALUES ($1)", f"q{n}")

        async with httpx.AsyncClient(base_url=service.url) as client:

            async def both_named() -> str | None:
                text = (await client.get("/metrics")).text
                ages = [
                    gauge(text, "jobq_xmin_horizon_age_transactions", h)
                    for h in ("prepared_transaction", "replication_slot")
                ]
                return text if min(ages) >= 30 else None

            text = await until(both_named, timeout=20)
            assert gauge(text, "jobq_xmin_horizon_age_seconds", "prepared_transaction") > 0
            ready = (await client.get("/readyz")).json()
        oldest = ready["database_health"]["oldest_snapshot"]
        assert oldest["holder"] in ("prepared_transaction", "replication_slot")
        assert oldest["xid_age"] >= 30
        named = {"prepared_transaction": "export-42", "replication_slot": "standby_slot"}
        assert oldest["name"] == named[oldest["holder"]], oldest
    finally:
        await conn.execute("ROLLBACK PREPARED 'export-42'")
        await conn.close()
        await reader.close()
