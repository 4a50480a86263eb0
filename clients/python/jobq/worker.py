"""The worker runner: lease jobs from a queue, run a handler on each, ack or nack them.

    def send(job: LeasedJob) -> None:        # or `async def`
        mail(job.payload["to"])               # returning acks the job; raising nacks it

    await Worker(send, "emails", concurrency=16).run()   # or: jobq worker emails:send --queue emails

- Up to `concurrency` jobs run at once. The worker long-polls `/lease` for as many jobs as it has free
  slots. Plain functions run in threads of their own, async functions on the event loop.
- Acks go in batches: those of jobs finishing while an ack request is in flight go together next.
- A handler that returns acks its job; one that raises nacks it with the exception's type, message and
  the last frames of its traceback, and the queue's backoff decides when it runs again.
- While a handler runs, its lease is extended every half visibility timeout, so long work is not handed
  to another worker; a lease lost anyway (the worker was stalled) makes its ack a counted, logged no-op.
- `stop()` (SIGTERM or SIGINT under `jobq worker`) stops leasing at once (a waiting long-poll is
  cancelled, which closes its connection, so the service claims nothing more for this worker) and gives
  running handlers `grace` seconds to finish; jobs leased but not started, those of a lease answered
  as the stop came included, are given back (`POST /release`, the attempt not counted); the jobs still
  running then are released (nacked with `retry_after` 0, so another worker takes them now). A second
  `stop()` releases them without waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import importlib
import inspect
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jobq.client import AsyncClient
from jobq.types import ItemResult, JobqError, LeasedJob, LeaseLost, NotFound, Unavailable

log = logging.getLogger("jobq.worker")

Handler = Callable[[LeasedJob], Any]

DEFAULT_VISIBILITY_TIMEOUT = 30.0  # the contract's default for a queue nobody configured
ERROR_FRAMES = 5  # traceback frames kept in a nack's error (the innermost ones)
ERROR_CHARS = 4000  # longest error text sent with a nack
RATE_WINDOW = 10.0  # seconds the status line's jobs/s is averaged over


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


def _in_thread(function: Handler, job: LeasedJob) -> asyncio.Future[Any]:
    """Run a plain handler in a daemon thread of its own: one that never returns cannot keep the process
    from exiting once its job has been released."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():  # released meanwhile: nobody waits for it any more
            return
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)

    def run() -> None:
        try:
            outcome: tuple[Any, BaseException | None] = (context.run(function, job), None)
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the loop
            outcome = (None, exc)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop has closed: the worker is gone
            pass

    threading.Thread(target=run, name=f"jobq-job-{job.id}", daemon=True).start()
    return future


@dataclass
class Stats:
    done: int = 0  # handler returned, job acked
    failed: int = 0  # handler raised, job nacked
    lost: int = 0  # the lease had moved on when the ack or nack came: another worker has the job
    released: int = 0  # still running when the grace period ended; nacked to run again at once
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


class AckBatcher:
    """Acks of jobs that finish while an ack request is in flight wait for it and go together in the next
    one (`POST /ack/batch`): nothing is added to an ack's latency when jobs are few, and many jobs cost
    one request when they are not."""

    MAX_BATCH = 1000  # the API's limit per batch

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.waiting: list[tuple[LeasedJob, asyncio.Future[ItemResult]]] = []
        self.sender: asyncio.Task[None] | None = None

    async def ack(self, job: LeasedJob) -> ItemResult:
        result: asyncio.Future[ItemResult] = asyncio.get_running_loop().create_future()
        self.waiting.append((job, result))
        if self.sender is None or self.sender.done():
            self.sender = asyncio.create_task(self._send())
        return await result

    async def _send(self) -> None:
        while self.waiting:
            batch, self.waiting = self.waiting[: self.MAX_BATCH], self.waiting[self.MAX_BATCH :]
            try:
                items = await self.client.ack_many([job for job, _ in batch])
            except Exception as exc:  # noqa: BLE001 - every ack of the batch gets the error
                for _, result in batch:
                    if not result.done():
                        result.set_exception(exc)
                continue
            for (_, result), item in zip(batch, items, strict=True):
                if not result.done():
                    result.set_result(item)


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
        self._slot_free = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._handlers: dict[int, asyncio.Future[Any]] = {}
        self._acks = AckBatcher(self.client)

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
        visibility_timeout = self.visibility_timeout or await self._queue_visibility_timeout()
        log.info(
            "worker %s on %s: up to %d jobs at once, leases of %gs, grace %gs",
            self.worker_id,
            self.queue,
            self.concurrency,
            visibility_timeout,
            self.grace,
        )
        try:
            await self._lease_until_stopped(visibility_timeout)
        finally:
            await self._drain()
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

    async def _lease_until_stopped(self, visibility_timeout: float) -> None:
        pause = 0.0
        while not self.stopping:
            free = self.concurrency - self.stats.in_flight
            if free <= 0:
                self._slot_free.clear()
                await self._until_stopped(self._slot_free.wait())
                continue
            # A lease cancelled by stop() while its answer was on the way leaves its jobs claimed until
            # their visibility timeout; the service hands back what it claimed for a client that left.
            leased_at = time.monotonic()
            finished, task = await self._until_stopped(
                self.client.lease(
                    self.queue,
                    max_jobs=free,
                    visibility_timeout=visibility_timeout,
                    wait=self.wait,
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
            for job in jobs:
                if self.stopping:  # arrived with the stop: hand it back untouched, attempt not counted
                    await self._give_back(job)
                    continue
                self.stats.in_flight += 1  # now, not when the task starts: the next lease counts on it
                process = asyncio.create_task(self._process(job, leased_at, visibility_timeout))
                self._tasks.add(process)
                process.add_done_callback(self._tasks.discard)

    async def _drain(self) -> None:
        """After stop(): wait up to `grace` for running handlers, then release the rest."""
        if not self._tasks:
            return
        log.info("stopping: %d jobs running, waiting up to %gs for them", len(self._tasks), self.grace)
        hurry = asyncio.ensure_future(self._hurry.wait())
        deadline = time.monotonic() + self.grace
        while self._tasks and not self._hurry.is_set() and time.monotonic() < deadline:
            await asyncio.wait(
                {*self._tasks, hurry},
                timeout=deadline - time.monotonic(),
                return_when=asyncio.FIRST_COMPLETED,
            )
        hurry.cancel()
        for handler in self._handlers.values():
            handler.cancel()  # _process sees it and releases the job
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _process(self, job: LeasedJob, leased_at: float, visibility_timeout: float) -> None:
        keeper = asyncio.create_task(self._keep_leased(job, leased_at, visibility_timeout))
        handler = self._start(job)
        self._handlers[job.id] = handler
        try:
            await asyncio.wait({handler})
        finally:
            keeper.cancel()
            self._handlers.pop(job.id, None)
            self.stats.in_flight -= 1
            self._slot_free.set()  # a new job can start while this one is acked
        if handler.cancelled():
            await self._release(job, f"the worker stopped; the job ran past the {self.grace:g}s grace period")
            return
        error = handler.exception()
        try:
            if error is None:
                item = await self._acks.ack(job)
                if item.ok:
                    self.stats.done += 1
                    log.debug("job %d done", job.id)
                elif item.code == LeaseLost.code:
                    self._lost(job)
                else:
                    log.error("job %d: could not ack it: %s", job.id, item.code)
                return
            answer = await self.client.nack(job, describe(error))
            self.stats.failed += 1
            log.warning(
                "job %d failed (attempt %d of %d, now %s): %s",
                job.id,
                job.attempts,
                job.max_attempts,
                answer.status,
                describe(error).splitlines()[0],
            )
        except LeaseLost:
            self._lost(job)
        except JobqError as exc:
            # It comes back by itself when its lease expires.
            log.error("job %d: could not %s it: %s", job.id, "ack" if error is None else "nack", exc.detail)

    def _lost(self, job: LeasedJob) -> None:
        self.stats.lost += 1
        log.warning("job %d: the lease had moved on, another worker has the job", job.id)

    def _start(self, job: LeasedJob) -> asyncio.Future[Any]:
        if self._async:
            return asyncio.ensure_future(self.handler(job))
        return _in_thread(self.handler, job)

    async def _keep_leased(self, job: LeasedJob, leased_at: float, visibility_timeout: float) -> None:
        """Extend the lease every half visibility timeout while the handler runs. Times are counted from
        before the request that set the deadline, so the deadline is never later than we think."""
        due = leased_at + visibility_timeout / 2
        while True:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            sent = time.monotonic()
            try:
                await self.client.extend(job, visibility_timeout)
            except LeaseLost:
                log.warning("job %d: lease lost while running (the worker was too slow to extend it)", job.id)
                return
            except JobqError as exc:
                log.warning("job %d: could not extend the lease: %s", job.id, exc.detail)
                due = time.monotonic() + min(1.0, visibility_timeout / 10)
                continue
            log.debug("job %d: lease extended by %gs", job.id, visibility_timeout)
            due = sent + visibility_timeout / 2

    async def _give_back(self, job: LeasedJob) -> None:
        """A job leased but never started: back to pending at once, its attempt not counted."""
        try:
            (result,) = await self.client.release([job])
        except JobqError as exc:
            log.error(
                "job %d: could not give it back (%s); it comes back when its lease expires", job.id, exc
            )
            return
        if result.ok:
            self.stats.released += 1
            log.info("job %d given back: the worker stopped before starting it", job.id)
        else:
            self.stats.lost += 1

    async def _release(self, job: LeasedJob, why: str) -> None:
        try:
            await self.client.nack(job, f"released: {why}", retry_after=0)
            self.stats.released += 1
            log.warning("job %d released: %s", job.id, why)
        except LeaseLost:
            self.stats.lost += 1
        except JobqError as exc:
            log.error("job %d: could not release it (%s); it comes back when its lease expires", job.id, exc)


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
