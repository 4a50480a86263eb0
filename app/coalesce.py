"""Coalescing concurrent calls into shared statements.

Under load, many requests want the same statement at once: sixteen workers each acking one job, or
leasing one job from the same queue. A ``Batcher`` runs a call at once while fewer than `concurrency`
of its statements are in flight; calls arriving when all are busy wait, and go together in the next
free one. An idle service therefore adds no latency, and a busy one sends PostgreSQL one statement per
batch instead of one per call: fewer round trips and pool acquisitions, and (for claims) fewer callers
skipping past each other's locked rows. Allowing a few statements in flight keeps big calls (a lease of
100, an ack of 100) running side by side as they would without coalescing.

Each item still gets its own result; `run` must return one per item, in order. When a shared statement
fails, every item in it gets the error, unless `isolate` is set: then the items are retried one by one,
so one bad item cannot fail the calls it happened to share a statement with. Results whose caller went
away while the statement ran are handed to `orphaned` (a lease gives such jobs back).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Batcher(Generic[T, R]):
    def __init__(
        self,
        run: Callable[[list[T]], Awaitable[list[R]]],
        *,
        max_items: int = 1000,
        size: Callable[[T], int] = lambda item: 1,
        isolate: bool = False,
        orphaned: Callable[[list[R]], Awaitable[object]] | None = None,
        concurrency: int = 2,
    ) -> None:
        self._run = run
        self._max_items = max_items  # items (as counted by `size`) per shared statement
        self._size = size
        self._isolate = isolate
        self._orphaned = orphaned
        self._concurrency = concurrency  # statements in flight at most
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._running = 0
        self._tasks: set[asyncio.Task] = set()  # referenced, so the loop cannot drop them mid-flight

    async def submit(self, item: T) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if self._running < self._concurrency:
            self._start()
        return await future

    def _start(self) -> None:
        self._running += 1
        task = asyncio.get_running_loop().create_task(self._drain())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _take(self) -> list[tuple[T, asyncio.Future[R]]]:
        taken, total = [], 0
        while self._pending:
            item, future = self._pending[0]
            if future.done():  # its caller went away before it ran
                self._pending.pop(0)
                continue
            if taken and total + self._size(item) > self._max_items:
                break
            self._pending.pop(0)
            taken.append((item, future))
            total += self._size(item)
        return taken

    async def _drain(self) -> None:
        try:
            while batch := self._take():
                await self._execute(batch)
        finally:
            self._running -= 1
            if self._pending and self._running < self._concurrency:  # left over by an error
                self._start()

    async def _execute(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        items = [item for item, _ in batch]
        try:
            results = await self._run(items)
        except Exception as exc:
            if self._isolate and len(batch) > 1:
                for one in batch:
                    await self._execute([one])
                return
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        orphans = []
        for (_, future), result in zip(batch, results, strict=True):
            if future.done():
                orphans.append(result)
            else:
                future.set_result(result)
        if orphans and self._orphaned is not None:
            await self._orphaned(orphans)
