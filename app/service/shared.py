"""One call's share of a statement run for many: single enqueues, acks and nacks arriving together go in
one statement (app/service/coalesce.py), unless `JOBQ_COALESCE` is off."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, TypeVar

from app.db.pool import Database
from app.service.coalesce import Batcher

T = TypeVar("T")
R = TypeVar("R")

MAX_SHARED = 1000  # calls per shared ack, nack or enqueue statement


async def shared(
    db: Database, name: str, run: Callable[[Database, Sequence[T]], Awaitable[list[R]]], item: T
) -> R:
    """`run`'s result for `item`, from a statement `item` may share with other callers of `name`."""
    if not db.settings.coalesce:
        (result,) = await run(db, [item])
        return result
    batcher: Any = db.batcher(
        name,
        lambda: Batcher(
            partial(run, db),
            max_items=MAX_SHARED,
            concurrency=db.settings.coalesce_concurrency,
        ),
    )
    return await batcher.submit(item)
