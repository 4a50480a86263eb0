"""Leasing: a worker claims up to `max_jobs` of a queue's ready jobs, at once or by long-poll, each under a
fresh lease token that fences whatever it does with the job next (app/service/workers.py). Concurrent
leases of one queue share their claim statements (LEASES, app/service/coalesce.py); a queue under flow
control is claimed by app/service/flow.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from app.db import sql as q
from app.db.pool import Database
from app.service.arguments import JobLease
from app.service.coalesce import Shared
from app.service.flow import BUSY_RETRY, FlowClaim, lease_flow, queue_flow
from app.service.parents import attach_parents
from app.service.rows import Row, as_job
from app.service.runtime import Runtime
from app.service.wakeups import Wakeups
from app.service.workers import release
from app.telemetry import tracing


@dataclass(frozen=True, slots=True)
class LeaseCall:
    """One caller's share of a shared LEASE statement."""

    max_jobs: int
    visibility_timeout: float | None
    worker_id: str | None
    per_key: int = 1


async def lease(
    runtime: Runtime,
    *,
    queue: str,
    max_jobs: int,
    visibility_timeout: float | None,
    wait: float,
    worker_id: str | None,
    disconnected: Callable[[], Awaitable[object]] | None = None,
    per_key: int = 1,
) -> list[Row]:
    """Lease up to max_jobs ready jobs of the queue; with `wait`, long-poll until some are leased or
    `wait` seconds pass. No connection is held while waiting.

    Concurrent calls on one queue share LEASE statements (see _lease_shared). `disconnected` returns once
    the client has gone (app/http/web.py): a long-poll watches it while it waits and leaves at once, so
    wake-ups go to waiters still listening; it leases nothing more, and hands back what it leased for a
    client that left meanwhile. Once the service is shutting down, nothing is leased. At most
    `max_waiters` long-polls wait at once (app/service/wakeups.py); past that a long-poll is refused with
    Unavailable (503, Retry-After) before any work, while short leases (`wait` 0) go on.

    `per_key` > 1: up to that many consecutive jobs of a key whose jobs run in order (key_concurrency 1)
    in this one lease, the key held until all of them end (SQS's FIFO receives). Such a call claims alone,
    never sharing a statement, so that a key's jobs go to one caller.
    """
    call = LeaseCall(max_jobs, visibility_timeout, worker_id, min(per_key, max_jobs))
    wakeups = runtime.wakeups
    if wakeups.closing:
        return []
    if wait <= 0:
        leased = await _lease_now(runtime, queue, call)
        runtime.sightings.saw(worker_id, queue, len(leased))
        return leased
    runtime.sightings.saw(worker_id, queue, 0)  # seen as it starts waiting, not only once it gets a job
    with wakeups.long_poll():
        gone = asyncio.ensure_future(disconnected()) if disconnected is not None else None
        try:
            leased = await _long_poll(runtime, queue, call, wait, gone)
            if leased and gone is not None and gone.done():
                # Its client left meanwhile: nobody to deliver to.
                await _release_undelivered(runtime.db, leased)
                return []
        finally:
            if gone is not None:
                gone.cancel()
    runtime.sightings.saw(worker_id, queue, len(leased))
    return leased


async def _long_poll(
    runtime: Runtime, queue: str, call: LeaseCall, wait: float, gone: asyncio.Future | None
) -> list[Row]:
    """Lease, and wait for a wake-up while nothing is leased, until `wait` seconds pass or the client
    goes (`gone` completes). A wake-up this waiter does not act on is passed on (see Wakeups.waiting)."""
    deadline = time.monotonic() + wait
    wakeups = runtime.wakeups
    while True:
        with wakeups.waiting(queue) as waiter:
            leased = await _lease_now(runtime, queue, call)
            remaining = deadline - time.monotonic()
            if leased or remaining <= 0:
                return leased
            await waiter.wait(remaining, gone)
            if wakeups.closing or (gone is not None and gone.done()):
                return []  # leaves without looking again: a wake-up it got goes to the next waiter
            waiter.used = waiter.woken  # it looks again, next time round


def _lease_now(runtime: Runtime, queue: str, call: LeaseCall) -> Awaitable[list[Row]]:
    """The jobs one LEASE statement leases for `call`, a statement it may share with other calls of the
    queue (LEASES), unless it takes several jobs of a key (`per_key`)."""
    if call.per_key > 1:
        return _lease_alone(runtime, queue, call)
    return runtime.coalescing.submit(LEASES, call, queue)


async def _lease_alone(runtime: Runtime, queue: str, call: LeaseCall) -> list[Row]:
    (leased,) = await _lease_shared(runtime, queue, [call])
    return leased


async def _lease_shared(runtime: Runtime, queue: str, calls: list[LeaseCall]) -> list[list[Row]]:
    """One LEASE statement for several calls (LEASE_FLOW for a queue under flow control): each call owns
    max_jobs consecutive slots."""
    owner, timeouts, workers = [], [], []
    for k, call in enumerate(calls):
        owner += [k] * call.max_jobs
        timeouts += [call.visibility_timeout] * call.max_jobs
        workers += [call.worker_id] * call.max_jobs
    flow = await queue_flow(runtime, queue)
    started, began = time.perf_counter(), time.time_ns()
    if flow.flow:
        per_key = calls[0].per_key if len(calls) == 1 else 1
        claim = await lease_flow(runtime, queue, flow, timeouts, workers, per_key)
        rows, slots = claim.rows, claim.slots
        if len(rows) < len(workers):
            _wake_later(runtime.wakeups, queue, claim)
    else:
        async with runtime.db.acquire() as conn:
            rows = await conn.fetch(
                q.LEASE.text, *q.LEASE.args(queue=queue, visibility_timeouts=timeouts, worker_ids=workers)
            )
        slots = [row["slot"] for row in rows]
    runtime.metrics.claimed(queue, time.perf_counter() - started, len(rows))
    tracing.record("lease", rows, began)
    shares: list[list[tuple[int, Row]]] = [[] for _ in calls]
    jobs = [as_job(row) for row in rows]
    await attach_parents(runtime.db, jobs)
    for slot, job in zip(slots, jobs, strict=True):
        shares[owner[slot - 1]].append((slot, job))
    return [[job for _, job in sorted(share, key=lambda pair: pair[0])] for share in shares]


def _wake_later(wakeups: Wakeups, queue: str, claim: FlowClaim) -> None:
    """After a claim under flow control that left slots empty: wake the queue's long-polls when a rate
    window lets a job go, or at once if keys were passed over because another claim held them (it
    commits in a moment). A slot a running job frees wakes them by notification (sql.KEY_FREED)."""
    if claim.busy:
        wakeups.wake_in(queue, BUSY_RETRY, 1)
    if claim.wake_in is not None:
        wakeups.wake_in(queue, max(claim.wake_in, 0.0), 1)


async def _release_orphans(runtime: Runtime, orphans: list[list[Row]]) -> None:
    """Hand back what a shared LEASE leased for callers that left while it ran."""
    await _release_undelivered(runtime.db, [job for share in orphans for job in share])


def _slots(call: LeaseCall) -> int:
    return call.max_jobs


# Per queue, and only while calls are in it: queue names come from clients (see Shared). A call counts for
# its max_jobs towards the statement's 1,000 jobs (MAX_SHARED).
LEASES = Shared("lease", _lease_shared, per_key=True, size=_slots, orphaned=_release_orphans)


async def _release_undelivered(db: Database, leased: list[Row]) -> None:
    """Hand back jobs that were leased but never delivered (their attempt is not counted)."""
    if leased:
        await release(db, [JobLease(j["id"], j["lease_token"]) for j in leased])
