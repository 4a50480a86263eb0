"""Several database hosts in one URL (`postgresql://h1:p1,h2:p2/db?target_session_attrs=read-write`, as
libpq and asyncpg write it): the pool, the LISTEN connection and migrations go to the first host that
answers and accepts writes; and a failover under load on pg_auto_failover (a monitor and two nodes with
synchronous replication), checked from the clients' own ledgers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import pytest

from app.db import migrations
from tests.fixtures import tool_missing
from tests.http.test_metrics import scrape, value
from tests.service_process import free_port
from tests.waiting import until

pytestmark = pytest.mark.anyio


def with_a_dead_host_first(dsn: str) -> str:
    """`dsn` with a host nobody listens on before its own."""
    parts = urlsplit(dsn)
    if not parts.hostname:
        pytest.skip("needs the tests' PostgreSQL on TCP (JOBQ_TEST_DATABASE_URL), not on a socket")
    user = f"{parts.username}@" if parts.username else ""
    hosts = f"127.0.0.1:{free_port()},{parts.hostname}:{parts.port or 5432}"
    query = "&".join(filter(None, [parts.query, "target_session_attrs=read-write"]))
    return urlunsplit(parts._replace(netloc=f"{user}{hosts}", query=query))


async def test_a_multi_host_url_serves_from_the_host_that_answers(database_url, start_service):
    dsn = with_a_dead_host_first(database_url)
    await asyncio.to_thread(migrations.upgrade, dsn)  # Alembic reaches it too (at head: nothing to do)
    service = start_service(database_url=dsn, listen_url=dsn, database_pool_mode="session")
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        waiting = asyncio.create_task(client.post("/lease", json={"queue": "q", "wait": 10}))
        await asyncio.sleep(0.3)
        r = await client.post("/jobs", json={"queue": "q", "payload": {"n": 1}})
        assert r.status_code == 201, r.text
        (job,) = (await waiting).json()["jobs"]
        assert job["id"] == r.json()["id"]
        assert value(await scrape(client), "jobq_listener_up") == 1.0


# --- failover on pg_auto_failover --------------------------------------------------------------------

AUTOCTL = shutil.which("pg_autoctl")
PG_BIN = Path(
    "/usr/lib/postgresql/15/bin"
)  # Debian's PostgreSQL 15, which postgresql-15-auto-failover extends
# The monitor's health checks, quickened from their defaults (5 s period, 20 s until a node is unhealthy,
# 30 s for a primary to demote itself) so the test takes seconds, not a minute; the order of events is
# the same. What each means: pg_auto_failover's docs, "Configuring pg_auto_failover".
MONITOR_SETTINGS = {
    "pgautofailover.health_check_period": 1000,
    "pgautofailover.health_check_timeout": 1000,
    "pgautofailover.health_check_max_retries": 1,
    "pgautofailover.health_check_retry_delay": 500,
    "pgautofailover.node_considered_unhealthy_timeout": 3000,
    "pgautofailover.primary_demote_timeout": 3000,
}
WRITABLE = ("wait_primary", "primary")  # states in which a node takes writes


class Cluster:
    """A pg_auto_failover monitor and two PostgreSQL nodes with synchronous replication, on local ports,
    everything under `root`, run as the postgres user (PostgreSQL will not run as root)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ports = {name: free_port() for name in ("monitor", "node1", "node2")}
        self.env = {
            **os.environ,
            "PATH": f"{PG_BIN}:{os.environ['PATH']}",
            "XDG_CONFIG_HOME": str(root / "config"),  # pg_autoctl keeps its files there, not in ~postgres
            "XDG_DATA_HOME": str(root / "data"),
            "XDG_RUNTIME_DIR": str(root / "run"),
        }
        self.processes: dict[str, subprocess.Popen] = {}
        self.monitor_url = f"postgresql://postgres@127.0.0.1:{self.ports['monitor']}/pg_auto_failover"
        nodes = ",".join(f"127.0.0.1:{self.ports[n]}" for n in ("node1", "node2"))
        self.dsn = f"postgresql://postgres@{nodes}/jobq?target_session_attrs=read-write"

    def command(self, *args: str) -> list[str]:
        as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        return [*as_postgres, AUTOCTL, *args]  # type: ignore[list-item]

    def start(self, name: str, *args: str) -> None:
        """`pg_autoctl <args>` in a process group of its own (SIGKILL to the group is a lost machine)."""
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - kept for the process's life
        self.processes[name] = subprocess.Popen(
            self.command(*args), env=self.env, stdout=log, stderr=log, start_new_session=True
        )

    def node_args(self, name: str) -> list[str]:
        return [
            *("create", "postgres", "--pgdata", str(self.root / name), "--pgport", str(self.ports[name])),
            *("--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl", "--dbname", "jobq", "--run"),
            *("--monitor", f"postgres://autoctl_node@127.0.0.1:{self.ports['monitor']}/pg_auto_failover"),
        ]

    async def states(self) -> dict[str, str]:
        """Each node's state as the monitor last heard it (reported), by our name for its port (the
        monitor's names number its registrations, and a node that registers again gets a new one)."""
        names = {port: name for name, port in self.ports.items()}
        conn = await asyncpg.connect(self.monitor_url)
        try:
            rows = await conn.fetch("SELECT nodeport, reportedstate::text FROM pgautofailover.node")
        finally:
            await conn.close()
        return {names.get(row["nodeport"], str(row["nodeport"])): row["reportedstate"] for row in rows}

    async def checkpoint(self, name: str) -> None:
        """A standby's base backup waits for a checkpoint on the primary; a spread one takes minutes."""
        with contextlib.suppress(OSError, asyncpg.PostgresError):
            conn = await asyncpg.connect(
                f"postgresql://postgres@127.0.0.1:{self.ports[name]}/jobq", timeout=2
            )
            try:
                await conn.execute("CHECKPOINT")
            finally:
                await conn.close()

    async def up(self) -> None:
        monitor = self.root / "monitor"
        create = self.command(
            *("create", "monitor", "--pgdata", str(monitor), "--pgport", str(self.ports["monitor"])),
            *("--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl"),
        )
        done = await asyncio.to_thread(subprocess.run, create, env=self.env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        self.start("monitor", "run", "--pgdata", str(monitor))
        await until(lambda: self.reached({}), timeout=60, every=0.2)  # the monitor answers
        conn = await asyncpg.connect(self.monitor_url)
        for setting, amount in MONITOR_SETTINGS.items():
            await conn.execute(f"ALTER SYSTEM SET {setting} = {amount}")
        await conn.execute("SELECT pg_reload_conf()")
        await conn.close()
        self.start("node1", *self.node_args("node1"))
        await until(lambda: self.reached({"node1": "single"}), timeout=120, every=0.5)
        self.start("node2", *self.node_args("node2"))

        async def replicating() -> bool:
            await self.checkpoint("node1")
            return await self.reached({"node1": "primary", "node2": "secondary"})

        try:
            await until(replicating, timeout=180, every=1.0)
        except AssertionError as failed:
            raise AssertionError(f"{failed}\n{await self.story()}") from None

    async def story(self) -> str:
        """What the monitor knows of each node, and the end of each process's log: why a cluster did not
        come up."""
        try:
            conn = await asyncpg.connect(self.monitor_url, timeout=5)
            try:
                rows = await conn.fetch(
                    "SELECT nodename, nodeport, reportedstate::text, goalstate::text, health, "
                    "reportedlsn::text FROM pgautofailover.node ORDER BY nodeid"
                )
                events = await conn.fetch(
                    "SELECT eventtime::text, description FROM pgautofailover.event "
                    "ORDER BY eventid DESC LIMIT 15"
                )
            finally:
                await conn.close()
            told = [f"  {dict(row)}" for row in rows] + [
                f"  {e['eventtime']} {e['description']}" for e in events[::-1]
            ]
        except (OSError, asyncpg.PostgresError) as error:
            told = [f"  the monitor did not answer: {error!r}"]
        for name in self.processes:
            lines = (self.root / f"{name}.log").read_text(errors="replace").splitlines()
            told += [f"--- {name}.log, last lines:", *lines[-25:]]
        return "\n".join(told)

    async def reached(self, wanted: dict[str, str]) -> bool:
        with contextlib.suppress(OSError, asyncpg.PostgresError):
            states = await self.states()
            return all(states.get(node) == state for node, state in wanted.items())
        return False

    def lose(self, name: str) -> None:
        """The node's machine is gone: its keeper and PostgreSQL killed at once, with SIGKILL."""
        os.killpg(self.processes[name].pid, signal.SIGKILL)

    def down(self) -> None:
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    if AUTOCTL is None or not (PG_BIN / "pg_ctl").exists():
        packages = "pg-auto-failover-cli postgresql-15-auto-failover"
        tool_missing(f"pg_auto_failover is not installed (apt-get install {packages})")
    # Not under pytest's own temporary directory, which only its owner may enter.
    with tempfile.TemporaryDirectory(prefix="jobq-test-ha-", ignore_cleanup_errors=True) as root:
        os.chmod(root, 0o777)
        made = Cluster(Path(root))
        try:
            await made.up()
            yield made
        finally:
            await asyncio.to_thread(made.down)


@dataclass
class Ledger:
    """What the producers and workers were told, each answer with its time."""

    enqueued: list[int] = field(default_factory=list)  # ids answered 201
    acked: list[tuple[int, str]] = field(default_factory=list)  # (job id, worker) answered 200
    statuses: Counter = field(default_factory=Counter)  # every answer's status
    problems: list[str] = field(default_factory=list)  # answers that break the contract
    enqueue_times: list[tuple[float, int]] = field(default_factory=list)  # (time, status)

    def answer(self, response: httpx.Response) -> None:
        self.statuses[response.status_code] += 1
        if response.status_code >= 500 and (
            response.status_code != 503 or "retry-after" not in response.headers
        ):
            self.problems.append(f"{response.request.url.path}: {response.status_code} {response.text[:200]}")


@pytest.mark.slow
async def test_failover_loses_no_acknowledged_enqueue_or_ack(cluster, start_service):
    """Mixed load (producers, 16 workers long-polling), then the primary's machine is lost (SIGKILL to
    its keeper and PostgreSQL) and the monitor promotes the standby. From the producers' and workers' own
    ledgers: every enqueue answered 201 exists, every ack answered 200 stays completed, no job is acked
    under two leases, none is lost; the service answers 503 with Retry-After in the gap, never 500, and
    serves again within 10 s of the promotion."""
    await asyncio.to_thread(migrations.upgrade, cluster.dsn)
    service = start_service(
        database_url=cluster.dsn,
        listen_url=cluster.dsn,
        database_pool_mode="session",
        pool_acquire_timeout=1.0,
        statement_timeout=5.0,
        wakeup_safety_interval=1.0,
    )
    ledger = Ledger()
    stop_producing, stop_working = asyncio.Event(), asyncio.Event()
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        r = await client.patch("/queues/ha", json={"visibility_timeout": 5})
        assert r.status_code == 200, r.text

        async def produce(n: int) -> None:
            i = 0
            while not stop_producing.is_set():
                r = await client.post("/jobs", json={"queue": "ha", "payload": {"producer": n, "i": i}})
                ledger.answer(r)
                ledger.enqueue_times.append((time.monotonic(), r.status_code))
                if r.status_code == 201:
                    ledger.enqueued.append(r.json()["id"])
                    i += 1
                else:
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0.005)

        async def work(worker: str) -> None:
            while not stop_working.is_set():
                r = await client.post(
                    "/lease", json={"queue": "ha", "max_jobs": 3, "wait": 1, "worker_id": worker}
                )
                ledger.answer(r)
                if r.status_code != 200:
                    await asyncio.sleep(0.1)
                    continue
                for job in r.json()["jobs"]:
                    r = await client.post("/ack", json={"id": job["id"], "lease_token": job["lease_token"]})
                    ledger.answer(r)
                    if r.status_code == 200:
                        ledger.acked.append((job["id"], worker))

        tasks = [asyncio.create_task(produce(n)) for n in range(2)]
        tasks += [asyncio.create_task(work(f"w{n}")) for n in range(16)]
        await asyncio.sleep(3)
        before = len(ledger.enqueued), len(ledger.acked)
        lost_at = time.monotonic()
        cluster.lose("node1")
        promoted = await until(lambda: cluster.reached({"node2": "wait_primary"}), timeout=90, every=0.1)
        promoted_at = time.monotonic()
        serving = await until(
            lambda: next((t for t, s in ledger.enqueue_times if t > promoted_at and s == 201), None),
            timeout=30,
            every=0.05,
        )
        await asyncio.sleep(3)  # more load on the new primary
        stop_producing.set()
        # The workers drain what is left (jobs held by leases lost with the old primary come back as their
        # leases expire).
        db = await asyncpg.connect(cluster.dsn)
        try:
            await until(
                lambda: db.fetchval("SELECT count(*) = 0 FROM jobq.all_jobs WHERE status <> 'completed'"),
                timeout=60,
            )
            stop_working.set()
            await asyncio.gather(*tasks)
            # Every job, also those whose enqueue was answered 503 after its commit (a 503 without
            # `nothing_done` may follow one): workers lease and ack those too.
            rows = await db.fetch("SELECT id, status FROM jobq.all_jobs WHERE queue = 'ha'")
        finally:
            await db.close()
    statuses = {row["id"]: row["status"] for row in rows}
    assert promoted
    assert before[0] > 0 and before[1] > 0, "load ran before the failover"
    assert ledger.problems == []
    assert set(ledger.statuses) <= {200, 201, 409, 503}, ledger.statuses
    assert ledger.statuses[503] > 0, "the gap was seen"
    assert set(ledger.enqueued) <= set(statuses), "every enqueue answered 201 exists"
    assert {statuses.get(job) for job, _ in ledger.acked} == {"completed"}
    acked = Counter(job for job, _ in ledger.acked)
    assert max(acked.values()) == 1, "no job acked under two leases"
    assert set(statuses.values()) == {"completed"}, "none lost"
    assert serving - promoted_at <= 10
    print(
        f"failover: promoted {promoted_at - lost_at:.1f} s after the primary was lost, serving enqueues "
        f"again {serving - promoted_at:.1f} s after the promotion; {len(ledger.enqueued)} enqueues, "
        f"{len(ledger.acked)} acks ({len(set(statuses) - set(ledger.enqueued))} jobs committed under a 503), "
        f"answers {dict(ledger.statuses)}"
    )


async def test_lists_and_statistics_read_the_standby(cluster, start_service):
    """JOBQ_READ_DATABASE_URL names the standby: the lists and the queues' statistics are read there
    (they show what replication brought), while leases, acks and a job's own state go to the primary."""
    await asyncio.to_thread(migrations.upgrade, cluster.dsn)
    standby = f"postgresql://postgres@127.0.0.1:{cluster.ports['node2']}/jobq"
    service = start_service(
        database_url=cluster.dsn,
        listen_url=cluster.dsn,
        database_pool_mode="session",
        read_database_url=standby,
    )
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        ids = [
            (await client.post("/jobs", json={"queue": "r", "payload": {"n": n}})).json()["id"]
            for n in range(3)
        ]
        r = await client.post("/lease", json={"queue": "r", "max_jobs": 1})
        (job,) = r.json()["jobs"]
        assert (
            await client.post("/ack", json={"id": job["id"], "lease_token": job["lease_token"]})
        ).status_code == 200
        assert (await client.get(f"/jobs/{job['id']}")).json()["status"] == "completed"

        async def listed() -> bool:
            page = (await client.get("/jobs", params={"queue": "r"})).json()["jobs"]
            return sorted(j["id"] for j in page) == sorted(ids) and {j["status"] for j in page} == {
                "completed",
                "pending",
            }

        await until(listed, timeout=10)
        (row,) = (await client.get("/queues")).json()
        assert (row["queue"], row["pending"]) == ("r", 2)
    conn = await asyncpg.connect(standby)
    try:
        assert await conn.fetchval("SELECT pg_is_in_recovery()")
        queries = await conn.fetch(
            "SELECT query FROM pg_stat_activity WHERE application_name = 'jobq' AND datname = 'jobq'"
        )
    finally:
        await conn.close()
    assert queries, "the service's read pool is connected to the standby"
