"""The worker runner: lease jobs from queues, run a handler on each, ack or nack them.

    def send(job: LeasedJob) -> None:        # or `async def`
        mail(job.payload["to"])               # returning acks the job; raising nacks it

    await Worker(send, "emails", concurrency=16).run()   # or: jobq worker emails:send --queue emails
    await Worker(tasks, concurrency=16).run()            # a registry (jobq.tasks): each job by its kind

- Up to `concurrency` jobs run at once: plain functions on `concurrency` threads the worker keeps, async
  functions on the event loop.
- A fetcher per queue leases jobs in batches (`POST /lease`) into one local buffer, kept at about
  `concurrency` jobs beyond those running, so a handler that returns finds its next job at hand. It
  long-polls only when the buffer is empty (or its queue was found empty); with several queues, a
  long-poll asks for no more than its share of the room, so an idle queue cannot crowd out a busy one.
- A job does not wait in the buffer past a third of its visibility timeout: it is given back (`POST
  /release`, the attempt not counted) rather than started late, and the buffer is halved, since jobs
  that slow gain nothing from one.
- Acks and nacks go in batches (`/ack/batch`, `/nack/batch`): those of jobs finishing within a few ms of
  each other, or while the previous batch is in flight, go together.
- A handler that returns acks its job, what it returned kept as the job's result (which its children, the
  jobs that depend on it, read with `jobq.parents()`); one that raises nacks it with the exception's type,
  message and the last frames of its traceback, and the queue's backoff decides when it runs again
  (`jobq.Retry(after=)` chooses when, `jobq.Fail` makes the job dead now).
- While a handler runs, its lease is extended every half visibility timeout (one task looks after all
  the running jobs), so long work is not handed to another worker; a lease lost anyway (the worker was
  stalled) makes its ack a counted, logged no-op.
- `stop()` (SIGTERM or SIGINT under `jobq worker`) stops leasing at once (a waiting long-poll is
  cancelled, which closes its connection, so the service claims nothing more for this worker; a short
  lease on its way is let finish, since the service may have leased its jobs already), gives the
  buffered jobs back (`POST /release`, the attempt not counted) and gives running handlers `grace`
  seconds to finish; the jobs still running then are released (nacked with `retry_after` 0, so another
  worker takes them now). A second `stop()` releases them without waiting (and cancels a short lease
  still on its way).
"""

from __future__ import annotations

import asyncio
import difflib
import json
import logging
import os
import socket
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from jobq.client import AsyncClient, Completion, Failure
from jobq.pools import MAX_BATCH, Batcher, Outcome, Threads
from jobq.tasks import Fail, Retry, Running, Suspend, Tasks, UnknownTask, _current, is_async
from jobq.tracing import traced
from jobq.types import (
    Forbidden,
    ItemResult,
    JobqError,
    LeasedJob,
    LeaseLost,
    NackItemResult,
    NotFound,
    PayloadTooLarge,
    Unavailable,
)

log = logging.getLogger("jobq.worker")

Handler = Callable[[LeasedJob], Any]

DEFAULT_VISIBILITY_TIMEOUT = 30.0  # the contract's default for a queue nobody configured
ERROR_FRAMES = 5  # traceback frames kept in a nack's error (the innermost ones)
ERROR_CHARS = 4000  # longest error text sent with a nack
RATE_WINDOW = 10.0  # seconds the status line's jobs/s is averaged over
LISTED_QUEUES = 20  # queues named at most when warning of one that does not exist
BUFFER_AGE = 1 / 3  # the part of its visibility timeout a job may wait in the buffer before it is given back
# Jobs buffered beyond the running ones: at most what the handlers, at their average time so far, finish in
# this many seconds (and at most a lease's limit). Fast handlers get big leases, whose cost per job is lowest;
# slow ones leave the queue's jobs to other workers. 0.5 s of no-op handlers is a full lease of 1,000.
PREFETCH_SECONDS = 0.5
HANDLER_TIME_WEIGHT = 0.05  # weight of each finished job in the handlers' average time


def describe(exc: BaseException) -> str:
    """A failure as a nack's error: `Type: message`, then the innermost frames of the traceback (this
    module's own frames left out), cut to ERROR_CHARS."""
    kind = type(exc).__qualname__
    if type(exc).__module__ not in ("builtins", "__main__"):
        kind = f"{type(exc).__module__}.{kind}"
    text = f"{kind}: {exc}" if str(exc) else kind
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename not in OWN_FILES]
    if frames:
        shown = frames[-ERROR_FRAMES:]
        trimmed = f", {len(frames) - len(shown)} more above" if len(frames) > len(shown) else ""
        text += f"\nTraceback (innermost last{trimmed}):\n" + "".join(
            f'  File "{f.filename}", line {f.lineno}, in {f.name}\n' + (f"    {f.line}\n" if f.line else "")
            for f in shown
        )
    return text[:ERROR_CHARS].rstrip()


@dataclass(frozen=True, slots=True)
class Route:
    """How a job runs: the function called on it, whether it is a coroutine function, and how long its
    lease lasts while it runs (None: as long as the lease it came with)."""

    run: Handler
    is_async: bool
    visibility_timeout: float | None = None

    def traced(self) -> Route:
        """The route running its handler in its job's span, when spans go anywhere (jobq/tracing.py)."""
        return replace(self, run=traced(self.run, self.is_async))


def result_of(job: LeasedJob, value: Any) -> Any:
    """What a handler returned, as the job's result: None when JSON cannot hold it (logged), since the
    job is done either way."""
    if value is None or isinstance(value, (str, int, bool)):
        return value
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        log.warning(
            "job %d: its handler returned what JSON cannot hold (%s); done with no result", job.id, exc
        )
        return None
    return value


def failure_of(job: LeasedJob, exc: BaseException) -> Failure:
    """The nack of a job whose handler raised `exc`: when it runs again (`Retry`), or dead now (`Fail`)."""
    if isinstance(exc, Retry):
        return Failure(job, describe(exc), retry_after=exc.after)
    return Failure(job, describe(exc), dead=isinstance(exc, Fail))


@dataclass
class Stats:
    done: int = 0  # handler returned, job acked
    failed: int = 0  # handler raised, job nacked
    lost: int = 0  # the lease had moved on when the ack or nack came: another worker has the job
    # given back unstarted (stopping, or too long in the buffer), or still running when the grace period
    # ended and nacked to run again at once
    released: int = 0
    # ended by ctx.sleep or ctx.wait_for_event: released to sleep, or parked until an event
    suspended: int = 0
    in_flight: int = 0
    # (time, jobs finished) samples over the last RATE_WINDOW seconds, for the rate in the status line.
    _samples: deque[tuple[float, int]] = field(default_factory=deque, repr=False)

    def rate(self) -> float:
        """Jobs finished (done or failed) per second over the last RATE_WINDOW seconds."""
        now, finished = time.monotonic(), self.done + self.failed
        self._samples.append((now, finished))
        while len(self._samples) > 1 and self._samples[0][0] < now - RATE_WINDOW:
            self._samples.popleft()
        then, before = self._samples[0]
        return (finished - before) / (now - then) if now > then else 0.0

    def line(self, queue: str, concurrency: int, *, recent: bool = True) -> str:
        """How the worker is doing: counts, and (`recent`) the rate of late (`idle` when nothing ran)."""
        text = f"{queue}: {self.done} done, {self.failed} failed, {self.in_flight}/{concurrency} in flight"
        for name in ("lost", "released", "suspended"):
            if getattr(self, name):
                text += f", {getattr(self, name)} {name}"
        if not recent:
            return text
        rate = self.rate()
        return f"{text}, {rate:.1f} jobs/s" if rate or self.in_flight else f"{text}, idle"


# This module's and its helpers' frames, left out of the tracebacks sent with nacks.
OWN_FILES = frozenset({__file__, Batcher.__init__.__code__.co_filename, Tasks.__init__.__code__.co_filename})


@dataclass(slots=True)
class Held:
    """A running job, how it runs, and when its lease is next extended."""

    job: LeasedJob
    visibility_timeout: float  # seconds each extension of its lease asks for
    due: float  # time.monotonic() when the lease is extended
    started: float = field(default_factory=time.monotonic)
    extending: bool = False
    lost: bool = False  # an extension found the lease gone: no more tries
    # The latest progress the handler reported (jobq.progress), and how many reports were made and sent:
    # the handler's thread writes the first two, the keeper sends what is new with the next extension.
    progress: Any = None
    reported: int = 0
    sent: int = 0


@dataclass(slots=True)
class Buffered:
    job: LeasedJob
    sent: float  # time.monotonic() when its lease was asked for: it ends no sooner than its timeout after


class Worker:
    def __init__(
        self,
        handler: Handler | Tasks,
        queue: str | Sequence[str] | None = None,
        *,
        client: AsyncClient | None = None,
        concurrency: int = 1,
        wait: float = 20.0,
        visibility_timeout: float | None = None,
        grace: float = 30.0,
        worker_id: str | None = None,
    ) -> None:
        """`handler`: a function taking the leased job, or a registry of tasks (`jobq.Tasks`) to run each
        job by its kind. `queue`: one queue or several (default: the registry's tasks' queues). `wait`:
        seconds each lease long-polls (at most 60). `visibility_timeout`: seconds each lease lasts before
        it is extended; default the queue's, read once at start. `grace`: seconds running handlers get
        to finish after `stop()`. `client` defaults to one on $JOBQ_URL and $JOBQ_TOKEN."""
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if isinstance(handler, Tasks):
            if not handler:
                raise ValueError("the task registry has no tasks")
            self._routes = {t.name: Route(t.run, t.is_async, t.visibility_timeout) for t in handler}
            self._route_all: Route | None = None
            routes = list(self._routes.values())
            queue = handler.queues if queue is None else queue
        else:
            self._routes = {}
            self._route_all = Route(handler, is_async(handler))
            routes = [self._route_all]
        if queue is None:
            raise ValueError("name the queue to work on")
        self.queues = [queue] if isinstance(queue, str) else list(dict.fromkeys(queue))
        if not self.queues:
            raise ValueError("name at least one queue to work on")
        self.handler = handler
        self.client = client or AsyncClient()
        self._own_client = client is None
        self.concurrency = concurrency
        self.wait = wait
        self.visibility_timeout = visibility_timeout
        self.grace = grace
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}"
        self.stats = Stats()
        self._any_async = any(route.is_async for route in routes)
        self._any_plain = not all(route.is_async for route in routes)
        self._stopping = asyncio.Event()
        self._hurry = asyncio.Event()  # a second stop: release running jobs without waiting
        self._room = asyncio.Event()  # a job finished or left the buffer: the fetchers may lease more
        self._none_running = asyncio.Event()
        self._buffer: deque[Buffered] = deque()  # jobs leased but not started, oldest first
        # Jobs buffered beyond those running: doubled when a handler finds the buffer empty while a queue
        # is not (handlers outpace leasing), up to _prefetch_limit(); halved when a job waits too long in
        # the buffer.
        self._prefetch = min(concurrency, MAX_BATCH)
        self._handler_time: float | None = None  # seconds a handler takes, on average (None: none ran yet)
        self._drained = dict.fromkeys(self.queues, True)  # the queue's last lease found fewer jobs than asked
        self._asking = 0  # jobs the leases in flight may bring
        self._starved = False  # a handler found the buffer empty since the last lease
        self._running: dict[int, Held] = {}
        self._idle: deque[asyncio.Future[tuple[LeasedJob, Route] | None]] = deque()  # async slots waiting
        self._slots: list[asyncio.Task[None]] = []
        self._threads: Threads | None = None
        self._extensions: set[asyncio.Task[None]] = set()
        self._suspending: set[asyncio.Task[None]] = set()  # jobs being slept or parked (`_suspend`)
        # Each queue's leases' timeout, set by run(); jobs leave the buffer after BUFFER_AGE of the shortest.
        self._visibility = dict.fromkeys(self.queues, DEFAULT_VISIBILITY_TIMEOUT)
        self._shortest = DEFAULT_VISIBILITY_TIMEOUT
        self._started = time.monotonic()
        self._acks: Batcher[Completion, ItemResult] = Batcher(
            self.client.worker.ack_many, self._acked, self._unsent
        )
        self._nacks: Batcher[Failure, NackItemResult] = Batcher(
            self.client.worker.nack_many, self._nacked, self._unsent
        )
        self._releases: Batcher[LeasedJob, ItemResult] = Batcher(
            self.client.worker.release, self._given_back, self._unsent
        )

    @property
    def queue(self) -> str:
        """The queues worked on, as one name for messages (`emails,reports`)."""
        return ",".join(self.queues)

    def stop(self) -> None:
        """Stop leasing and let running handlers finish within `grace`; called again, release them now.
        Call it on the worker's event loop (`loop.call_soon_threadsafe(worker.stop)` from elsewhere)."""
        if self._stopping.is_set():
            self._hurry.set()
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def run(self) -> Stats:
        """Work until `stop()`; the counts of what was done. A refusal by the service other than
        `unavailable` (a bad token, an invalid queue name) ends the run with that error."""
        # A tracer provider set up after the worker was made (at the start of a program) counts.
        self._routes = {name: route.traced() for name, route in self._routes.items()}
        if self._route_all is not None:
            self._route_all = self._route_all.traced()
        missing: list[str] = []
        for queue in self.queues:
            lease = await self._queue_visibility_timeout(queue, missing)
            self._visibility[queue] = self.visibility_timeout or lease
        if missing:
            await self._warn_of_missing(missing)
        self._shortest = min(self._visibility.values())
        log.info(
            "worker %s on %s: up to %d jobs at once, leases of %s, grace %gs",
            self.worker_id,
            self.queue,
            self.concurrency,
            ", ".join(sorted({f"{v:g}s" for v in self._visibility.values()})),
            self.grace,
        )
        self._started = time.monotonic()
        if self._any_plain:
            self._threads = Threads(self.concurrency, self._finished_in_threads)
        if self._any_async:
            self._slots = [asyncio.create_task(self._slot()) for _ in range(self.concurrency)]
        keeper = asyncio.create_task(self._keep_leased())
        fetchers = [
            asyncio.create_task(self._fetch(queue, second))
            for queue in self.queues
            for second in (False, True)
        ]
        try:
            await asyncio.gather(*fetchers)
        finally:
            for fetcher in fetchers:
                fetcher.cancel()  # when one failed: the others stop too
            await asyncio.gather(*fetchers, return_exceptions=True)
            await self._drain()
            await asyncio.gather(*self._suspending, return_exceptions=True)
            keeper.cancel()
            for extension in self._extensions:
                extension.cancel()
            await asyncio.gather(keeper, *self._extensions, return_exceptions=True)
            if self._own_client:
                await self.client.aclose()
        finished, elapsed = self.stats.done + self.stats.failed, time.monotonic() - self._started
        log.info(
            "worker stopped after %.1fs (%.1f jobs/s on average): %s",
            elapsed,
            finished / elapsed if elapsed else 0.0,
            self.stats.line(self.queue, self.concurrency, recent=False),
        )
        return self.stats

    async def _queue_visibility_timeout(self, queue: str, missing: list[str]) -> float:
        """The queue's visibility timeout; a queue that does not exist yet is added to `missing`."""
        try:
            return (await self.client.admin.queue(queue)).settings.visibility_timeout
        except NotFound:  # a queue nobody configured yet has the defaults
            missing.append(queue)
            return DEFAULT_VISIBILITY_TIMEOUT
        except JobqError as exc:
            log.warning(
                "cannot read the settings of %s (%s); leasing for %gs: pass --visibility-timeout to choose",
                queue,
                exc.detail,
                DEFAULT_VISIBILITY_TIMEOUT,
            )
            return DEFAULT_VISIBILITY_TIMEOUT

    async def _warn_of_missing(self, missing: list[str]) -> None:
        """A queue that does not exist yet (no job, no settings) is most often a typo, which would wait
        for ever without a word: say so at start, naming the queues that exist (the first LISTED_QUEUES
        of those the token may list, the closest names first as a guess), and work on, since the queue
        may yet get its first job."""
        try:
            names = sorted(row.queue for row in await self.client.admin.queues())
        except Forbidden:
            names, there = [], "this token may not list the queues"
        except JobqError as exc:
            names, there = [], f"the queues could not be listed ({exc.detail})"
        else:
            shown = ", ".join(names[:LISTED_QUEUES])
            more = f", and {len(names) - LISTED_QUEUES} more" if len(names) > LISTED_QUEUES else ""
            there = f"queues that exist: {shown}{more}" if names else "no queue exists yet"
        for queue in missing:
            guess = difflib.get_close_matches(queue, names, n=3)
            log.warning(
                "queue %s does not exist yet (no jobs, no settings): waiting for its first job; %s%s",
                queue,
                f"did you mean {' or '.join(guess)}? " if guess else "",
                there,
            )

    async def _until_stopped(self, awaitable: Any, stopping: asyncio.Event | None = None) -> tuple[bool, Any]:
        """Await `awaitable` unless stop() comes first (or `stopping` is set first: `self._hurry`, a second
        stop), then cancel it: (finished, its task)."""
        task = asyncio.ensure_future(awaitable)
        stop = asyncio.ensure_future((stopping or self._stopping).wait())
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return False, task
        return True, task

    # --- leasing into the buffer -------------------------------------------------------------------------

    async def _fetch(self, queue: str, second: bool) -> None:
        """Keep the buffer filled from `queue`: lease when at least half the room it may hold is free (any
        room at all when it is empty), long-polling when the queue's last lease found fewer jobs than it
        asked for. The buffer holds `concurrency` jobs to begin with, more when handlers find it empty.
        Room asked for by the leases in flight counts as taken.

        Each queue has two fetchers, and a lease asks for at most half the room, so that while one lease
        is on its way the other can ask for the room that handlers free meanwhile (fast handlers otherwise
        wait for each lease's round trip); the `second` never long-polls: while its queue is found empty,
        it waits for the first to find jobs."""
        pause = 0.0
        while not self.stopping:
            if self._starved:
                self._starved = False
                self._prefetch = max(1, 2 * self._prefetch)
            self._prefetch = min(self._prefetch, self._prefetch_limit())
            capacity = self.concurrency + self._prefetch
            held = len(self._buffer) + len(self._running) + self._asking
            room = min(MAX_BATCH, capacity - held, (capacity + 1) // 2)
            long_poll = self._drained[queue]
            if room < 1 or (self._buffer and room < capacity // 2) or (second and long_poll):
                self._room.clear()
                await self._until_stopped(self._room.wait())
                continue
            if long_poll and len(self.queues) > 1:
                room = min(room, max(1, capacity // len(self.queues)))
            # stop() cancels a long-poll, which may wait long: the service sees its client leave, leases
            # nothing more for it, and hands back what it leased for it meanwhile. A short lease is let
            # finish (a second stop() cancels it): its answer is a round trip away, and by the time stop()
            # comes the service may have leased its jobs, which an answer thrown away would leave claimed
            # by nobody until their visibility timeout; read, they go to the buffer, which _drain() gives
            # back.
            sent = time.monotonic()
            self._asking += room
            try:
                finished, task = await self._until_stopped(
                    self.client.worker.lease(
                        queue,
                        max_jobs=room,
                        visibility_timeout=self._visibility[queue],
                        wait=self.wait if long_poll else 0,
                        worker_id=self.worker_id,
                    ),
                    None if long_poll else self._hurry,
                )
            finally:
                self._asking -= room
            if not finished:
                break
            try:
                jobs: list[LeasedJob] = task.result()
            except Unavailable as exc:
                pause = min(max(2 * pause, 1.0), 30.0)
                log.warning("cannot lease from %s: %s; trying again in %.0fs", queue, exc.detail, pause)
                await self._until_stopped(asyncio.sleep(pause))
                continue
            pause = 0.0
            self._drained[queue] = len(jobs) < room
            self._buffer.extend(Buffered(job, sent) for job in jobs)
            self._room.set()  # the other fetchers see their room again
            self._hand_out()

    def _prefetch_limit(self) -> int:
        """The most jobs to buffer beyond the running ones: what the handlers finish in PREFETCH_SECONDS at
        their average time, at least `concurrency` (no more until one has finished) and at most a lease."""
        if self._handler_time is None:
            return min(self.concurrency, MAX_BATCH)
        in_time = self.concurrency * PREFETCH_SECONDS / max(self._handler_time, 1e-6)
        return max(min(self.concurrency, MAX_BATCH), min(MAX_BATCH, int(in_time)))

    def _route(self, job: LeasedJob) -> Route:
        if self._route_all is not None:
            return self._route_all
        route = self._routes.get(job.kind or "")
        if route is None:
            known = ", ".join(sorted(self._routes))
            if job.kind is None:
                raise UnknownTask(f"the job has no kind to name its task (this worker knows: {known})")
            raise UnknownTask(f"no task is named {job.kind!r} in this worker (it knows: {known})")
        return route

    def _hand_out(self) -> None:
        """Start buffered jobs while fewer than `concurrency` run: plain ones on the threads, async ones on
        idle slots (there is always one: a slot is busy only while its job runs). Jobs that waited too long
        are given back on the way."""
        if self.stopping:
            return
        self._give_back_stale()
        while len(self._running) < self.concurrency:
            if not self._buffer:
                self._starved = not all(self._drained.values())
                return
            buffered = self._buffer.popleft()
            job = buffered.job
            try:
                route = self._route(job)
            except UnknownTask as exc:  # never started: nacked straight away
                self._nacks.add(failure_of(job, exc))
                self._room.set()
                continue
            leased_for = self._visibility.get(job.queue, self._shortest)
            if route.visibility_timeout is None or route.visibility_timeout == leased_for:
                held = Held(job, leased_for, buffered.sent + leased_for / 2)
            else:  # the task's own timeout: set at the keeper's next round
                held = Held(job, route.visibility_timeout, time.monotonic())
            self._running[job.id] = held
            self.stats.in_flight = len(self._running)
            if route.is_async:
                self._idle.popleft().set_result((job, route))
            else:
                assert self._threads is not None
                self._threads.submit(self._context_of(job), route.run)

    def _give_back_stale(self) -> None:
        """Give back the buffered jobs leased more than BUFFER_AGE of their visibility timeout ago, and
        prefetch half as many from now on."""
        oldest = time.monotonic() - self._shortest * BUFFER_AGE
        stale = 0
        while self._buffer and self._buffer[0].sent < oldest:
            self._releases.add(self._buffer.popleft().job)
            stale += 1
        if stale:
            self._prefetch //= 2
            self._room.set()
            log.info(
                "gave back %d jobs that waited past %.0f%% of their lease in the buffer; prefetching %d now",
                stale,
                100 * BUFFER_AGE,
                self._prefetch,
            )

    # --- running handlers ------------------------------------------------------------------------------

    async def _slot(self) -> None:
        """One of `concurrency` tasks running async handlers, one job at a time, as `_hand_out` gives them."""
        loop = asyncio.get_running_loop()
        while True:
            waiter: asyncio.Future[tuple[LeasedJob, Route] | None] = loop.create_future()
            self._idle.append(waiter)
            self._hand_out()  # at once when the buffer has a job (an awaited done future does not yield)
            given = await waiter
            if given is None:
                return
            job, route = given
            _current.set(self._context_of(job))
            try:
                value = await route.run(job)
            except asyncio.CancelledError as exc:
                if asyncio.current_task().cancelling():  # type: ignore[union-attr]
                    raise  # the grace period is over: _drain releases the job
                self._finished(job, exc)
            except (Exception, Suspend) as exc:  # noqa: BLE001 - a failure of the job, not of the worker
                self._finished(job, exc)
            else:
                self._finished(job, None, value)

    def _context_of(self, job: LeasedJob) -> Running:
        """What the job's handler reads of it (`jobq.current_job()`, `progress()`, `parents()`): the worker's
        client and loop read its parents when its lease did not carry them."""
        return Running(job, self._report, self.client, asyncio.get_running_loop())

    def _finished_in_threads(self, outcomes: list[Outcome]) -> None:
        for job, error, value in outcomes:
            self._finished(job, error, value)
        self._hand_out()

    def _finished(self, job: LeasedJob, error: BaseException | None, value: Any = None) -> None:
        """A handler returned or raised: ack its job, with what it returned as the result, or nack it;
        unless it was released meanwhile."""
        held = self._running.pop(job.id, None)
        if held is None:
            return
        took = time.monotonic() - held.started
        average = self._handler_time
        self._handler_time = took if average is None else average + HANDLER_TIME_WEIGHT * (took - average)
        self.stats.in_flight = len(self._running)
        if not self._running:
            self._none_running.set()
        self._room.set()
        if error is None:
            self._acks.add(Completion(job, result_of(job, value)))
        elif isinstance(error, Suspend):
            suspending = asyncio.create_task(self._suspend(job, error))
            self._suspending.add(suspending)
            suspending.add_done_callback(self._suspending.discard)
        else:
            self._nacks.add(failure_of(job, error))

    async def _suspend(self, job: LeasedJob, suspend: Suspend) -> None:
        """A handler ended by `ctx.sleep` or `ctx.wait_for_event`: record the sleep's wake-up time and
        release the job for that long, or park it until the event; the attempt is not counted either way.
        A lease lost meanwhile changes nothing (another worker has the job); a request that fails leaves
        the job to its lease's expiry, which runs it again (the attempt counted)."""
        worker = self.client.worker
        try:
            if suspend.event is not None:
                assert suspend.timeout is not None
                await worker.await_event(job, suspend.event, suspend.timeout)
            else:
                if suspend.record is not None:
                    await worker.record_step(job, *suspend.record)
                (result,) = await worker.release([job], delay=suspend.delay)
                if not result.ok:
                    raise LeaseLost(f"job {job.id}: {result.code}", code=result.code)
        except LeaseLost:
            self._lost(job)
        except JobqError as exc:
            log.error("job %d: could not suspend it (%s); it runs again once its lease expires", job.id, exc)
        else:
            self.stats.suspended += 1
            log.debug("job %d suspended: %s", job.id, suspend)

    def _report(self, job_id: int, progress: Any) -> None:
        """jobq.progress() in a handler (on its thread, or the loop): kept for the keeper to send."""
        held = self._running.get(job_id)
        if held is not None:
            held.progress = progress
            held.reported += 1  # after the value: the keeper reads the count first

    # --- answers ----------------------------------------------------------------------------------------

    def _acked(self, completion: Completion, result: ItemResult) -> None:
        job = completion.job
        if result.ok:
            self.stats.done += 1
            log.debug("job %d done", job.id)
        elif result.code == LeaseLost.code:
            self._lost(job)
        elif result.code == PayloadTooLarge.code and completion.result is not None:
            log.warning("job %d: its result is larger than the service keeps; done without it", job.id)
            self._acks.add(Completion(job))  # the job is still running under its lease
        else:
            log.error("job %d: could not ack it: %s", job.id, result.code)

    def _nacked(self, failure: Failure, result: NackItemResult) -> None:
        job, error = failure.job, failure.error or ""
        if result.ok:
            self.stats.failed += 1
            log.warning(
                "job %d failed (attempt %d of %d, now %s): %s",
                job.id,
                job.attempts,
                job.max_attempts,
                result.status,
                error.splitlines()[0],
            )
        elif result.code == LeaseLost.code:
            self._lost(job)
        else:
            log.error("job %d: could not nack it: %s", job.id, result.code)

    def _given_back(self, job: LeasedJob, result: ItemResult) -> None:
        if result.ok:
            self.stats.released += 1
            log.debug("job %d given back, not started", job.id)
        else:
            self.stats.lost += 1

    def _unsent(self, batch: list[Any], exc: Exception) -> None:
        # They come back by themselves when their leases expire.
        detail = exc.detail if isinstance(exc, JobqError) else repr(exc)
        log.error(
            "could not send %d acks, nacks or releases (%s); those jobs run again later", len(batch), detail
        )

    def _lost(self, job: LeasedJob) -> None:
        self.stats.lost += 1
        log.warning("job %d: the lease had moved on, another worker has the job", job.id)

    # --- leases of running jobs ------------------------------------------------------------------------

    async def _keep_leased(self) -> None:
        """Extend the lease of each running job every half visibility timeout, and give back the buffered
        jobs that waited too long. Deadlines are counted from before the request that set them, so a lease
        never ends later than we think."""
        tick = min(1.0, self._shortest / 10)
        while True:
            await asyncio.sleep(tick)
            self._give_back_stale()
            now = time.monotonic()
            for held in self._running.values():
                if (now >= held.due or held.reported != held.sent) and not held.extending and not held.lost:
                    held.extending = True
                    extension = asyncio.create_task(self._extend(held))
                    self._extensions.add(extension)
                    extension.add_done_callback(self._extensions.discard)

    async def _extend(self, held: Held) -> None:
        """Extend a running job's lease, with its progress when it reported any since the last time."""
        sent = time.monotonic()
        reported = held.reported  # before the value: a report made meanwhile goes next time
        progress = held.progress if reported != held.sent else None
        try:
            await self.client.worker.extend(held.job, held.visibility_timeout, progress=progress)
            held.sent = reported
        except LeaseLost:
            held.lost = True
            log.warning(
                "job %d: lease lost while running (the worker was too slow to extend it)", held.job.id
            )
        except JobqError as exc:
            log.warning("job %d: could not extend the lease: %s", held.job.id, exc.detail)
            held.due = time.monotonic() + min(1.0, held.visibility_timeout / 10)
        else:
            log.debug("job %d: lease extended by %gs", held.job.id, held.visibility_timeout)
            held.due = sent + held.visibility_timeout / 2
        finally:
            held.extending = False

    # --- stopping ---------------------------------------------------------------------------------------

    async def _drain(self) -> None:
        """After stop(): give the buffer back, wait up to `grace` for running handlers, release the rest,
        and send the last acks and nacks."""
        self._stopping.set()  # also when leasing failed: nothing more starts
        while self._idle:
            waiter = self._idle.popleft()
            if not waiter.done():
                waiter.set_result(None)
        if self._buffer:
            log.info("stopping: giving back %d jobs leased but not started", len(self._buffer))
            for buffered in self._buffer:
                self._releases.add(buffered.job)
            self._buffer.clear()
        if self._running:
            log.info("stopping: %d jobs running, waiting up to %gs for them", len(self._running), self.grace)
            deadline = time.monotonic() + self.grace
            while self._running and not self._hurry.is_set() and time.monotonic() < deadline:
                self._none_running.clear()
                waits = {asyncio.ensure_future(e.wait()) for e in (self._none_running, self._hurry)}
                await asyncio.wait(
                    waits, timeout=deadline - time.monotonic(), return_when=asyncio.FIRST_COMPLETED
                )
                for w in waits:
                    w.cancel()
        cut = [held.job for held in self._running.values()]
        self._running.clear()
        self.stats.in_flight = 0
        for slot in self._slots:
            slot.cancel()
        await asyncio.gather(*self._slots, return_exceptions=True)
        if self._threads is not None:
            self._threads.close()
        await self._release(cut, f"the worker stopped; the job ran past the {self.grace:g}s grace period")
        await asyncio.gather(self._acks.flush(), self._nacks.flush(), self._releases.flush())

    async def _release(self, jobs: list[LeasedJob], why: str) -> None:
        """Jobs still running: nacked to run again at once (they ran, so the attempt counts)."""
        for start in range(0, len(jobs), MAX_BATCH):
            batch = jobs[start : start + MAX_BATCH]
            try:
                results = await self.client.worker.nack_many(
                    [Failure(job, f"released: {why}", 0) for job in batch]
                )
            except JobqError as exc:
                log.error(
                    "could not release %d jobs (%s); they come back when their leases expire", len(batch), exc
                )
                continue
            for job, result in zip(batch, results, strict=True):
                if result.ok:
                    self.stats.released += 1
                    log.warning("job %d released: %s", job.id, why)
                else:
                    self.stats.lost += 1
