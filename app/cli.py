"""The server's commands of `jobq`: serve, migrate, database-url, openapi.

The `jobq` command belongs to the client distribution (`jobq.cli`), which has the commands that talk to a
running service (worker, enqueue, stats, dead, queues); it adds these four from the `jobq.commands` entry
points this distribution declares (pyproject.toml), so that one `jobq` command has them all. Each is a
`jobq.cli.Command`: its arguments declared on an argparse parser, and a function run with them.

Only the standard library and `jobq.cli` are imported until a command runs: `jobq --help` loads this
module to list the commands, and need not wait for pydantic or the app.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import sys
import tempfile
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from jobq.cli import Command

if TYPE_CHECKING:
    from app.settings import Settings


def _serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="Address to listen on [default: JOBQ_HOST or 127.0.0.1]")
    parser.add_argument("--port", type=int, help="Port [default: JOBQ_PORT or 8000]")
    parser.add_argument(
        "--workers", type=int, default=1, metavar="N", help="Service processes sharing the port"
    )
    parser.add_argument("--log-level", default="info", metavar="LEVEL", help="debug, info, warning or error")
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="Listen beyond loopback even without tokens (JOBQ_ALLOW_INSECURE)",
    )


def _serve(args: argparse.Namespace) -> int | None:
    """Run the HTTP service (migrating the schema first, and starting the embedded PostgreSQL when no
    database is configured)."""
    import uvicorn

    from app.core.access import Tokens
    from app.http.fastpath.transport import KEEP_ALIVE
    from app.settings import is_loopback
    from app.startup import FAILURE_FILE

    log_level: str = args.log_level
    debug = log_level.lower() == "debug"
    settings = _settings(debug)
    try:
        tokens = Tokens.load(settings.tokens, settings.tokens_file)
    except (OSError, ValueError) as mistake:  # JOBQ_TOKENS_FILE missing, or a line of it wrong
        if debug:
            traceback.print_exc()
        print(f"JOBQ_TOKENS_FILE: {mistake}", file=sys.stderr)
        return 2
    host: str = args.host or settings.host
    if not is_loopback(host) and not tokens:
        if not (args.insecure or settings.allow_insecure):
            print(
                f"refusing to listen on {host} without tokens: anyone who can reach it could take and "
                "delete jobs. Set JOBQ_TOKENS (see the README), or pass --insecure.",
                file=sys.stderr,
            )
            return 2
    if settings.schedules_file is not None:
        # A mistake in the schedules file stops the start in one line naming the schedule, before
        # anything starts (the app checks it again, for servers that run it without this command).
        from app.http.routers.schedules import declared

        try:
            declared(settings.schedules_file)
        except ValueError as exc:
            print(f"jobq: {exc}", file=sys.stderr)
            return 2
    if not settings.database_url:
        # No database, and no embedded server to start either: said here in one line, before uvicorn
        # starts (the app says the same at start-up, for servers that run it without this command).
        _need_embedded()
    # The app, built by uvicorn in each of its processes, reads Settings from the environment: it must know
    # the address it listens on, which decides the host names it answers to (app/http/middleware/origin.py).
    os.environ["JOBQ_HOST"] = host
    # One process that failed to start exits 3 by itself; several stop with 0 (app/startup.py).
    failed = Path(tempfile.mkdtemp(prefix="jobq-serve-")) / "failed"
    atexit.register(shutil.rmtree, failed.parent, ignore_errors=True)
    os.environ[FAILURE_FILE] = str(failed)
    uvicorn.run(
        "app.main:create_app",
        factory=True,
        host=host,
        port=args.port or settings.port,
        workers=args.workers,
        log_level=log_level,
        log_config=_log_config(log_level),
        # jobq writes its own access log, one JSON line per request (JOBQ_ACCESS_LOG,
        # app/http/middleware/access_log.py).
        access_log=not settings.access_log,
        timeout_graceful_shutdown=10,
        timeout_keep_alive=KEEP_ALIVE,
        # httptools, writing each answer in one piece (app/http/fastpath/transport.py).
        http="app.http.fastpath.transport:CoalescingHttpToolsProtocol",
    )
    return 3 if failed.exists() else None


serve = Command(_serve, _serve_arguments)


def _need_embedded() -> None:
    """End the command in one line (exit 2) when no database is set and the embedded one is not
    installed."""
    from app.db import embedded

    if not embedded.installed():
        print(embedded.NOT_INSTALLED, file=sys.stderr)
        raise SystemExit(2)


def _settings(debug: bool = False) -> Settings:
    """The settings from the environment; a mistake in them ends the command with one line naming the
    setting (exit 2), its traceback only when `debug`."""
    from app.settings import Settings
    from app.startup import describe_settings

    try:
        return Settings()
    except ValueError as mistake:  # pydantic's ValidationError, or pydantic-settings' SettingsError
        if debug:
            traceback.print_exc()
        print(describe_settings(mistake), file=sys.stderr)
        raise SystemExit(2) from None


def _log_config(level: str) -> dict:
    """uvicorn's logging, plus jobq's own loggers at `level`: given to uvicorn (not set up here), so that
    each of several worker processes configures it too."""
    import copy

    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["formatters"]["jobq"] = {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}
    config["handlers"]["jobq"] = {
        "class": "logging.StreamHandler",
        "formatter": "jobq",
        "stream": "ext://sys.stderr",
    }
    config["loggers"]["jobq"] = {"handlers": ["jobq"], "level": level.upper(), "propagate": False}
    return config


def _migrate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("revision", nargs="?", default="head", help="Target revision")
    parser.add_argument("--down", action="store_true", help="Downgrade to the revision instead")


def _migrate(args: argparse.Namespace) -> int | None:
    """Run the Alembic chain against the configured (or embedded) database; against JOBQ_LISTEN_URL when
    set, since a migration needs a session of its own, which a pooler in transaction mode does not give.
    Each step waits at most JOBQ_MIGRATION_LOCK_TIMEOUT for its locks and is retried up to
    JOBQ_MIGRATION_ATTEMPTS times; on a schema a newer release migrated there is nothing to upgrade
    (exit 0)."""
    import asyncio

    from app import startup
    from app.db import migrations
    from app.main import resolve_database_url

    revision: str = args.revision
    down: bool = args.down
    settings = _settings()
    try:
        dsn = settings.session_url(asyncio.run(resolve_database_url(settings)))
        with startup.reaching(startup.session_setting(settings), dsn):
            if down:
                migrations.downgrade(dsn, revision, settings=settings)
            else:
                migrations.upgrade(dsn, revision, settings=settings)
    except startup.StartupFailed as failure:
        print(str(failure), file=sys.stderr)
        return 1
    except migrations.SchemaAhead as ahead:
        print(str(ahead))
        if down:
            print("Move it down with the release that knows it: its `jobq migrate --down`.", file=sys.stderr)
            return 1
        return None
    except migrations.MigrationBlocked as blocked:
        print(str(blocked), file=sys.stderr)
        return 1
    print(f"schema at {'base' if down and revision == 'base' else revision}")
    return None


migrate = Command(_migrate, _migrate_arguments)


def _database_url(args: argparse.Namespace) -> int | None:
    """Print the URL of the database jobq uses: JOBQ_DATABASE_URL, or, with none set, the embedded
    PostgreSQL's while a `jobq serve` runs it (`psql "$(jobq database-url)"`)."""
    from app.db import embedded

    settings = _settings()
    if settings.database_url:
        print(settings.database_url)
        return None
    _need_embedded()
    url = embedded.running_url(settings.data_dir)
    if url is None:
        print(
            f"JOBQ_DATA_DIR: no embedded PostgreSQL runs under {settings.data_dir}: start `jobq serve` "
            "(make serve) in this directory first, or set JOBQ_DATA_DIR to where it keeps its data",
            file=sys.stderr,
        )
        return 1
    print(url)
    return None


database_url = Command(_database_url)


def _openapi(args: argparse.Namespace) -> None:
    """Print the OpenAPI document the service serves (the committed openapi.json)."""
    from app.main import create_app
    from app.settings import Settings

    json.dump(create_app(Settings()).openapi(), sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")


openapi = Command(_openapi)
