"""The worker runner: lease jobs from a queue, run a handler on each, ack or nack them.

    def send(job: LeasedJob) -> None:        # or `async def`
        mail(job.payload["to"])               # returning acks the job; raising nacks it

    await Worker(send, "emails", concurrency=16).run()   # or: jobq worker emails:send --queue emails

- Up to `concurrency` jobs run at once: plain functions on `concurrency` threads the worker keeps, async
  functions on the event loop.
- One fetcher leases jobs in batches (`POST /lease`) into a local buffer, kept at about `concurrency`
  jobs beyond those running, so a handler that returns finds its next job at hand. It long-polls only
  when the buffer is empty (or the queue was found empty).
- A job does not wait in the buffer past a third of its visibility timeout: it is given back (`POST
  /release`, the attempt not counted) rather than started late, and the buffer is halved, since jobs
  that slow gain nothing from one.
- Acks and nacks go in batches (`/ack/batch`, `/nack/batch`): those of jobs finishing within a few ms of
  each other, or while the previous batch is in flight, go together.
- A handler that returns acks its job; one that raises nacks it with the exception's type, message and
  the last frames of its traceback, and the queue's backoff decides when it runs again.
- While a handler runs, its lease is extended every half visibility timeout (one task looks after all
  the running jobs), so long work is not handed to another worker; a lease lost anyway (the worker was
  stalled) makes its ack a counted, logged no-op.
- `stop()` (SIGTERM or SIGINT under `jobq worker`) stops leasing at once (a waiting long-poll is
  cancelled, which closes its connection, so the service claims nothing more for this worker), gives
  the buffered jobs back (`POST /release`, the attempt not counted) and gives running handlers `grace`
  seconds to finish; the jobs still running then are released (nacked with `retry_after` 0, so another
  worker takes them now). A second `stop()` releases them without waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import importlib
import inspect
import logging
import os
import queue
import signal
import socket
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from jobq.client import AsyncClient
from jobq.types import ItemResult, JobqError, LeasedJob, LeaseLost, NackItemResult, NotFound, Unavailable

log = logging.getLogger("jobq.worker")

Handler = Callable[[LeasedJob], Any]
T = TypeVar("T")
R = TypeVar("R", bound=ItemResult)

DEFAULT_VISIBILITY_TIMEOUT = 30.0  # the contract's default for a queue nobody configured
ERROR_FRAMES = 5  # traceback frames kept in a nack's error (the innermost ones)
ERROR_CHARS = 4000  # longest error text sent with a nack
RATE_WINDOW = 10.0  # seconds the status line's jobs/s is averaged over
MAX_BATCH = 1000  # the API's limit on a lease's max_jobs and on the items of a batch
BUFFER_AGE = 1 / 3  # the part of its visibility timeout a job may wait in the buffer before it is given back
# Most jobs buffered beyond the running ones (unless concurrency is higher): a lease of a thousand jobs takes
# longer to answer and read than fast handlers take to run a few hundred, so a bigger buffer only slows them.
PREFETCH_CAP = 200
LINGER = 0.002  # seconds an ack or nack waits for others to share its request


def load_handler(spec: str) -> Handler:
    """`package.module:function` (or `module:object.method`), imported with the working directory on the
    path, as `python -m` would."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"{spec!r} is not module:function")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"{spec} is not callable")
    return target


def describe(exc: BaseException) -> str:
    """A failure as a nack's error: `Type: message`, then the innermost frames of the traceback (this
    module's own frames left out), cut to ERROR_CHARS."""
    kind = type(exc).__qualname__
    if type(exc).__module__ not in ("builtins", "__main__"):
        kind = f"{type(exc).__module__}.{kind}"
    text = f"{kind}: {exc}" if str(exc) else kind
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != __file__]
    if frames:
        shown = frames[-ERROR_FRAMES:]
        trimmed = f", {len(frames) - len(shown)} more above" if len(frames) > len(shown) else ""
        text += f"\nTraceback (innermost last{trimmed}):\n" + "".join(
            f'  File "{f.filename}", line {f.lineno}, in {f.name}\n' + (f"    {f.line}\n" if f.line else "")
            for f in shown
        )
    return text[:ERROR_CHARS].rstrip()


def is_async(handler: Handler) -> bool:
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - an object with an async __call__
    )


@dataclass
class Stats:
    done: int = 0  # handler returned, job acked
    failed: int = 0  # handler raised, job nacked
    lost: int = 0  # the lease had moved on when the ack or nack came: another worker has the job
    # given back unstarted (stopping, or too long in the buffer), or still running when the grace period
    # ended and nacked to run again at once
    released: int = 0
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

    def line(self, queue: str, concurrency: int) -> str:
        text = f"{queue}: {self.done} done, {self.failed} failed, {self.in_flight}/{concurrency} in flight"
        for name in ("lost", "released"):
            if getattr(self, name):
                text += f", {getattr(self, name)} {name}"
        return f"{text}, {self.rate():.1f} jobs/s"


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


class Threads:
    """`size` daemon threads running a plain handler on the jobs handed to them; what comes back (the job
    and its error, or None) is handed to `finished` on the event loop, a few at a time. Daemon threads:
    a handler that never returns cannot keep the process from exiting once its job has been released."""

    def __init__(
        self,
        handler: Handler,
        size: int,
        finished: Callable[[list[tuple[LeasedJob, BaseException | None]]], None],
    ) -> None:
        self._handler, self._finished = handler, finished
        self._loop = asyncio.get_running_loop()
        self._inbox: queue.SimpleQueue[tuple[LeasedJob, contextvars.Context] | None] = queue.SimpleQueue()
        self._outbox: deque[tuple[LeasedJob, BaseException | None]] = deque()
        # Whether a _collect is on its way to the loop: the threads that finish meanwhile add to it,
        # rather than each waking the loop.
        self._collecting = False
        self._threads = [
            threading.Thread(target=self._work, name=f"jobq-worker-{n}", daemon=True) for n in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, job: LeasedJob) -> None:
        self._inbox.put((job, contextvars.copy_context()))

    def close(self) -> None:
        """Let the threads end once their handlers return (those stuck in one are left behind)."""
        for _ in self._threads:
            self._inbox.put(None)

    def _work(self) -> None:
        while (item := self._inbox.get()) is not None:
            job, context = item
            error: BaseException | None = None
            try:
                context.run(self._handler, job)
            except BaseException as exc:  # noqa: BLE001 - everything goes back to the loop
                error = exc
            self._outbox.append((job, error))
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


@dataclass(slots=True)
class Held:
    """A running job and when its lease is next extended."""

    job: LeasedJob
    due: float  # time.monotonic() when the lease is extended
    extending: bool = False
    lost: bool = False  # an extension found the lease gone: no more tries


class Worker:
    def __init__(
        self,
        handler: Handler,
        queue: str,
        *,
        client: AsyncClient | None = None,
        concurrency: int = 1,
        wait: float = 20.0,
        visibility_timeout: float | None = None,
        grace: float = 30.0,
        worker_id: str | None = None,
    ) -> None:
        """`wait`: seconds each lease long-polls (at most 60). `visibility_timeout`: seconds each lease
        lasts before it is extended; default the queue's, read once at start. `grace`: seconds running
        handlers get to finish after `stop()`. `client` defaults to one on $JOBQ_URL and $JOBQ_TOKEN."""
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.handler = handler
        self.queue = queue
        self.client = client or AsyncClient()
        self._own_client = client is None
        self.concurrency = concurrency
        self.wait = wait
        self.visibility_timeout = visibility_timeout
        self.grace = grace
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}"
        self.stats = Stats()
        self._async = is_async(handler)
        self._stopping = asyncio.Event()
        self._hurry = asyncio.Event()  # a second stop: release running jobs without waiting
        self._room = asyncio.Event()  # a job finished or left the buffer: the fetcher may lease more
        self._none_running = asyncio.Event()
        # Jobs leased but not started, oldest first, with the time their lease request was sent.
        self._buffer: deque[tuple[LeasedJob, float]] = deque()
        # Jobs buffered beyond those running: doubled when a handler finds the buffer empty while the queue
        # is not (handlers outpace leasing), halved when a job waits too long in the buffer.
        self._prefetch = min(concurrency, MAX_BATCH)
        self._drained = True  # the last lease found fewer jobs than it asked for
        self._starved = False  # a handler found the buffer empty since the last lease
        self._running: dict[int, Held] = {}
        self._idle: deque[asyncio.Future[None]] = deque()  # async slots waiting for a job
        self._slots: list[asyncio.Task[None]] = []
        self._threads: Threads | None = None
        self._extensions: set[asyncio.Task[None]] = set()
        self._visibility = DEFAULT_VISIBILITY_TIMEOUT  # the leases' timeout, set by run()
        self._acks: Batcher[LeasedJob, ItemResult] = Batcher(self.client.ack_many, self._acked, self._unsent)
        self._nacks: Batcher[tuple[LeasedJob, str], NackItemResult] = Batcher(
            self.client.nack_many, self._nacked, self._unsent
        )
        self._releases: Batcher[LeasedJob, ItemResult] = Batcher(
            self.client.release, self._given_back, self._unsent
        )

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
        self._visibility = self.visibility_timeout or await self._queue_visibility_timeout()
        log.info(
            "worker %s on %s: up to %d jobs at once, leases of %gs, grace %gs",
            self.worker_id,
            self.queue,
            self.concurrency,
            self._visibility,
            self.grace,
        )
        if self._async:
            self._slots = [asyncio.create_task(self._slot()) for _ in range(self.concurrency)]
        else:
            self._threads = Threads(self.handler, self.concurrency, self._finished_in_threads)
        keeper = asyncio.create_task(self._keep_leased())
        try:
            await self._fetch()
        finally:
            await self._drain()
            keeper.cancel()
            for extension in self._extensions:
                extension.cancel()
            await asyncio.gather(keeper, *self._extensions, return_exceptions=True)
            if self._own_client:
                await self.client.aclose()
        log.info("worker stopped: %s", self.stats.line(self.queue, self.concurrency))
        return self.stats

    async def _queue_visibility_timeout(self) -> float:
        try:
            return (await self.client.queue(self.queue)).settings.visibility_timeout
        except NotFound:  # a queue nobody configured yet has the defaults
            return DEFAULT_VISIBILITY_TIMEOUT
        except JobqError as exc:
            log.warning(
                "cannot read the settings of %s (%s); leasing for %gs: pass --visibility-timeout to choose",
                self.queue,
                exc.detail,
                DEFAULT_VISIBILITY_TIMEOUT,
            )
            return DEFAULT_VISIBILITY_TIMEOUT

    async def _until_stopped(self, awaitable: Any) -> tuple[bool, Any]:
        """Await `awaitable` unless stop() comes first (then cancel it): (finished, its task)."""
        task = asyncio.ensure_future(awaitable)
        stop = asyncio.ensure_future(self._stopping.wait())
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return False, task
        return True, task

    # --- leasing into the buffer -------------------------------------------------------------------------

    async def _fetch(self) -> None:
        """Keep the buffer filled: lease when at least half the room it may hold is free (any room at all
        when it is empty), long-polling when it is empty or the queue was found empty. The buffer holds
        `concurrency` jobs to begin with, more when handlers find it empty."""
        pause = 0.0
        while not self.stopping:
            if self._starved:
                self._starved = False
                self._prefetch = min(max(PREFETCH_CAP, self.concurrency), max(1, 2 * self._prefetch))
            held = len(self._buffer) + len(self._running)
            room = min(MAX_BATCH, self.concurrency + self._prefetch - held)
            if room < 1 or (self._buffer and room < (self.concurrency + self._prefetch) // 2):
                self._room.clear()
                await self._until_stopped(self._room.wait())
                continue
            # A lease cancelled by stop() while its answer was on the way leaves its jobs claimed until
            # their visibility timeout; the service hands back what it claimed for a client that left.
            sent = time.monotonic()
            finished, task = await self._until_stopped(
                self.client.lease(
                    self.queue,
                    max_jobs=room,
                    visibility_timeout=self._visibility,
                    wait=self.wait if self._drained or not self._buffer else 0,
                    worker_id=self.worker_id,
                )
            )
            if not finished:
                break
            try:
                jobs: list[LeasedJob] = task.result()
            except Unavailable as exc:
                pause = min(max(2 * pause, 1.0), 30.0)
                log.warning("cannot lease from %s: %s; trying again in %.0fs", self.queue, exc.detail, pause)
                await self._until_stopped(asyncio.sleep(pause))
                continue
            pause = 0.0
            self._drained = len(jobs) < room
            self._buffer.extend((job, sent) for job in jobs)
            self._hand_out()

    def _take(self) -> LeasedJob | None:
        """The next buffered job to start, now counted as running; None when there is none (or the worker
        is stopping). Jobs that waited too long are given back on the way."""
        if self.stopping:
            return None
        self._give_back_stale()
        if not self._buffer:
            self._starved = not self._drained
            return None
        job, sent = self._buffer.popleft()
        self._running[job.id] = Held(job, sent + self._visibility / 2)
        self.stats.in_flight = len(self._running)
        return job

    def _hand_out(self) -> None:
        """Start buffered jobs on the free threads, or wake idle async slots to take them."""
        if self._threads is not None:
            while len(self._running) < self.concurrency and (job := self._take()) is not None:
                self._threads.submit(job)
            return
        for _ in range(min(len(self._idle), len(self._buffer))):
            waiter = self._idle.popleft()
            if not waiter.done():
                waiter.set_result(None)

    def _give_back_stale(self) -> None:
        """Give back the buffered jobs leased more than BUFFER_AGE of their visibility timeout ago, and
        prefetch half as many from now on."""
        oldest = time.monotonic() - self._visibility * BUFFER_AGE
        stale = 0
        while self._buffer and self._buffer[0][1] < oldest:
            self._releases.add(self._buffer.popleft()[0])
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
        """One of `concurrency` tasks running async handlers, one job at a time, straight from the buffer."""
        while True:
            job = self._take()
            if job is None:
                if self.stopping:
                    return
                waiter = asyncio.get_running_loop().create_future()
                self._idle.append(waiter)
                await waiter
                continue
            try:
                await self.handler(job)
            except asyncio.CancelledError as exc:
                if asyncio.current_task().cancelling():  # type: ignore[union-attr]
                    raise  # the grace period is over: _drain releases the job
                self._finished(job, exc)
            except Exception as exc:  # noqa: BLE001 - a failure of the job, not of the worker
                self._finished(job, exc)
            else:
                self._finished(job, None)

    def _finished_in_threads(self, results: list[tuple[LeasedJob, BaseException | None]]) -> None:
        for job, error in results:
            self._finished(job, error)
        self._hand_out()

    def _finished(self, job: LeasedJob, error: BaseException | None) -> None:
        """A handler returned or raised: ack or nack its job, unless it was released meanwhile."""
        if self._running.pop(job.id, None) is None:
            return
        self.stats.in_flight = len(self._running)
        if not self._running:
            self._none_running.set()
        self._room.set()
        if error is None:
            self._acks.add(job)
        else:
            self._nacks.add((job, describe(error)))

    # --- answers ----------------------------------------------------------------------------------------

    def _acked(self, job: LeasedJob, result: ItemResult) -> None:
        if result.ok:
            self.stats.done += 1
            log.debug("job %d done", job.id)
        elif result.code == LeaseLost.code:
            self._lost(job)
        else:
            log.error("job %d: could not ack it: %s", job.id, result.code)

    def _nacked(self, failure: tuple[LeasedJob, str], result: NackItemResult) -> None:
        job, error = failure
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
        tick = min(1.0, self._visibility / 10)
        while True:
            await asyncio.sleep(tick)
            self._give_back_stale()
            now = time.monotonic()
            for held in self._running.values():
                if now >= held.due and not held.extending and not held.lost:
                    held.extending = True
                    extension = asyncio.create_task(self._extend(held))
                    self._extensions.add(extension)
                    extension.add_done_callback(self._extensions.discard)

    async def _extend(self, held: Held) -> None:
        sent = time.monotonic()
        try:
            await self.client.extend(held.job, self._visibility)
        except LeaseLost:
            held.lost = True
            log.warning(
                "job %d: lease lost while running (the worker was too slow to extend it)", held.job.id
            )
        except JobqError as exc:
            log.warning("job %d: could not extend the lease: %s", held.job.id, exc.detail)
            held.due = time.monotonic() + min(1.0, self._visibility / 10)
        else:
            log.debug("job %d: lease extended by %gs", held.job.id, self._visibility)
            held.due = sent + self._visibility / 2
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
            for job, _ in self._buffer:
                self._releases.add(job)
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
                results = await self.client.nack_many(
                    [(job, f"released: {why}") for job in batch], retry_after=0
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


# --- running it from the command line ----------------------------------------------------------------


class StatusLine(logging.Handler):
    """Log records for a terminal, with one status line kept below them and redrawn in place."""

    def __init__(self, stream: Any) -> None:
        super().__init__()
        self.stream = stream
        self.text = ""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.stream.write(f"\r\x1b[K{self.format(record)}\n{self.text}")
            self.stream.flush()
        except Exception:  # noqa: BLE001 - logging must not raise
            self.handleError(record)

    def show(self, text: str) -> None:
        with self.lock or contextlib.nullcontext():
            self.text = text
            self.stream.write(f"\r\x1b[K{text}")
            self.stream.flush()

    def end(self) -> None:
        """Leave the last status on the screen and the cursor below it."""
        with self.lock or contextlib.nullcontext():
            if self.text:
                self.stream.write("\n")
                self.stream.flush()
            self.text = ""


async def serve(worker: Worker, *, status_every: float, status_line: StatusLine | None = None) -> Stats:
    """Run `worker` until SIGTERM or SIGINT (a second one releases running jobs at once), showing how it
    is doing: on `status_line` (a terminal) twice a second, else in the log every `status_every` seconds."""
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        name = signal.Signals(signum).name
        if worker.stopping:
            log.warning("%s again: releasing running jobs now", name)
        else:
            log.info(
                "%s: no more leases; running jobs get %gs to finish (send it again to release them now)",
                name,
                worker.grace,
            )
        worker.stop()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)

    async def report() -> None:
        while True:
            await asyncio.sleep(0.5 if status_line else status_every)
            line = worker.stats.line(worker.queue, worker.concurrency)
            if status_line:
                status_line.show(line)
            else:
                log.info("status: %s", line)

    reporter = asyncio.create_task(report())
    try:
        return await worker.run()
    finally:
        reporter.cancel()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        if status_line:
            status_line.end()
