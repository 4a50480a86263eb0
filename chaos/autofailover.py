"""A pg_auto_failover cluster on one machine, for chaos runs and tests: a monitor and two PostgreSQL 15 nodes
with synchronous replication, on local ports, everything under one directory, run as the postgres user
(PostgreSQL will not run as root)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import asyncpg

from chaos.system import PG_BIN, free_port, until

AUTOCTL = shutil.which("pg_autoctl")
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


class AutoFailoverCluster:
    """A pg_auto_failover monitor and two PostgreSQL nodes with synchronous replication, on local ports,
    everything under `root`, run as the postgres user (PostgreSQL will not run as root)."""

    def __init__(self, root: Path, port: Callable[[], int] = free_port) -> None:
        self.root = root
        self.ports = {name: port() for name in ("monitor", "node1", "node2")}
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
        if done.returncode != 0:
            raise RuntimeError(f"pg_autoctl create monitor: {done.stderr[-3000:]}")
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
        except TimeoutError as failed:
            raise RuntimeError(f"the cluster did not come up: {failed}\n{await self.story()}") from None

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

    async def primary(self) -> str:
        """The node that takes writes, as the monitor last heard."""
        states = await self.states()
        return next(node for node, state in states.items() if state in WRITABLE)

    async def wait_replicating(self, timeout: float) -> None:
        """Until a primary has its secondary again (after a switchover, the old primary follows)."""

        async def paired() -> bool:
            states = set((await self.states()).values())
            return {"primary", "secondary"} <= states

        await until(paired, timeout=timeout, every=0.5, what="a primary and its secondary")

    async def wait_primary(self, not_name: str, timeout: float) -> str:
        """Until a node other than `not_name` takes writes; its name."""

        async def promoted() -> str | None:
            with contextlib.suppress(OSError, asyncpg.PostgresError):
                states = await self.states()
                return next((n for n, s in states.items() if n != not_name and s in WRITABLE), None)
            return None

        return await until(promoted, timeout=timeout, every=0.1)

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
