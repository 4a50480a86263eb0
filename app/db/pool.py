"""The asyncpg pool: one per service process, opened and closed by the app's lifespan.

jsonb values travel as JSON text both ways (asyncpg's default): payloads are stored and answered
without being decoded in between (see app/core/jsontext.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import asyncpg

from app.core.errors import CONNECTION_TROUBLE, NOTHING_DONE
from app.settings import Settings

log = logging.getLogger("jobq.db")


async def _reset_connection(conn: asyncpg.Connection) -> None:
    # jobq sets no session state, so the default reset (RESET ALL; UNLISTEN *; ...) would only cost a
    # second round trip on every release. A transaction left open by a cancelled request is still ended.
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")


@asynccontextmanager
async def transaction_with(conn: asyncpg.Connection, first: str) -> AsyncIterator[None]:
    """A transaction begun together with `first` (statements without parameters: settings, a lock) in
    one simple query, one round trip where conn.transaction() and the statement would take two;
    committed, or rolled back on any error. A rollback that fails leaves the connection to the pool,
    which resets or drops it: the transaction's own error is the one raised."""
    await conn.execute(f"BEGIN; {first}")
    try:
        yield
    except BaseException:
        if not conn.is_closed():
            with suppress(Exception):
                await conn.execute("ROLLBACK")
        raise
    await conn.execute("COMMIT")


class PooledConnection(asyncpg.Connection):
    """A connection through a pooler in transaction mode. The first time a statement uses a type asyncpg
    has not met on the connection (an array of int8, say) it looks the type up, with JIT turned off for
    the session around the lookup: compiled, that query takes a second. Through the pooler, its three
    statements (turn JIT off, look up, turn it back) may each run on another server session, so the
    lookup was compiled, long enough for a statement timeout, and a session was left with JIT off for
    whichever client came next. In one transaction, the three run on one session."""

    async def _introspect_types(self, typeoids: Any, timeout: Any) -> Any:
        if self.is_in_transaction():  # already on one server session
            return await super()._introspect_types(typeoids, timeout)
        async with self.transaction():
            return await super()._introspect_types(typeoids, timeout)


POOLER_WAIT = 1.0  # seconds a pooler in transaction mode may take to give a statement a server session


def pool_options(settings: Settings) -> dict[str, Any]:
    """asyncpg's connection options for the pool. On PostgreSQL itself (or a pooler in session mode) the
    statement timeout is the server's, set at connect, and the client's a little longer in case the
    server never answers. Through a pooler in transaction mode nothing may outlive a transaction: no
    startup parameter the pooler would refuse (PgBouncer accepts application_name and a few others,
    not statement_timeout), so the client keeps the statement timeout, with a second more for the pooler
    to find the statement a server session (asyncpg then cancels the statement, which the pooler passes
    on); and no prepared statement kept for the next call, which may run on another server session (a
    statement is prepared unnamed and run in the same round trip).

    JIT compilation is off on jobq's connections: its statements each touch a few index entries, but the
    first executions of a prepared statement are planned for their parameters, and a page of GET /jobs
    among millions of finished jobs is estimated expensive enough for PostgreSQL to compile it, 50 ms
    for a query that then runs in 1 ms. Through a pooler the server's setting applies (README: Behind a
    connection pooler), and asyncpg's own lookups of types are kept from being compiled
    (`PooledConnection`)."""
    if settings.pooled_transactions:
        return {
            "command_timeout": settings.statement_timeout + POOLER_WAIT,
            "statement_cache_size": 0,
            "connection_class": PooledConnection,
            "server_settings": {"application_name": "jobq"},
        }
    return {
        "command_timeout": settings.statement_timeout + 5,
        "server_settings": {
            "application_name": "jobq",
            "statement_timeout": str(int(settings.statement_timeout * 1000)),
            "jit": "off",
        },
    }


# Refusals that no wait changes: a database that does not exist, a login refused, a connection parameter
# refused (a pooler jobq was not told about). The pool fails on them at once instead of retrying.
_LASTING_REFUSALS = (
    asyncpg.InvalidCatalogNameError,
    asyncpg.InvalidAuthorizationSpecificationError,
    asyncpg.ProtocolViolationError,
)


async def create_pool(dsn: str, settings: Settings, *, wait: float = 30.0) -> asyncpg.Pool:
    """Open the pool, waiting up to `wait` seconds for the database to accept connections (one that
    is starting, or not listening yet); a lasting refusal fails at once."""
    deadline = time.monotonic() + wait
    warned = False
    while True:
        try:
            return await asyncpg.create_pool(
                dsn,
                min_size=settings.pool_min_size,
                max_size=settings.pool_max_size,
                reset=_reset_connection,
                timeout=settings.pool_acquire_timeout,
                **pool_options(settings),
            )
        except (TimeoutError, OSError, asyncpg.PostgresError) as exc:
            if isinstance(exc, _LASTING_REFUSALS) or time.monotonic() >= deadline:
                raise
            # Said once, not every half second; each retry at debug level.
            say = log.debug if warned else log.warning
            say("database not reachable yet (%r); retrying for up to %.0f s", exc, wait)
            warned = True
            await asyncio.sleep(0.5)


class Database:
    """The pool (and a read replica's, if any), with the settings it was opened with. What a service process
    keeps beside it is its Runtime's (app/service/runtime.py)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        settings: Settings,
        *,
        session_url: str | None = None,
        read_pool: asyncpg.Pool | None = None,
    ) -> None:
        self.pool = pool
        self.read_pool = read_pool  # a read replica's (JOBQ_READ_DATABASE_URL), or None
        self.settings = settings
        # PostgreSQL itself, for a session of jobq's own (Settings.session_url); None: only the pool.
        self.session_url = session_url

    @asynccontextmanager
    async def session(self, application_name: str) -> AsyncIterator[asyncpg.Connection]:
        """A connection that is a session of its own for the block (a session lock, a VACUUM): a pooled
        one, or, where the pool goes through a pooler in transaction mode, one made to PostgreSQL itself
        for the block."""
        if not self.settings.pooled_transactions or self.session_url is None:
            async with self.acquire() as conn:
                yield conn
            return
        conn = await asyncpg.connect(
            self.session_url,
            timeout=self.settings.pool_acquire_timeout,
            server_settings={"application_name": application_name},
        )
        try:
            yield conn
        finally:
            await conn.close()

    def acquire_read(self) -> _Acquire:
        """A connection for a read that may lag a little (lists, statistics, gauges): the read replica's
        when there is one, else as `acquire`."""
        pool = self.read_pool or self.pool
        return _Acquire(pool.acquire(timeout=self.settings.pool_acquire_timeout))

    def acquire(self) -> _Acquire:
        """One connection for one request (or one background step); 503 when none comes in time."""
        return _Acquire(self.pool.acquire(timeout=self.settings.pool_acquire_timeout))


class _Acquire:
    """The pool's acquire, marking a failure to get a connection (none free in time, or the database
    refusing a new one) as one where nothing was sent to the database: the 503 then says
    `nothing_done` (app/core/errors.py), and a client may send even a call that is not idempotent again.
    Every operation that is not idempotent acquires once, before any statement, so for those the mark
    holds for the whole request."""

    __slots__ = ("_context", "_conn")

    def __init__(self, context: asyncpg.pool.PoolAcquireContext) -> None:
        self._context = context
        self._conn: asyncpg.Connection | None = None

    async def __aenter__(self) -> asyncpg.Connection:
        try:
            self._conn = await self._context.__aenter__()
        except Exception as exc:
            setattr(exc, NOTHING_DONE, True)
            raise
        return self._conn

    async def __aexit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        # A connection that failed the block (lost, timed out, or left by a lost server in a state asyncpg
        # cannot go on from) is closed rather than handed to the next request, which would fail on it too.
        if kind is not None and self._conn is not None and issubclass(kind, CONNECTION_TROUBLE):
            # asyncpg releases a connection it saw lost at once, and the proxy then refuses every call:
            # there is nothing left to close, and the block's own error is the one to raise.
            with suppress(asyncpg.InterfaceError):
                self._conn.terminate()
        await self._context.__aexit__(kind, *exc)
