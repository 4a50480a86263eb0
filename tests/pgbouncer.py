"""PgBouncer in transaction mode in front of a PostgreSQL server, for the tests (tests/fixtures.py) and the
benchmarks (bench/run.py `pooled`)."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from tests.service_process import free_port

DEBIAN_PGBOUNCER = "/usr/sbin/pgbouncer"  # where Debian puts it, often not on a user's PATH


def pgbouncer_binary() -> str | None:
    return shutil.which("pgbouncer") or (DEBIAN_PGBOUNCER if os.path.exists(DEBIAN_PGBOUNCER) else None)


@contextmanager
def running_pgbouncer(
    binary: str, server_dsn: str, watch: list[Callable[[], str | None]] | None = None
) -> Iterator[tuple[str, int]]:
    """PgBouncer in transaction mode in front of `server_dsn`'s server, every database of it: its address.
    `watch`, if given, gets a function that says why PgBouncer is gone (its exit status and the end of its
    log), or None while it runs."""
    parts = urlsplit(server_dsn)
    socket_dir = dict(parse_qsl(parts.query)).get("host")  # an embedded server listens on a socket
    with tempfile.TemporaryDirectory(prefix="jobq-test-pgbouncer-") as tmp:
        os.chmod(tmp, 0o777)  # PgBouncer drops from root to another user (below), who writes here
        port = free_port()
        config = Path(tmp) / "pgbouncer.ini"
        config.write_text(
            PGBOUNCER_INI.format(
                server=f"host={socket_dir or parts.hostname} port={parts.port or 5432}",
                user=parts.username or "postgres",
                port=port,
                dir=tmp,
            )
        )
        command = [binary, str(config)]
        if os.geteuid() == 0:  # PgBouncer will not run as root: as the server's user, who reaches its socket
            owner = pwd.getpwuid(os.stat(socket_dir).st_uid).pw_name if socket_dir else "postgres"
            command[1:1] = ["-u", owner]
        # It logs to its logfile and to stderr too: no pipe, which it would fill and then stop on.
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        process.kill()
                        process.wait()
                        log = Path(tmp) / "pgbouncer.log"
                        why = log.read_text()[-2000:] if log.exists() else "no log"
                        raise RuntimeError(f"PgBouncer did not start: {why}") from None
                    time.sleep(0.05)
            if watch is not None:

                def gone() -> str | None:
                    if process.poll() is None:
                        return None
                    log = Path(tmp) / "pgbouncer.log"
                    said = log.read_text()[-3000:] if log.exists() else "no log"
                    return f"PgBouncer exited with status {process.returncode}; its log ends:\n{said}"

                watch.append(gone)
            yield "127.0.0.1", port
        finally:
            process.terminate()
            process.wait(timeout=10)


# Transaction pooling, a pool per database (every test has its own), on the tests' user whoever logs in.
# Server sessions start as jobq's (application_name), as deploy/pgbouncer.ini has them: PgBouncer then
# sends no SET when it gives one to the service, and a cancel request cannot meet such a SET. PgBouncer
# 1.18, Debian 12's, exits on that meeting ("bad client state: 0", pgbouncer#801, fixed in 1.20), which
# took the rest of a CI run's pooler pass with it.
PGBOUNCER_INI = """
[databases]
* = {server} user={user} application_name=jobq

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = any
pool_mode = transaction
max_client_conn = 2000
default_pool_size = 20
; A test's database is dropped behind it, and the server connections idle in its pool would last until then
; (600 s by default): with tests ending several a second, they filled the server's max_connections (100).
server_idle_timeout = 1
server_reset_query =
logfile = {dir}/pgbouncer.log
pidfile = {dir}/pgbouncer.pid
"""


def through_pooler(dsn: str, address: tuple[str, int]) -> str:
    """The same database, through the PgBouncer at `address`."""
    host, port = address
    parts = urlsplit(dsn)
    user = parts.username or "postgres"
    return urlunsplit(parts._replace(netloc=f"{user}@{host}:{port}", query=""))
