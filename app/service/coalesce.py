"""Coalescing concurrent calls into shared statements.

Under load, many requests want the same statement at once: sixteen workers each acking one job, or
leasing one job from the same queue. A ``Batcher`` runs a call at once while fewer than `concurrency`
of its statements are in flight; calls arriving when all are busy wait, and go together in the next
free one. An idle service therefore adds no latency, and a busy one sends PostgreSQL one statement per
batch instead of one per call: fewer round trips and pool acquisitions, and (for claims) fewer callers
skipping past each other's locked rows. Allowing a few statements in flight keeps big calls (a lease of
100, an ack of 100) running side by side as they would without coalescing.

Each item still gets its own result; `run` must return one per item, in order, and each result must be
that item's own: a call never learns what its neighbours sent or got (jobs.ack_batch, for one, tells items
for the same job apart by their lease tokens). Results whose caller went away while the statement ran
are handed to `orphaned` (a lease gives such jobs back).

When a shared statement fails, the error decides (`refused`):

- The statement provably committed nothing, because of what some item holds: PostgreSQL answered it
  with an ERROR (a data exception such as a NUL character, a unique violation, ...), the driver or the
  service could not encode an argument (a lone surrogate) and so sent nothing, or the service's own
  checks refused an item (a ``Refusal``, raised before anything is sent). Then each item is
  retried alone, so one bad item fails only its own call, never the calls it
  happened to share a statement with.
- Anything else goes to every caller of the batch as it is, and none is retried: a connection lost, a
  timeout or a cancellation mid-flight (statement_timeout included), a terminated backend (FATAL, or
  SQLSTATE class 57 operator intervention), the server out of resources (53), a system error (58, XX).
  Such an error can follow a commit (a backend terminated while it waits for a synchronous standby
  has committed locally), and retrying would then do the work twice: an enqueue would land twice. Its
  callers answer 503 and the client decides, with what it knows (a dedup_key, an idempotency key).
  A pool that gives no connection in time sent nothing either; it is not retried because item by item
  would wait for the pool once per item.

`run` must therefore write in one statement, or in one transaction, so that a refusal leaves nothing
behind; the reads it makes afterwards cannot be refused for input the write accepted.

Every call goes through one way in, ``Coalescing.submit`` on the process's Runtime (app/service/runtime.py),
naming the kind of statement it shares (a ``Shared``, made once by the module whose statement it is): it
keeps each kind's Batcher (per key, for a kind shared per queue), and with `JOBQ_COALESCE` off runs
each call alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar

import asyncpg

from app.core.errors import JobqError, Refusal
from app.settings import Settings

T = TypeVar("T")
R = TypeVar("R")

MAX_SHARED = 1000  # items per shared statement, at most (as a Shared's `size` counts them)

# SQLSTATE classes that say nothing about whether the statement committed, or say it ran into something
# other than its input: connection exception, insufficient resources, operator intervention (cancel,
# statement_timeout, terminated backend, shutdown), system error, internal error; and a server that
# takes no writes (25006, read_only_sql_transaction: the same for every item).
_NOT_PROOF = ("08", "53", "57", "58", "XX", "25006")


def refused(exc: BaseException) -> bool:
    """Whether `exc`, raised by a shared statement's `run`, proves the statement committed nothing
    because of its input, so that its items may be retried one by one (see the module's docstring)."""
    if isinstance(exc, JobqError):
        return isinstance(exc, Refusal)
    if isinstance(exc, UnicodeEncodeError):  # an item's text, while the service encoded it
        return True
    if not isinstance(exc, asyncpg.PostgresError):
        return False
    # The driver's own refusal to encode an argument (asyncpg raises it as a DataError with no
    # severity, before sending the statement) has sqlstate 22000 and passes below.
    severity = exc.severity_en or exc.severity
    if severity is not None and severity != "ERROR":  # FATAL, PANIC: the session ended
        return False
    return not (exc.sqlstate or "XX").startswith(_NOT_PROOF)


class Batcher(Generic[T, R]):
    def __init__(
        self,
        run: Callable[[list[T]], Awaitable[list[R]]],
        *,
        max_items: int = MAX_SHARED,
        size: Callable[[T], int] = lambda item: 1,
        orphaned: Callable[[list[R]], Awaitable[object]] | None = None,
        concurrency: int = 2,
    ) -> None:
        self._run = run
        self._max_items = max_items  # items (as counted by `size`) per shared statement
        self._size = size
        self._orphaned = orphaned
        self._concurrency = concurrency  # statements in flight at most
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._running = 0
        self._tasks: set[asyncio.Task] = set()  # referenced, so the loop cannot drop them mid-flight

    @property
    def waiting(self) -> int:
        """Calls waiting for the next shared statement."""
        return len(self._pending)

    @property
    def in_flight(self) -> int:
        """Shared statements running (at most `concurrency`)."""
        return self._running

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
            if len(batch) > 1 and refused(exc):  # retry its items one by one
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


@dataclass(frozen=True, eq=False, slots=True)
class Shared(Generic[T, R]):
    """A kind of statement concurrent calls share: `run` makes it for their items, given the process's
    Runtime first (and, for a kind shared `per_key`, the key). Made once, at import, by the module whose
    statement it is; ``Coalescing.submit`` is the way in.

    A kind of a few fixed calls (ack, nack, enqueue) keeps its Batcher for the life of the process. One
    `per_key` has a Batcher per key (a queue, a scope) only while calls are in it: keys come from clients,
    who may invent any number of them, and an idle Batcher is worth nothing. `alone` is what a call runs
    with JOBQ_COALESCE off; by default, the shared statement for its item alone."""

    name: str  # what it is called where it is looked up by hand (tests)
    run: Callable[..., Awaitable[list[R]]]
    per_key: bool = False
    size: Callable[[T], int] | None = None  # what an item counts for towards MAX_SHARED (default 1)
    orphaned: Callable[..., Awaitable[object]] | None = None  # given the Runtime, then the results
    alone: Callable[..., Awaitable[R]] | None = None


class Coalescing:
    """The process's Batchers, one per ``Shared`` kind (per key, for those shared per key), and the one way
    in to them. Held by the process's Runtime (app/service/runtime.py), which it hands to each kind's
    statement."""

    __slots__ = ("_runtime", "_on", "_concurrency", "_kept", "_keyed")

    def __init__(self, runtime: Any, settings: Settings) -> None:
        self._runtime = runtime  # the Runtime that holds this (typed Any: runtime.py imports this module)
        self._on = settings.coalesce
        self._concurrency = settings.coalesce_concurrency
        self._kept: dict[Shared, Batcher] = {}  # fixed kinds: a handful, kept
        self._keyed: dict[tuple[Shared, object], list[Any]] = {}  # (kind, key): [batcher, callers in it]

    def submit(self, shared: Shared[T, R], item: T, key: object = None) -> Awaitable[R]:
        """`item`'s result, from a statement of `shared` it may share with concurrent calls (of the same
        `key`, for a kind shared per key). Not a coroutine itself: on the way most calls take, a kind's
        Batcher already made, it hands back the Batcher's own."""
        if not self._on:
            return self._alone(shared, item, key)
        if shared.per_key:
            return self._submit_keyed(shared, item, key)
        batcher = self._kept.get(shared)
        if batcher is None:
            batcher = self._kept[shared] = self._make(shared, ())
        return batcher.submit(item)

    async def _submit_keyed(self, shared: Shared[T, R], item: T, key: object) -> R:
        """Through the key's Batcher, made for the first caller and dropped when the last one leaves. A
        statement still running for callers that went away finishes on its own (the Batcher holds its
        task, and hands back what it claimed)."""
        name = (shared, key)
        entry = self._keyed.get(name)
        if entry is None:
            entry = self._keyed[name] = [self._make(shared, (key,)), 0]
        entry[1] += 1
        try:
            return await entry[0].submit(item)
        finally:
            entry[1] -= 1
            if not entry[1]:
                del self._keyed[name]

    async def _alone(self, shared: Shared[T, R], item: T, key: object) -> R:
        bound = (self._runtime, key) if shared.per_key else (self._runtime,)
        if shared.alone is not None:
            return await shared.alone(*bound, item)
        (result,) = await shared.run(*bound, [item])
        return result

    def _make(self, shared: Shared[T, R], key: tuple[object, ...]) -> Batcher[T, R]:
        return Batcher(
            partial(shared.run, self._runtime, *key),
            max_items=MAX_SHARED,
            size=shared.size or _one,
            orphaned=None if shared.orphaned is None else partial(shared.orphaned, self._runtime),
            concurrency=self._concurrency,
        )

    def find(self, name: str, key: object = None) -> Batcher | None:
        """The Batcher of the kind called `name` (for `key`) if a call has made it: looked up, never made."""
        for (shared, its_key), (batcher, _) in self._keyed.items():
            if shared.name == name and its_key == key:
                return batcher
        return next((batcher for shared, batcher in self._kept.items() if shared.name == name), None)

    def __len__(self) -> int:
        """How many Batchers the process keeps now."""
        return len(self._kept) + len(self._keyed)


def _one(item: object) -> int:
    return 1
