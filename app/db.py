"""The asyncpg pool: one per service process, opened and closed by the app's lifespan.

jsonb values travel as JSON text both ways (asyncpg's default): payloads are stored and answered
without being decoded in between (see app/web.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import asyncpg

from app.metrics import Metrics
from app.settings import Settings

log = logging.getLogger("jobq.db")


async def _reset_connection(conn: asyncpg.Connection) -> None:
    # jobq sets no session state, so the default reset (RESET ALL; UNLISTEN *; ...) would only cost a
    # second round trip on every release. A transaction left open by a cancelled request is still ended.
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")


async def create_pool(dsn: str, settings: Settings, *, wait: float = 30.0) -> asyncpg.Pool:
    """Open the pool, waiting up to `wait` seconds for the database to accept connections."""
    deadline = time.monotonic() + wait
    while True:
        try:
            return await asyncpg.create_pool(
                dsn,
                min_size=settings.pool_min_size,
                max_size=settings.pool_max_size,
                reset=_reset_connection,
                timeout=settings.pool_acquire_timeout,
                command_timeout=settings.statement_timeout + 5,
                server_settings={
                    "application_name": "jobq",
                    "statement_timeout": str(int(settings.statement_timeout * 1000)),
                },
            )
        except (TimeoutError, OSError, asyncpg.PostgresError) as exc:
            if time.monotonic() >= deadline:
                raise
            log.warning("database not reachable yet (%r); retrying", exc)
            await asyncio.sleep(0.5)


class Database:
    """The pool, and the settings and metrics the service layer needs with it."""

    def __init__(self, pool: asyncpg.Pool, settings: Settings, metrics: Metrics | None = None) -> None:
        self.pool = pool
        self.settings = settings
        self.metrics = metrics if metrics is not None else Metrics()
        self._batchers: dict[object, Any] = {}

    def batcher(self, key: object, make: Callable[[], Any]) -> Any:
        """The process's Batcher for `key` (app/coalesce.py), made on first use."""
        batcher = self._batchers.get(key)
        if batcher is None:
            batcher = self._batchers[key] = make()
        return batcher

    def acquire(self) -> asyncpg.pool.PoolAcquireContext:
        """One connection for one request (or one background step); 503 when none comes in time."""
        return self.pool.acquire(timeout=self.settings.pool_acquire_timeout)
