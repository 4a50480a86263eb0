"""Start-up failures told in one line: the setting at fault and what to do about it.

A service that cannot start because of its configuration (a bad role in JOBQ_TOKENS, a database that does
not exist, a server that refuses connections, a pooler jobq was not told about) says so in one line and
exits non-zero; the traceback behind it is logged at debug level only (`jobq serve --log-level debug`).
Failures not recognised here keep their traceback: they are jobq's bugs, not the user's settings.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.settings import Settings

log = logging.getLogger("jobq")


# Where a service process that failed to start writes its line, when `jobq serve` runs several: uvicorn's
# supervisor then stops them all but exits 0, so the command looks for this file to exit non-zero.
FAILURE_FILE = "JOBQ_STARTUP_FAILURE_FILE"


class StartupFailed(Exception):
    """A start-up failure the user can act on; its message is the one line to show."""


def describe_settings(error: ValueError) -> str:
    """The settings' errors (pydantic's ValidationError, or pydantic-settings' SettingsError for a value
    that is not the JSON its setting takes) in a line, each named by its environment variable
    (JOBQ_PORT, ...), without the values given: tokens and passwords are among them."""
    if not isinstance(error, ValidationError):
        field = re.search(r'field "(\w+)"', str(error))
        setting = f"JOBQ_{field[1]}".upper() if field else "a JOBQ_ setting"
        return f"{setting}: not valid JSON ({error.__cause__ or error})"
    parts = []
    for item in error.errors(include_url=False):
        message = item["msg"].removeprefix("Value error, ")
        name = str(item["loc"][0]) if item["loc"] else ""
        # A field read under its alias is named by it (JOBQ_EXPIRE_INTERVAL); others by the prefix.
        setting = name if name.isupper() else f"JOBQ_{name}".upper() if name else ""
        parts.append(message if not setting or message.startswith(setting) else f"{setting}: {message}")
    return "; ".join(parts)


def _server(dsn: str) -> str:
    """The server (host:port, or several) a URL names, never its user or password."""
    try:
        return urlsplit(dsn).netloc.rpartition("@")[2] or "the local socket"
    except ValueError:
        return "the server it names"


def explain_database(exc: BaseException, setting: str, dsn: str) -> StartupFailed | None:
    """What went wrong reaching the database named by `setting` (whose value is `dsn`), as one line
    saying what to do; None when the failure is not one a setting explains. Looks through the chain of
    causes, since SQLAlchemy (Alembic) wraps asyncpg's errors in its own."""
    seen: BaseException | None = exc
    while seen is not None:
        failure = _explain_one(seen, setting, dsn)
        if failure is not None:
            return failure
        seen = seen.__cause__ or seen.__context__
    return None


def _explain_one(exc: BaseException, setting: str, dsn: str) -> StartupFailed | None:
    where = _server(dsn)
    if isinstance(exc, asyncpg.ProtocolViolationError) and "startup parameter" in str(exc):
        if setting == "JOBQ_DATABASE_URL" or setting == "JOBQ_READ_DATABASE_URL":
            return StartupFailed(
                f"{setting} refused a connection parameter ({exc}): this looks like PgBouncer in "
                "transaction mode: set JOBQ_DATABASE_POOL_MODE=transaction and JOBQ_LISTEN_URL (a URL of "
                "PostgreSQL itself, for LISTEN and migrations)"
            )
        return StartupFailed(
            f"{setting} refused a connection parameter ({exc}): it looks like a pooler; "
            f"{setting} must name PostgreSQL itself"
        )
    if isinstance(exc, asyncpg.InvalidCatalogNameError):
        name = urlsplit(dsn).path.lstrip("/") or "the database"
        return StartupFailed(
            f"{setting}: {exc} on {where}: create it (createdb {name}) or name an "
            f"existing database in {setting}"
        )
    if isinstance(exc, asyncpg.InvalidAuthorizationSpecificationError):
        return StartupFailed(f"{setting}: {where} refused the login ({exc}): check the user and password")
    if isinstance(exc, asyncpg.InsufficientPrivilegeError):
        return StartupFailed(
            f"{setting}: the user may not create or change jobq's schema ({exc}): grant it CREATE on the "
            "database, or run `jobq migrate` once as a user who may"
        )
    if isinstance(exc, OSError):  # refused, timed out, a name that does not resolve
        # asyncpg's own message repeats the address; the system's says why (a resolver's errno is < 0).
        reason = os.strerror(exc.errno) if exc.errno and exc.errno > 0 else exc.strerror
        reason = reason or str(exc) or type(exc).__name__
        return StartupFailed(
            f"{setting}: cannot reach PostgreSQL at {where} ({reason}): start it, or correct the host "
            f"and port in {setting}"
        )
    if isinstance(exc, asyncpg.ClientConfigurationError):  # its message never repeats a password
        return StartupFailed(f"{setting}: {exc}")
    return None


def database_setting(settings: Settings) -> str | None:
    """The setting that names the service's database: None for the embedded one, which jobq runs."""
    return "JOBQ_DATABASE_URL" if settings.database_url else None


def session_setting(settings: Settings) -> str | None:
    """The setting that names where jobq's own sessions go (LISTEN, migrations): Settings.session_url."""
    return "JOBQ_LISTEN_URL" if settings.listen_url else database_setting(settings)


@contextmanager
def reaching(setting: str | None, dsn: str) -> Iterator[None]:
    """Failures of the block to reach the database named by `setting` become StartupFailed, in one line.
    `setting` None (the embedded server, which jobq itself runs) explains nothing."""
    try:
        yield
    except Exception as exc:
        failure = explain_database(exc, setting, dsn) if setting else None
        if failure is None:
            raise
        raise failure from exc


class OneLineStartupFailures:
    """ASGI middleware: a lifespan that failed with StartupFailed is reported to the server (uvicorn,
    which logs it and exits with status 3) as its one line instead of the traceback Starlette sends; the
    traceback goes to the debug log. Requests pass straight through."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def send_in_one_line(message: Message) -> None:
            # Starlette sends the failure from inside its `except`, where the exception is at hand.
            failure = sys.exc_info()[1]
            if message["type"] == "lifespan.startup.failed" and isinstance(failure, StartupFailed):
                log.debug("start-up failed", exc_info=failure)
                message = {**message, "message": str(failure)}
                if os.environ.get(FAILURE_FILE):
                    Path(os.environ[FAILURE_FILE]).write_text(str(failure))
            await send(message)

        await self.app(scope, receive, send_in_one_line)
