"""The pusher: on every replica, the worker of each queue with a push target (app/service/push.py).

It reads the targets at start, whenever a queue's settings change on any replica (the notification
every replica gets, app/service/wakeups.py) and every REFRESH seconds, and runs one task per target.
That task claims as many of the queue's jobs as its `concurrency` leaves room for (across replicas: the
claim counts the queue's deliveries in flight under the queue's push lock), starts a delivery for each, and
waits as a long-poll does: woken by the notification of new ready jobs, at a delayed job's run_at, or
when a delivery of its own ends and frees a slot. Each delivery ends its job's lease by what the
endpoint answered.

Stopping (`stop`): no more claims; deliveries in flight get JOBQ_PUSH_STOP_GRACE seconds to be answered
and ended, then the rest are cancelled and their jobs given back, their attempts not counted. A replica
killed outright leaves leases that expire (the target's timeout plus push.LEASE_SLACK), and their jobs
are delivered again, with the same `webhook-id`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from app.core.errors import DATABASE_UNAVAILABLE
from app.service import outbound, push
from app.service.rows import Row
from app.service.runtime import Runtime
from app.telemetry import tracing

log = logging.getLogger("jobq.push")

# Seconds between reads of the targets beside those a notification asks for (a change missed while the
# listener reconnected is read then at the latest).
REFRESH = 10.0
# A busy queue's task claims once this many of its slots are free (half of a smaller concurrency), or
# GATHER seconds after the first was. At concurrency 64, claiming at 8 free rather than at 32 drained a
# no-op endpoint's backlog 28 % faster (slots waited less for their claim); at 16 it is the same.
CLAIM_AT = 8
GATHER = 0.005
# Seconds a queue's task waits after its claim failed (the database unavailable) before it claims again.
FAILED_RETRY = 1.0
# Seconds a queue's task waits for the targets to be read again after its claim found the queue's target
# changed (the read wakes it before then).
STALE_WAIT = 1.0


class Pusher:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.worker = push.worker_id()
        self.targets: dict[str, push.PushTarget] = {}
        self._tasks: dict[str, asyncio.Task] = {}  # per queue, its claiming task
        self._flights: dict[str, set[asyncio.Task]] = {}  # per queue, its deliveries in flight
        self._freed: dict[str, asyncio.Event] = {}  # per queue, set when a delivery ends
        self._passed: dict[str, str] = {}  # queues whose URL this replica does not admit, and why
        self._stale = asyncio.Event()  # the targets want reading again
        self._client = outbound.Client()
        self._main: asyncio.Task | None = None

    def start(self) -> None:
        self._main = asyncio.create_task(self._run(), name="jobq-pusher")

    def settings_changed(self, queue: str | None) -> None:
        """A queue's settings changed (None: any may have): read the targets again."""
        self._stale.set()

    async def _run(self) -> None:
        while True:
            self._stale.clear()
            try:
                found, passed = await push.targets(self.runtime.db, self.runtime.settings)
                self._apply(found)
                self._say_passed(passed)
            except asyncio.CancelledError:
                raise
            except DATABASE_UNAVAILABLE as exc:
                log.warning("push targets: database unavailable (%r)", exc)
            except Exception:
                log.exception("push targets not read")
            try:
                await asyncio.wait_for(self._stale.wait(), REFRESH)
            except TimeoutError:
                pass

    def _apply(self, targets: dict[str, push.PushTarget]) -> None:
        """Serve the queues of `targets` (under their new settings), and stop serving the others."""
        self.targets = targets
        for queue in targets:
            if queue not in self._tasks or self._tasks[queue].done():
                self._freed[queue] = asyncio.Event()
                self._flights.setdefault(queue, set())
                self._tasks[queue] = asyncio.create_task(self._serve(queue), name=f"jobq-push-{queue}")
        # Woken, so that a new timeout or concurrency applies at once, and the task of a queue no longer
        # pushed sees so and ends (not cancelled: a claim it is running commits or rolls back whole, and
        # its deliveries in flight finish).
        for event in self._freed.values():
            event.set()

    def _say_passed(self, passed: dict[str, str]) -> None:
        """Warn of each queue this replica leaves to the others, once (again after its reason changed)."""
        for queue, why in passed.items():
            if self._passed.get(queue) != why:
                log.warning("push %s: not delivered by this replica: %s", queue, why)
        self._passed = passed

    async def _serve(self, queue: str) -> None:
        wakeups = self.runtime.wakeups
        flights = self._flights[queue]
        freed = self._freed[queue]
        loop = asyncio.get_running_loop()
        gathering: float | None = None  # since when slots have been gathered for the next claim
        while not wakeups.closing:
            target = self.targets.get(queue)
            if target is None:
                return
            room = target.concurrency - len(flights)
            if room <= 0 or (flights and room < min(target.concurrency // 2, CLAIM_AT)):
                # Busy: claim once CLAIM_AT slots are free (half of a smaller concurrency), or GATHER
                # seconds after the first was, so that a claim (a transaction under the queue's push lock)
                # serves several deliveries, while a large concurrency keeps its slots busy.
                gathering = gathering or loop.time()
                left = None if room <= 0 else gathering + GATHER - loop.time()
                if left is None or left > 0:
                    freed.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(freed.wait(), left)
                    continue
            gathering = None
            with wakeups.waiting(queue) as waiter:
                freed.clear()
                try:
                    claim = await push.claim(self.runtime, target, room, self.worker)
                except asyncio.CancelledError:
                    raise
                except DATABASE_UNAVAILABLE as exc:
                    log.warning("push %s: database unavailable (%r)", queue, exc)
                    await asyncio.sleep(FAILED_RETRY)
                    continue
                except Exception:
                    log.exception("push %s: claim failed", queue)
                    await asyncio.sleep(FAILED_RETRY)
                    continue
                if claim.stale:  # the queue's target changed under this replica: read the targets again
                    self.settings_changed(queue)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(freed.wait(), STALE_WAIT)  # set once they are read
                    continue
                for job in claim.jobs:
                    self._launch(target, job)
                if claim.jobs:
                    continue  # and the wake-up, if any, goes on to the next waiter
                idle = claim.wait if claim.wait is not None else wakeups.safety_interval
                await _first(waiter.wait(idle), freed)
                waiter.used = waiter.woken

    def _launch(self, target: push.PushTarget, job: Row) -> None:
        flights = self._flights[target.queue]
        task = asyncio.create_task(self._deliver(target, job), name=f"jobq-push-{target.queue}-{job['id']}")
        flights.add(task)
        gauge = self.runtime.metrics.push_in_flight.labels(target.queue)
        gauge.inc()

        def ended(task: asyncio.Task) -> None:
            flights.discard(task)
            gauge.dec()
            freed = self._freed.get(target.queue)
            if freed is not None:
                freed.set()

        task.add_done_callback(ended)

    async def _deliver(self, target: push.PushTarget, job: Row) -> None:
        started, began = time.perf_counter(), time.time_ns()
        try:
            outcome = await push.deliver(self._client, target, job, self.runtime.settings.max_result_bytes)
        except asyncio.CancelledError:
            # The replica is stopping and the grace is over: the job goes back, its attempt not counted.
            outcome = push.Outcome("released", None, time.perf_counter() - started, "the replica stopped")
        self.runtime.metrics.pushed(target.queue, outcome.outcome, outcome.seconds)
        attributes: dict[str, str | int] = {"url.full": target.url, "jobq.push.outcome": outcome.outcome}
        if outcome.status is not None:
            attributes["http.response.status_code"] = outcome.status
        tracing.record("push", [job], began, attributes)
        try:
            await push.finish(self.runtime, target, job, outcome)
        except DATABASE_UNAVAILABLE as exc:
            # Its lease expires, and the job is delivered again.
            log.warning("push %s: job %s not ended: database unavailable (%r)", target.queue, job["id"], exc)
        except Exception:
            log.exception("push %s: job %s not ended", target.queue, job["id"])

    async def stop(self, grace: float) -> None:
        """Claim no more; give the deliveries in flight `grace` seconds, then give their jobs back."""
        tasks = [task for task in (self._main, *self._tasks.values()) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        flights = [task for queued in self._flights.values() for task in queued]
        if flights:
            done, pending = await asyncio.wait(flights, timeout=grace)
            for task in pending:
                task.cancel()
            if pending:
                log.info("push: %d deliveries in flight given back as the replica stops", len(pending))
                await asyncio.wait(pending, timeout=5.0)
        self._client.close()


async def _first(*waits: object) -> None:
    """Until the first of `waits` (a coroutine, or an Event to be set) is done; the others are dropped."""
    tasks = [
        asyncio.ensure_future(w.wait() if isinstance(w, asyncio.Event) else w)  # type: ignore[arg-type]
        for w in waits
    ]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
