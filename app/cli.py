"""The server's commands of `jobq`: serve, migrate, database-url, openapi.

The `jobq` command belongs to the client distribution (`jobq.cli`), which has the commands that talk to a
running service (worker, enqueue, stats, dead, queues); it adds these three from the `jobq.commands` entry
points this distribution declares (pyproject.toml), so that one `jobq` command has them all.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Annotated

import typer

from app.settings import Settings, is_loopback


def serve(
    host: Annotated[
        str | None, typer.Option(help="Address to listen on [default: JOBQ_HOST or 127.0.0.1]")
    ] = None,
    port: Annotated[int | None, typer.Option(help="Port [default: JOBQ_PORT or 8000]")] = None,
    workers: Annotated[int, typer.Option(help="Service processes sharing the port")] = 1,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error")] = "info",
    insecure: Annotated[
        bool,
        typer.Option("--insecure", help="Listen beyond loopback even without tokens (JOBQ_ALLOW_INSECURE)"),
    ] = False,
) -> None:
    """Run the HTTP service (migrating the schema first, and starting the embedded PostgreSQL when no
    database is configured)."""
    import uvicorn

    from app.core.access import Tokens
    from app.startup import FAILURE_FILE

    debug = log_level.lower() == "debug"
    settings = _settings(debug)
    try:
        tokens = Tokens.load(settings.tokens, settings.tokens_file)
    except (OSError, ValueError) as mistake:  # JOBQ_TOKENS_FILE missing, or a line of it wrong
        if debug:
            traceback.print_exc()
        typer.echo(f"JOBQ_TOKENS_FILE: {mistake}", err=True)
        raise typer.Exit(2) from None
    host = host or settings.host
    if not is_loopback(host) and not tokens:
        if not (insecure or settings.allow_insecure):
            typer.echo(
                f"refusing to listen on {host} without tokens: anyone who can reach it could take and "
                "delete jobs. Set JOBQ_TOKENS (see the README), or pass --insecure.",
                err=True,
            )
            raise typer.Exit(2)
    if settings.schedules_file is not None:
        # A mistake in the schedules file stops the start in one line naming the schedule, before
        # anything starts (the app checks it again, for servers that run it without this command).
        from app.http.routers.schedules import declared

        try:
            declared(settings.schedules_file)
        except ValueError as exc:
            typer.echo(f"jobq: {exc}", err=True)
            raise typer.Exit(2) from None
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
        port=port or settings.port,
        workers=workers,
        log_level=log_level,
        log_config=_log_config(log_level),
        # jobq writes its own access log, one JSON line per request (JOBQ_ACCESS_LOG,
        # app/http/middleware/access_log.py).
        access_log=not settings.access_log,
        timeout_graceful_shutdown=10,
        # httptools, writing each answer in one piece (app/http/fastpath/transport.py).
        http="app.http.fastpath.transport:CoalescingHttpToolsProtocol",
    )
    if failed.exists():
        raise typer.Exit(3)


def _need_embedded() -> None:
    """End the command in one line (exit 2) when no database is set and the embedded one is not
    installed."""
    from app.db import embedded

    if not embedded.installed():
        typer.echo(embedded.NOT_INSTALLED, err=True)
        raise typer.Exit(2)


def _settings(debug: bool = False) -> Settings:
    """The settings from the environment; a mistake in them ends the command with one line naming the
    setting (exit 2), its traceback only when `debug`."""
    from app.startup import describe_settings

    try:
        return Settings()
    except ValueError as mistake:  # pydantic's ValidationError, or pydantic-settings' SettingsError
        if debug:
            traceback.print_exc()
        typer.echo(describe_settings(mistake), err=True)
        raise typer.Exit(2) from None


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


def migrate(
    revision: Annotated[str, typer.Argument(help="Target revision")] = "head",
    down: Annotated[bool, typer.Option("--down", help="Downgrade to the revision instead")] = False,
) -> None:
    """Run the Alembic chain against the configured (or embedded) database; against JOBQ_LISTEN_URL when
    set, since a migration needs a session of its own, which a pooler in transaction mode does not give.
    Each step waits at most JOBQ_MIGRATION_LOCK_TIMEOUT for its locks and is retried up to
    JOBQ_MIGRATION_ATTEMPTS times; on a schema a newer release migrated there is nothing to upgrade
    (exit 0)."""
    import asyncio

    from app import startup
    from app.db import migrations
    from app.main import resolve_database_url

    settings = _settings()
    try:
        dsn = settings.session_url(asyncio.run(resolve_database_url(settings)))
        with startup.reaching(startup.session_setting(settings), dsn):
            if down:
                migrations.downgrade(dsn, revision, settings=settings)
            else:
                migrations.upgrade(dsn, revision, settings=settings)
    except startup.StartupFailed as failure:
        typer.echo(str(failure), err=True)
        raise typer.Exit(1) from None
    except migrations.SchemaAhead as ahead:
        typer.echo(str(ahead))
        if down:
            typer.echo("Move it down with the release that knows it: its `jobq migrate --down`.", err=True)
            raise typer.Exit(1) from None
        return
    except migrations.MigrationBlocked as blocked:
        typer.echo(str(blocked), err=True)
        raise typer.Exit(1) from None
    typer.echo(f"schema at {'base' if down and revision == 'base' else revision}")


def database_url() -> None:
    """Print the URL of the database jobq uses: JOBQ_DATABASE_URL, or, with none set, the embedded
    PostgreSQL's while a `jobq serve` runs it (`psql "$(jobq database-url)"`)."""
    from app.db import embedded

    settings = _settings()
    if settings.database_url:
        typer.echo(settings.database_url)
        return
    _need_embedded()
    url = embedded.running_url(settings.data_dir)
    if url is None:
        typer.echo(
            f"JOBQ_DATA_DIR: no embedded PostgreSQL runs under {settings.data_dir}: start `jobq serve` "
            "(make serve) in this directory first, or set JOBQ_DATA_DIR to where it keeps its data",
            err=True,
        )
        raise typer.Exit(1)
    typer.echo(url)


def openapi() -> None:
    """Print the OpenAPI document the service serves (the committed openapi.json)."""
    from app.main import create_app

    json.dump(create_app(Settings()).openapi(), sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")
