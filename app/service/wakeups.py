"""Waking waiting long-polls: one LISTEN connection per process, and timers for jobs due later.

Every statement that makes jobs ready sends one NOTIFY per queue (see ``sql.CHANNEL``) with how many
jobs it made ready and the earliest ``run_at``. Each service process listens on one connection of its own
(waiting requests hold none) and, per notification:

- wakes up to ``n`` of that queue's waiters, oldest first, so one ready job does not send every waiter to
  the database; a waiter woken while it was claiming jobs anyway passes the wake-up on;
- or, for jobs due later (delays, retries with backoff), arms a timer for the queue's earliest ``run_at``
  (database clock, corrected by the offset measured at connect) and wakes waiters when it fires.

A slow safety poll (``safety_interval``) lets one waiter per queue look anyway, for anything a
notification cannot describe exactly (later run_ats inside one batch). When the listener loses its
connection it reconnects and then wakes every waiter, since anything may have become ready meanwhile.

A wake-up is spent only by a waiter that looks for jobs because of it. One that leaves instead (its
client went away, the service is closing) hands it to the next waiter of its queue; and a long-poll
watches its client while it waits (app/service/leasing.py ``lease``), so a departed one leaves at once rather
than being woken first.

Waiting for a job to finish (``GET /jobs/{id}?wait=N``) is woken the same way, on a channel of its own
(``sql.DONE_CHANNEL``): statements that finish a job someone marked as awaited name it there, and
every waiter of that job in this process is woken, to read it and answer. Nothing polls: after a lost
connection every job waiter is woken too, to look once.

Everything kept here is bounded: a queue's entry in ``_waiters`` goes with its last waiter, ``_due`` and
``_timers`` hold only queues that notifications named (queues with jobs), and at most ``max_waiters``
long-polls wait at once (``long_poll``).
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import asyncpg

from app.core.errors import Unavailable
from app.db.sql import CHANNEL, DONE_CHANNEL

log = logging.getLogger("jobq.wakeups")

# Most future run_ats remembered per queue; beyond that the safety poll finds them.
MAX_DUE_PER_QUEUE = 10_000
# Seconds a long-poll refused for max_waiters is told to wait before trying again.
RETRY_AFTER_FULL = 1
# Fire timers a little after run_at, so a waiter does not look a hair before the job is due.
TIMER_SLACK = 0.002


class Waiter:
    """One waiting request. Small, since thousands may wait at once: a future made only when it waits,
    and a timer handle rather than a task for its timeout."""

    __slots__ = ("_future", "woken", "used")

    def __init__(self) -> None:
        self._future: asyncio.Future[None] | None = None
        self.woken = False  # someone woke this waiter
        self.used = False  # and it acted on it (looked for jobs again): set by the one waiting

    def wake(self) -> None:
        self.woken = True
        self._end()

    def _end(self, _: object = None) -> None:
        if self._future is not None and not self._future.done():
            self._future.set_result(None)

    async def wait(self, timeout: float, gone: asyncio.Future | None = None) -> None:
        """Until woken, `timeout` seconds pass, or `gone` (the client's departure) completes."""
        if self.woken or timeout <= 0 or (gone is not None and gone.done()):
            return
        loop = asyncio.get_running_loop()
        self._future = loop.create_future()
        timer = loop.call_later(timeout, self._end)
        if gone is not None:
            gone.add_done_callback(self._end)
        try:
            await self._future
        finally:
            timer.cancel()
            if gone is not None:
                gone.remove_done_callback(self._end)
            self._future = None


class Wakeups:
    def __init__(
        self,
        dsn: str,
        *,
        safety_interval: float = 5.0,
        health_interval: float = 10.0,
        reconnect_interval: float = 0.5,
        max_waiters: int = 10_000,
    ) -> None:
        self._dsn = dsn
        self.safety_interval = safety_interval  # seconds between safety looks per waiting queue
        self.health_interval = health_interval  # seconds between pings of the listening connection
        self.reconnect_interval = reconnect_interval  # first retry delay when the listener is down
        self.max_waiters = max_waiters  # long-polls waiting at once, at most
        self.long_polls = 0  # long-polls holding a place now (see long_poll)
        self._waiters: dict[str, dict[Waiter, None]] = {}  # per queue, oldest first
        # Per job id, those waiting for it to finish; per "w<id>", those waiting for a workflow.
        self._watchers: dict[int | str, dict[Waiter, None]] = {}
        self.watchers = 0  # requests waiting for a job to finish now, all jobs
        self._count = 0  # waiters registered, all queues
        self._due: dict[str, list[tuple[float, int]]] = {}  # per queue, a heap of (loop time, n)
        # Per queue: the armed timer and the loop time it fires at (kept beside it: uvloop's call_at of a
        # time already past returns a plain Handle, which has no when()).
        self._timers: dict[str, tuple[asyncio.Handle, float]] = {}
        self._clock_offset = 0.0  # database clock minus this machine's, seconds
        self._closing = False
        self._tasks: list[asyncio.Task] = []
        self.listening = asyncio.Event()
        self._tried = asyncio.Event()  # the listener has connected, or failed to, at least once
        self.reconnects = 0  # times the listening connection was lost and made again
        self.wakes = 0  # waiters woken, all causes
        # Called with a queue whose flow-control settings changed, or None for every queue (the listener
        # reconnected, so a change may have gone unheard): app/main.py passes the cache's forget.
        self.on_settings: Callable[[str | None], None] = lambda queue: None

    # --- life cycle ------------------------------------------------------------------------------------

    async def start(self, connect_timeout: float = 10.0) -> None:
        self._loop = asyncio.get_running_loop()
        self._tasks = [
            asyncio.create_task(self._listen_forever(), name="jobq-listener"),
            asyncio.create_task(self._safety_poll(), name="jobq-safety-poll"),
        ]
        # Until the listener is connected, or its first try has failed: a service whose LISTEN connection
        # cannot be made serves at once, its long-polls woken by the safety poll meanwhile.
        try:
            await asyncio.wait_for(self._tried.wait(), connect_timeout)
        except TimeoutError:
            pass
        if not self.listening.is_set():
            log.warning("listener not connected yet; waiters fall back on the safety poll meanwhile")

    def shutdown(self) -> None:
        """Stop: answer every waiter now, and let no request wait again."""
        self._closing = True
        self._wake_all()

    async def close(self) -> None:
        self.shutdown()
        for timer, _ in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    @property
    def closing(self) -> bool:
        return self._closing

    # --- waiting ---------------------------------------------------------------------------------------

    @contextmanager
    def long_poll(self) -> Iterator[None]:
        """One long-poll's place among the process's `max_waiters`, held for the whole of its wait: a
        waiting lease, SQS receive or wait for a job.

        Each holds a socket, a task and some memory, so past the cap a client is told to come back (503,
        Retry-After) rather than let in, before any work, while calls that do not wait go on.
        """
        if self.long_polls >= self.max_waiters:
            raise Unavailable(
                f"this service process already holds {self.max_waiters} waiting long-polls"
                " (JOBQ_MAX_WAITERS); retry after the Retry-After seconds, call with wait 0, or"
                " spread clients over more replicas",
                retry_after=RETRY_AFTER_FULL,
                nothing_done=True,  # refused before any work: safe to send again (app/core/errors.py)
            )
        self.long_polls += 1
        try:
            yield
        finally:
            self.long_polls -= 1

    @contextmanager
    def waiting(self, queue: str) -> Iterator[Waiter]:
        """Register a waiter for `queue` for the duration of the block.

        Register *before* looking for jobs: a wake-up that arrives while the look is under way is then
        kept, not lost. A wake-up the waiter did not act on (its look found jobs, or it left without
        looking again, which it marks by leaving `used` unset) is passed on to the next waiter.
        """
        waiter = Waiter()
        self._waiters.setdefault(queue, {})[waiter] = None
        self._count += 1
        try:
            yield waiter
        finally:
            waiters = self._waiters.get(queue)
            if waiters is not None and waiter in waiters:  # not woken meanwhile
                del waiters[waiter]
                self._count -= 1
                if not waiters:
                    del self._waiters[queue]
            if waiter.woken and not waiter.used and not self._closing:
                self._wake(queue, 1)

    @contextmanager
    def watching(self, job_id: int | str) -> Iterator[Waiter]:
        """Register a waiter for job `job_id` to finish, for the duration of the block; register before
        marking the job awaited (sql.WATCH_JOB), so a finish that commits meanwhile is not missed. A
        workflow's waiter watches `w<id>`: each end of one of its jobs notifies that (jobq.job_ending())."""
        waiter = Waiter()
        self._watchers.setdefault(job_id, {})[waiter] = None
        self.watchers += 1
        try:
            yield waiter
        finally:
            self.watchers -= 1
            watchers = self._watchers.get(job_id)
            if watchers is not None:
                watchers.pop(waiter, None)
                if not watchers:
                    del self._watchers[job_id]

    def waiter_count(self) -> int:
        """Waiters registered now, all queues (safe to read from another thread)."""
        return self._count

    def _wake(self, queue: str, n: int) -> None:
        waiters = self._waiters.get(queue)
        while waiters and n > 0:
            waiter = next(iter(waiters))
            del waiters[waiter]
            self._count -= 1
            waiter.wake()
            self.wakes += 1
            n -= 1
        if waiters is not None and not waiters:
            del self._waiters[queue]

    def _wake_all(self) -> None:
        for queue in list(self._waiters):
            self._wake(queue, len(self._waiters.get(queue, ())))
        for job_id in list(self._watchers):
            self._wake_watchers(job_id)

    def _wake_watchers(self, job_id: int | str) -> None:
        for waiter in self._watchers.pop(job_id, ()):
            waiter.wake()
            self.wakes += 1

    # --- notifications and timers ----------------------------------------------------------------------

    def _on_notify(self, conn: object, pid: int, channel: str, payload: str) -> None:
        try:
            message = json.loads(payload)
            queue, n, run_at = str(message["queue"]), int(message["n"]), float(message["run_at"])
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring a malformed notification: %r", payload[:200])
            return
        if message.get("settings"):
            # A queue's flow-control settings changed (sql.SET_FLOW): read them again.
            self.on_settings(queue)
        delay = run_at - (time.time() + self._clock_offset)
        if delay <= 0:
            self._wake(queue, n)
        else:
            self._schedule(queue, self._loop.time() + delay + TIMER_SLACK, n)

    def _on_done(self, conn: object, pid: int, channel: str, payload: str) -> None:
        if payload.startswith("w"):  # a job of that workflow ended
            self._wake_watchers(payload)
            return
        try:
            job_id = int(payload)
        except ValueError:
            log.warning("ignoring a malformed notification: %r", payload[:200])
            return
        self._wake_watchers(job_id)

    def wake_in(self, queue: str, delay: float, n: int) -> None:
        """Wake up to n of the queue's waiters `delay` seconds from now (a claim under flow control that
        knows when a job may go: app/service/leasing.py)."""
        self._schedule(queue, self._loop.time() + delay, n)

    def _schedule(self, queue: str, when: float, n: int) -> None:
        due = self._due.setdefault(queue, [])
        if len(due) >= MAX_DUE_PER_QUEUE and when >= due[0][0]:
            return
        heapq.heappush(due, (when, n))
        self._arm(queue)

    def _arm(self, queue: str) -> None:
        due = self._due.get(queue)
        armed = self._timers.get(queue)
        if not due:
            self._due.pop(queue, None)
            return
        if armed is not None:
            timer, when = armed
            if when <= due[0][0]:
                return
            timer.cancel()
        self._timers[queue] = (self._loop.call_at(due[0][0], self._fire, queue), due[0][0])

    def _fire(self, queue: str) -> None:
        self._timers.pop(queue, None)
        due = self._due.get(queue, [])
        now, n = self._loop.time(), 0
        while due and due[0][0] <= now:
            n += heapq.heappop(due)[1]
        if n:
            self._wake(queue, n)
        self._arm(queue)

    # --- background ------------------------------------------------------------------------------------

    async def _listen_forever(self) -> None:
        delay = self.reconnect_interval
        while not self._closing:
            try:
                conn = await asyncpg.connect(
                    self._dsn, timeout=5, server_settings={"application_name": "jobq-listener"}
                )
            except Exception as exc:  # noqa: BLE001 - any failure to connect: wait and retry
                self._tried.set()
                log.warning("listener cannot connect (%r); retrying in %.1f s", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            delay = self.reconnect_interval
            lost = asyncio.Event()
            conn.add_termination_listener(lambda _conn: lost.set())
            try:
                await conn.add_listener(CHANNEL, self._on_notify)
                await conn.add_listener(DONE_CHANNEL, self._on_done)
                database_now = await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())::float8")
                self._clock_offset = database_now - time.time()
                if self.reconnects:
                    log.info("listener reconnected")
                self.listening.set()
                self._tried.set()
                # Jobs may have become ready, and settings changed, while nobody listened: let every
                # waiter look, under settings read again.
                self.on_settings(None)
                self._wake_all()
                while not lost.is_set():
                    try:
                        await asyncio.wait_for(lost.wait(), self.health_interval)
                    except TimeoutError:
                        await conn.execute("SELECT 1", timeout=5)  # finds a silently dead connection
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the connection broke: reconnect
                log.warning("listener connection failed (%r)", exc)
            finally:
                self.listening.clear()
                conn.terminate()
            if not self._closing:
                self.reconnects += 1
                log.warning("listener connection lost; reconnecting")

    async def _safety_poll(self) -> None:
        while True:
            await asyncio.sleep(self.safety_interval)
            for queue in list(self._waiters):
                self._wake(queue, 1)
