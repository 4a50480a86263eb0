"""The worker runner's machinery: requests sent in batches (`Batcher`), threads for plain handlers."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

from jobq.tasks import Running, _current
from jobq.types import ItemResult, LeasedJob

T = TypeVar("T")
R = TypeVar("R", bound=ItemResult)

MAX_BATCH = 1000  # the API's limit on a lease's max_jobs and on the items of a batch
LINGER = 0.002  # seconds an ack or nack waits for others to share its request


class Batcher(Generic[T, R]):
    """Items (acks, nacks, releases) sent together: an item waits up to LINGER seconds for others, or for the
    request in flight, then all go in one request of up to MAX_BATCH. `settle` gets each item's result;
    `failed` a whole batch the service did not answer."""

    def __init__(
        self,
        send: Callable[[list[T]], Awaitable[Sequence[R]]],
        settle: Callable[[T, R], None],
        failed: Callable[[list[T], Exception], None],
    ) -> None:
        self._send, self._settle, self._failed = send, settle, failed
        self._waiting: list[T] = []
        self._full = asyncio.Event()  # a batch is full, or a flush wants everything now
        self._sender: asyncio.Task[None] | None = None

    def add(self, item: T) -> None:
        self._waiting.append(item)
        if len(self._waiting) >= MAX_BATCH:
            self._full.set()
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._run())

    async def flush(self) -> None:
        """Send what waits, now, and wait for the answers."""
        self._full.set()
        while self._sender is not None and not self._sender.done():
            await self._sender

    async def _run(self) -> None:
        while self._waiting:
            if not self._full.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(LINGER):
                        await self._full.wait()
            if len(self._waiting) <= MAX_BATCH:
                self._full.clear()
            batch, self._waiting = self._waiting[:MAX_BATCH], self._waiting[MAX_BATCH:]
            try:
                results = await self._send(batch)
            except Exception as exc:  # noqa: BLE001 - the whole batch gets the error
                self._failed(batch, exc)
                continue
            for item, result in zip(batch, results, strict=True):
                self._settle(item, result)


def _run(function: Callable[[LeasedJob], Any], running: Running) -> Any:
    _current.set(running)  # in the job's own copy of the context
    return function(running.job)


# A handler's outcome: its job, what it raised (None when it returned) and what it returned.
Outcome = tuple[LeasedJob, BaseException | None, Any]


class Threads:
    """`size` daemon threads running plain handlers on the jobs handed to them; each outcome is handed to
    `finished` on the event loop, a few at a time. Daemon threads: a handler that never returns cannot
    keep the process from exiting once its job has been released."""

    def __init__(self, size: int, finished: Callable[[list[Outcome]], None]) -> None:
        self._finished = finished
        self._loop = asyncio.get_running_loop()
        self._inbox: queue.SimpleQueue[
            tuple[Running, Callable[[LeasedJob], Any], contextvars.Context] | None
        ] = queue.SimpleQueue()
        self._outbox: deque[Outcome] = deque()
        # Whether a _collect is on its way to the loop: the threads that finish meanwhile add to it,
        # rather than each waking the loop.
        self._collecting = False
        self._threads = [
            threading.Thread(target=self._work, name=f"jobq-worker-{n}", daemon=True) for n in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, running: Running, handler: Callable[[LeasedJob], Any]) -> None:
        """Run `handler(running.job)` on a free thread, in a copy of the caller's context where
        `jobq.current_job()` and `jobq.progress()` know the job."""
        self._inbox.put((running, handler, contextvars.copy_context()))

    def close(self) -> None:
        """Let the threads end once their handlers return (those stuck in one are left behind)."""
        for _ in self._threads:
            self._inbox.put(None)

    def _work(self) -> None:
        while (item := self._inbox.get()) is not None:
            running, handler, context = item
            error: BaseException | None = None
            value = None
            try:
                value = context.run(_run, handler, running)
            except BaseException as exc:  # noqa: BLE001 - everything goes back to the loop
                error = exc
            self._outbox.append((running.job, error, value))
            if not self._collecting:
                self._collecting = True
                try:
                    self._loop.call_soon_threadsafe(self._collect)
                except RuntimeError:  # the loop has closed: the worker is gone
                    return

    def _collect(self) -> None:
        self._collecting = False  # before reading: a job added from now on schedules another _collect
        finished = []
        while self._outbox:
            finished.append(self._outbox.popleft())
        self._finished(finished)
