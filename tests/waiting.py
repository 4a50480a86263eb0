"""Waiting on a condition with a deadline, instead of sleeping a fixed time."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any


async def until(predicate: Callable[[], Any], timeout: float = 15.0, every: float = 0.02) -> Any:
    """Wait until `predicate()` (a value, or an awaitable of one) is true, and return it; fail after
    `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last: {result!r})")
        await asyncio.sleep(every)


async def lock_waiters(db, wait_event: str | None = None) -> int:
    """How many sessions of `db`'s database wait for a lock (of `wait_event`: 'advisory', 'relation',
    ...). Read afresh even inside a transaction: PostgreSQL takes its list of sessions for
    pg_stat_activity once per transaction, so a connection opened after that first read would never be
    counted (a service's pool opening one for the request the test waits for)."""
    await db.execute("SELECT pg_stat_clear_snapshot()")
    return await db.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock' AND wait_event = coalesce($1, wait_event)",
        wait_event,
    )


def states(db, queue: str) -> Callable[[], Any]:
    """A query for a queue's jobs: {status: count}."""

    async def query() -> dict[str, int]:
        rows = await db.fetch(
            "SELECT status, count(*) AS n FROM jobq.all_jobs WHERE queue = $1 GROUP BY 1", queue
        )
        return {r["status"]: r["n"] for r in rows}

    return query


def equals(query: Callable[[], Any], expected: Any) -> Callable[[], Any]:
    """A predicate: `query()` (awaited) equals `expected`."""

    async def check() -> bool:
        return await query() == expected

    return check


def quiet(service) -> Callable[[], bool]:
    """A predicate: the in-process `service` has no long-poll waiting and no request in progress, so
    every client that polled it has gone, as far as the service can tell (a long-poll whose client
    disconnected ends once the service notices, handing back anything it claimed for it)."""

    def check() -> bool:
        try:
            return (
                service.app.state.runtime.wakeups.waiter_count() == 0
                and not service.server.server_state.tasks
            )
        except RuntimeError:  # the service's thread changed its waiters while this one counted them
            return False

    return check
