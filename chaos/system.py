"""The system a chaos run puts under faults: a PostgreSQL server of its own, and jobq replicas as `jobq serve`
processes, each of which can be killed, paused and restarted.

The server is the machine's PostgreSQL 15 (Debian's binaries) in a data directory made for the run, so
that restarting it (fast: clients told, transactions rolled back; immediate: a crash, recovery from the
WAL at start) touches nothing else. It runs as the `postgres` user, as PostgreSQL refuses to run as root,
and listens on every address: a replica in a network namespace (chaos/network.py) reaches it through the
namespace's veth.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TypeVar

import httpx

PG_BIN = Path("/usr/lib/postgresql/15/bin")
T = TypeVar("T")


def ephemeral_start() -> int:
    """The first port of the range the kernel draws a connection's own port from."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port on this machine that nothing listens on, below the range the kernel draws a connection's own
    port from: one found free there could be taken by an outgoing connection before its server bound it
    (a cluster's nodes open dozens of connections while the next node starts)."""
    top = min(ephemeral_start(), 32768)
    while True:
        port = random.randrange(max(1024, top - 12000), top)
        if port_free(port):
            return port


def port_free(port: int) -> bool:
    """Whether nothing listens on 127.0.0.1:`port` now."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


async def until(
    predicate: Callable[[], Awaitable[T | None]],
    timeout: float,
    every: float = 0.1,
    what: str = "the condition",
) -> T:
    """The first true value of `predicate()`, polled every `every` seconds; TimeoutError naming `what`
    after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = await predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout} s: {what} (last: {result!r})")
        await asyncio.sleep(every)


def tail(path: Path, lines: int) -> list[str]:
    """The last `lines` lines of a log."""
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError as error:
        return [f"(unreadable: {error})"]


def missing() -> str | None:
    """What a run needs and this machine lacks, in a sentence; None when nothing."""
    if not (PG_BIN / "pg_ctl").exists():
        return f"PostgreSQL 15's server binaries are not in {PG_BIN} (apt-get install postgresql-15)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "runuser is needed to run PostgreSQL as the postgres user (apt-get install util-linux)"
    return None


def _as_postgres(argv: Sequence[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else list(argv)


class Postgres:
    """A PostgreSQL server of the run's own under `root`, on `port`, with a database `jobq`."""

    def __init__(self, root: Path, port: int | None = None) -> None:
        self.root = root
        self.data = root / "pgdata"
        self.port = port or free_port()
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/jobq"

    def _run(self, *argv: str, timeout: float = 120) -> None:
        done = subprocess.run(_as_postgres(argv), capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.stdout.strip()}")

    def init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o777)
        self._run(
            str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"
        )
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"port = {self.port}\nlisten_addresses = '*'\nunix_socket_directories = '{self.root}'\n"
                "max_connections = 200\nfsync = on\nsynchronous_commit = on\n"
            )
        with (self.data / "pg_hba.conf").open("a") as hba:
            hba.write("host all all 0.0.0.0/0 trust\n")
        self.start()
        self._run(str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "jobq")

    def start(self) -> None:
        self._run(
            str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "postgres.log"), "-w", "start"
        )

    def stop(self, mode: str = "fast") -> None:
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self, mode: str) -> None:
        """`fast`: sessions told and rolled back, a clean shutdown; `immediate`: the server quits at
        once, as in a crash, and recovers from its WAL as it starts."""
        self.stop(mode)
        self.start()

    def destroy(self) -> None:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


class Replica:
    """`jobq serve` on `port`, run by `launch` (a command prefix: a network namespace's `ip netns exec`),
    listening on `host`."""

    def __init__(
        self,
        name: str,
        database_url: str,
        settings: dict[str, str],
        host: str = "127.0.0.1",
        launch: Sequence[str] = (),
        log: Path | None = None,
    ) -> None:
        self.name = name
        self.host = host
        self.port = free_port()
        self.url = f"http://{host}:{self.port}"
        self.launch = list(launch)
        self.env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "JOBQ_DATABASE_URL")}
        self.env.update({"JOBQ_DATABASE_URL": database_url, **settings})
        self.log = log
        self.process: subprocess.Popen | None = None
        self.paused = False

    def start(self, timeout: float = 60) -> None:
        out = self.log.open("ab") if self.log else subprocess.DEVNULL
        argv = [sys.executable, "-m", "jobq", "serve", "--host", self.host, "--port", str(self.port)]
        self.process = subprocess.Popen(
            [*self.launch, *argv, "--log-level", "warning"], env=self.env, stdout=out, stderr=out
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"replica {self.name} exited at start ({self.process.returncode})")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"replica {self.name} was not ready within {timeout} s")

    def kill(self) -> None:
        """SIGKILL: the replica's machine is gone, mid-request."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.paused = False

    def pause(self) -> None:
        """SIGSTOP: the replica stops as in a long GC pause or a VM frozen; its connections stay open."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
        self.paused = False

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            if self.paused:
                self.resume()
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
