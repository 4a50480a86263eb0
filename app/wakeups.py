"""Waking waiting long-polls: one LISTEN connection per process, and timers for jobs due later.

Every statement that makes jobs ready sends one NOTIFY per queue (see ``queries.CHANNEL``) with how many
jobs it made ready and the earliest ``run_at``. Each service process listens on one connection of its own
(waiting requests hold none) and, per notification:

- wakes up to ``n`` of that queue's waiters, oldest first, so one ready job does not send every waiter to
  the database; a waiter woken while it was claiming jobs anyway passes the wake-up on;
- or, for jobs due later (delays, retries with backoff), arms a timer for the queue's earliest ``run_at``
  (database clock, corrected by the offset measured at connect) and wakes waiters when it fires.

A slow safety poll (``safety_interval``) lets one waiter per queue look anyway, for anything a
notification cannot describe exactly (later run_ats inside one batch). When the listener loses its
connection it reconnects and then wakes every waiter, since anything may have become ready meanwhile.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

import asyncpg

from app.queries import CHANNEL

log = logging.getLogger("jobq.wakeups")

# Most future run_ats remembered per queue; beyond that the safety poll finds them.
MAX_DUE_PER_QUEUE = 10_000
# Fire timers a little after run_at, so a waiter does not look a hair before the job is due.
TIMER_SLACK = 0.002


class Waiter:
    __slots__ = ("_event", "woken", "used")

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.woken = False  # someone woke this waiter
        self.used = False  # and it acted on it (looked for jobs again)

    def wake(self) -> None:
        self.woken = True
        self._event.set()

    async def wait(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except TimeoutError:
            pass
        self.used = self.woken


class Wakeups:
    def __init__(
        self,
        dsn: str,
        *,
        safety_interval: float = 5.0,
        health_interval: float = 10.0,
        reconnect_interval: float = 0.5,
    ) -> None:
        self._dsn = dsn
        self.safety_interval = safety_interval  # seconds between safety looks per waiting queue
        self.health_interval = health_interval  # seconds between pings of the listening connection
        self.reconnect_interval = reconnect_interval  # first retry delay when the listener is down
        self._waiters: dict[str, dict[Waiter, None]] = {}  # per queue, oldest first
        self._due: dict[str, list[tuple[float, int]]] = {}  # per queue, a heap of (loop time, n)
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._clock_offset = 0.0  # database clock minus this machine's, seconds
        self._closing = False
        self._tasks: list[asyncio.Task] = []
        self.listening = asyncio.Event()
        self.reconnects = 0  # times the listening connection was lost and made again
        self.wakes = 0  # waiters woken, all causes

    # --- life cycle ------------------------------------------------------------------------------------

    async def start(self, connect_timeout: float = 10.0) -> None:
        self._loop = asyncio.get_running_loop()
        self._tasks = [
            asyncio.create_task(self._listen_forever(), name="jobq-listener"),
            asyncio.create_task(self._safety_poll(), name="jobq-safety-poll"),
        ]
        try:
            await asyncio.wait_for(self.listening.wait(), connect_timeout)
        except TimeoutError:
            log.warning("listener not connected yet; waiters fall back on the safety poll meanwhile")

    def shutdown(self) -> None:
        """Stop: answer every waiter now, and let no request wait again."""
        self._closing = True
        for queue in list(self._waiters):
            self._wake(queue, len(self._waiters.get(queue, ())))

    async def close(self) -> None:
        self.shutdown()
        for timer in self._timers.values():
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
    def waiting(self, queue: str) -> Iterator[Waiter]:
        """Register a waiter for `queue` for the duration of the block.

        Register *before* looking for jobs: a wake-up that arrives while the look is under way is then
        kept, not lost. A wake-up the waiter did not need (its look found jobs) is passed on.
        """
        waiter = Waiter()
        self._waiters.setdefault(queue, {})[waiter] = None
        try:
            yield waiter
        finally:
            waiters = self._waiters.get(queue)
            if waiters is not None:
                waiters.pop(waiter, None)
                if not waiters:
                    del self._waiters[queue]
            if waiter.woken and not waiter.used and not self._closing:
                self._wake(queue, 1)

    def waiter_count(self) -> int:
        return sum(len(w) for w in self._waiters.values())

    def _wake(self, queue: str, n: int) -> None:
        waiters = self._waiters.get(queue)
        while waiters and n > 0:
            waiter = next(iter(waiters))
            del waiters[waiter]
            waiter.wake()
            self.wakes += 1
            n -= 1
        if waiters is not None and not waiters:
            del self._waiters[queue]

    def _wake_all(self) -> None:
        for queue in list(self._waiters):
            self._wake(queue, len(self._waiters.get(queue, ())))

    # --- notifications and timers ----------------------------------------------------------------------

    def _on_notify(self, conn: object, pid: int, channel: str, payload: str) -> None:
        try:
            message = json.loads(payload)
            queue, n, run_at = str(message["queue"]), int(message["n"]), float(message["run_at"])
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring a malformed notification: %r", payload[:200])
            return
        delay = run_at - (time.time() + self._clock_offset)
        if delay <= 0:
            self._wake(queue, n)
        else:
            self._schedule(queue, self._loop.time() + delay + TIMER_SLACK, n)

    def _schedule(self, queue: str, when: float, n: int) -> None:
        due = self._due.setdefault(queue, [])
        if len(due) >= MAX_DUE_PER_QUEUE and when >= due[0][0]:
            return
        heapq.heappush(due, (when, n))
        self._arm(queue)

    def _arm(self, queue: str) -> None:
        due = self._due.get(queue)
        timer = self._timers.get(queue)
        if not due:
            self._due.pop(queue, None)
            return
        if timer is not None:
            if timer.when() <= due[0][0]:
                return
            timer.cancel()
        self._timers[queue] = self._loop.call_at(due[0][0], self._fire, queue)

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
                log.warning("listener cannot connect (%r); retrying in %.1f s", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            delay = self.reconnect_interval
            lost = asyncio.Event()
            conn.add_termination_listener(lambda _conn: lost.set())
            try:
                await conn.add_listener(CHANNEL, self._on_notify)
                database_now = await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())::float8")
                self._clock_offset = database_now - time.time()
                if self.reconnects:
                    log.info("listener reconnected")
                self.listening.set()
                # Jobs may have become ready while nobody listened: let every waiter look.
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
