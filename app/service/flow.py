"""Keyed flow control: per-key concurrency and order, fair turns across keys, and rate limits, enforced by
the claim itself (app/db/sql/claim.py, "flow control"), plus the per-key view and overrides.

The model. A job may carry a `key` (a tenant, a customer, an SQS MessageGroupId). A queue's settings
(`PATCH /queues/{queue}`), all off by default:
- `key_concurrency`: at most this many jobs of one key running at once, across every replica. A slot is
  a running job: whatever ends the lease (ack, nack, expiry, release, dead) frees it by changing the job,
  exactly once. With 1 the key's jobs also run in order (priority, run_at, id among ready jobs), and a job
  waiting for its retry holds the key until it has run (SQS FIFO's message groups).
- `fair`: ready jobs are handed out across keys in turn, each claim going round the keys with pending
  jobs, one job of each per round, from the key after the last one the queue's last claim served (kept
  in the queue's row, `fair_last_key`, written by the claim: the turn goes on from one claim to the next
  on every replica, whatever the claims' sizes).
- `rate` / `key_rate` `{limit, period}`: at most `limit` leases of the queue / of each key in any window
  of `period` seconds (a sliding window, kept as the times and counts of the claims within it).
- Per-key overrides (`PUT /queues/{queue}/keys/{key}`): a key's own concurrency and rate.
Jobs without a key are not limited by key: in a queue under flow control they are taken from the front
of the queue only (among the first few ready jobs per slot of a claim; while none are found, looked for
twice a second), so such a queue should key its jobs.
Jobs of a queue with none of these settings are claimed by the plain LEASE, as before.

How a claim finds jobs. A queue under key concurrency alone (no `fair`, no rate) is claimed from its
front, in lease order across keys, as the plain LEASE claims (_claim_front): most keys have room most of
the time, and the front's jobs lie together. When the front is held (its keys full: one key's backlog
before the rest), and for `fair` queues and queues with a rate, a claim walks the keys (_claim): each key
once, from where the replica's last walk stopped (a `fair` queue: after the key last served), taking
each key's first ready jobs.

A replica knows which queues are under flow control from a small cache (``FlowQueues``,
app/service/flow_queues.py, kept by the process's Runtime), read from the queue's row on first use and
dropped whenever the settings change (a notification every replica gets, app/service/wakeups.py) or the
listener reconnects. The cache only picks the statement: the plain LEASE skips a queue under flow control,
and LEASE_FLOW one without, so a stale entry costs a wake-up, never a limit."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from dataclasses import dataclass

import asyncpg

from app.core.errors import NotFound
from app.db import sql as q
from app.db.pool import Database, transaction_with
from app.service.flow_queues import NO_FLOW, FlowQueues, QueueFlow
from app.service.rows import Row
from app.service.runtime import Runtime

# A claim looks at up to this many keys beyond what its slots need (keys another claim holds, full keys):
# fewer for a claim of few jobs, for which each key looked at is a good part of the cost.
KEY_SLACK = 16
# Jobs without a key a claim considers, per slot, from the front of the queue (and KEY_SLACK more); and
# seconds between such looks while none are found.
UNKEYED_LOOKAHEAD = 4
UNKEYED_INTERVAL = 0.5
# A walk of keys passes over at most this many times the keys it needs (keys other claims hold).
KEY_REACH = 4
# Seconds until a long-poll looks again after a claim found keys another claim held (it commits soon).
BUSY_RETRY = 0.005
# Seconds a queue's claims walk the keys, without looking at its front first, after a claim found the
# front mostly held by full keys.
FRONT_PAUSE = 1.0


async def queue_flow(runtime: Runtime, queue: str) -> QueueFlow:
    """The queue's flow settings, from the cache or its row."""
    known = runtime.flow.get(queue)
    if known is None:
        async with runtime.db.acquire() as conn:
            row = await conn.fetchrow(q.QUEUE_FLOW.text, *q.QUEUE_FLOW.args(queue=queue))
        known = NO_FLOW if row is None else QueueFlow(**row)
        runtime.flow.put(queue, known)
    return known


@dataclass(slots=True)
class FlowClaim:
    rows: list[asyncpg.Record]
    slots: list[int]  # each row's slot, 1-based, in the arrays of the claim's caller
    wake_in: float | None  # seconds until a rate window lets a job go, when one held jobs back
    busy: bool  # a key was passed over because another claim held it
    short: bool = False  # slots left empty where more may be found: by walking (on), see lease_flow


# Times a claim that came back short claims again: once the replica's other claims whose keys it passed
# over have committed, or at once when every key it walked to was locked (full, or without a ready job).
BUSY_ROUNDS = 3


async def lease_flow(
    runtime: Runtime,
    queue: str,
    flow: QueueFlow,
    timeouts: list[float | None],
    workers: list[str | None],
    per_key: int = 1,
) -> FlowClaim:
    """Claim up to one job per slot of a queue under flow control: from the front of the queue when it
    has neither `fair` nor a rate (see _claim_front), then, for the slots left, by a walk of its keys
    (see _claim). A walk runs beside the replica's other claims of the queue and passes over the keys
    they hold; when it comes back short because of them, it waits for them to commit and claims again
    for the slots left, so that a claim does not answer empty while jobs it could have are only held for
    a moment (claims from other replicas are not waited for: a long-poll looks again after BUSY_RETRY).
    When it comes back short with every key it walked to locked, those keys were full: it walks on from
    where it stopped, so that keys with room beyond a stretch of full keys are found by the same call,
    not at the next wake-up.

    `per_key` (every slot one caller's): up to that many jobs of a key whose jobs run in order, from the
    front (see LEASE_FLOW_FRONT); a walk takes one of such a key, as without it."""
    claim = FlowClaim([], [], None, False)
    if not (flow.fair or flow.rated) and (per_key > 1 or runtime.flow.front_open(queue)):
        claim, others = await _claim_front(runtime, queue, timeouts, workers, per_key)
        if not claim.short:
            return claim
        if others:
            await _done(others)
    for _ in range(BUSY_ROUNDS):
        done = len(claim.rows)
        more, others = await _claim(runtime, queue, flow, timeouts[done:], workers[done:])
        claim.rows += more.rows
        claim.slots += [done + slot for slot in more.slots]
        claim.wake_in, claim.busy = more.wake_in, more.busy
        if len(claim.rows) == len(workers) or not (more.short or (more.busy and others)):
            break
        if more.busy and others:
            await _done(others)
    return claim


async def _done(claims: list[asyncio.Event]) -> None:
    """Once the replica's `claims` (see FlowQueues.join) are done: committed, or rolled back."""
    await asyncio.wait([asyncio.ensure_future(claim.wait()) for claim in claims])


# How the claim's two statements are planned, for its transaction only:
# - once per connection, for any arguments: planning for each claim's own cost a quarter of the claim,
#   and on statistics taken while the table was small (a backlog inserted since) planned a lookup of each
#   chosen job through the claim index, ten times slower;
# - by index, never by reading the whole table or a whole index's matches: they read a few rows per key,
#   each found by an index in the order it is needed. On statistics from a time the table's jobs had no
#   keys (a burst of keyed jobs since; ANALYZE of an emptied table keeps the old figures), PostgreSQL
#   took the key index for empty and walked the keys by reading the whole table and sorting it, once per
#   key (FLOW_KEYS: 2 s instead of 0.5 ms, the keyed drain at a tenth of its speed until the next
#   ANALYZE). Without sequential and bitmap scans, every read of the two statements has an index path in
#   the order it needs, so no statistics can make a claim read more than it takes.
FLOW_PLANS = (
    "SET LOCAL plan_cache_mode = force_generic_plan;"
    " SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off"
)


async def _claim(
    runtime: Runtime, queue: str, flow: QueueFlow, timeouts: list[float | None], workers: list[str | None]
) -> tuple[FlowClaim, list[asyncio.Event]]:
    """One claim: FLOW_KEYS, then LEASE_FLOW, in one transaction (see app/db/sql/claim.py for why two
    statements); and the replica's claims of the queue under way when it walked."""
    slots = len(workers)
    per_key = slots if flow.fair or not flow.key_concurrency else min(flow.key_concurrency, slots)
    scan = math.ceil(slots / per_key) + min(KEY_SLACK, slots + 3)
    known = runtime.flow
    # Jobs without a key are looked for at the front of the queue (a scan that reads each job's row):
    # by every claim while some are found, else once every UNKEYED_INTERVAL seconds.
    looked_at = known.unkeyed_looked.get(queue)
    unkeyed = looked_at is None or time.monotonic() - looked_at >= UNKEYED_INTERVAL
    turn = known.turns.setdefault(queue, asyncio.Lock())
    # A queue with a rate: its claims take turns (FLOW_KEYS_RATED locks its row in the database, so
    # here too, rather than each holding a connection while it waits for the row). Without a rate they
    # only walk in turn: each walk starts where the last one stopped and ends with the keys it needs
    # locked, and the claims then lease side by side, each from its own keys.
    whole, walking = (turn, contextlib.nullcontext()) if flow.rated else (contextlib.nullcontext(), turn)
    claim = q.LEASE_FLOW_RATED if flow.rated else q.LEASE_FLOW
    mine = asyncio.Event()
    try:
        async with whole, runtime.db.acquire() as conn, transaction_with(conn, FLOW_PLANS):
            async with walking:
                others = known.join(queue, mine)
                looked = await _walk(conn, known, queue, flow, scan)
            locked = [r["key"] for r in looked if r["locked"]]
            lookahead = UNKEYED_LOOKAHEAD * slots + KEY_SLACK if unkeyed else 0
            rows = await conn.fetch(
                claim.text,
                *claim.args(
                    queue=queue,
                    keys=locked,
                    visibility_timeouts=timeouts,
                    worker_ids=workers,
                    lookahead=lookahead,
                ),
            )
    finally:
        known.leave(queue, mine)
    leased = [r for r in rows if r["id"] is not None]
    if unkeyed:
        if any(r["key"] is None for r in leased):
            known.unkeyed_looked.pop(queue, None)
        else:
            known.unkeyed_looked[queue] = time.monotonic()
    busy = any(r["locked"] is False for r in looked)
    # A queue with a rate comes back short when its window is full: walking on would find no more.
    short = len(leased) < slots and len(locked) >= scan and not flow.rated
    return FlowClaim(leased, [r["slot"] for r in leased], rows[0]["wake_in"], busy, short), others


async def _claim_front(
    runtime: Runtime, queue: str, timeouts: list[float | None], workers: list[str | None], per_key: int = 1
) -> tuple[FlowClaim, list[asyncio.Event]]:
    """A claim from the front of a queue under key concurrency alone: LEASE_FLOW_FRONT, one call (see
    app/db/sql/claim.py); and the replica's claims of the queue under way beside it. It comes back
    `short` (the caller walks the keys for the slots left, once those claims have committed) when it
    left slots empty and the front may not have been all there was: it looked at as many jobs as it
    could (keys with room may lie beyond full ones), passed over keys another claim held, or ran beside
    other claims (whose jobs it passed over, locked, and which may not lease them all); not when it alone
    saw every ready job. A front mostly full (full keys before the rest: a key with a backlog of its own)
    is not looked at again for FRONT_PAUSE seconds."""
    slots = len(workers)
    lookahead = slots + min(KEY_SLACK, slots + 3)
    known = runtime.flow
    mine = asyncio.Event()
    others = known.join(queue, mine)
    try:
        async with runtime.db.acquire() as conn:
            rows = await conn.fetch(
                q.LEASE_FLOW_FRONT.text,
                *q.LEASE_FLOW_FRONT.args(
                    queue=queue,
                    lookahead=lookahead,
                    visibility_timeouts=timeouts,
                    worker_ids=workers,
                    per_key=per_key,
                ),
            )
    finally:
        # Every claim that ran beside this one, begun before it or after: the database may have run a
        # later one's first (it found this one's jobs locked) or an earlier one's last.
        others += [other for other in known.leave(queue, mine) if other not in others]
    busy = rows[0]["passed"] > 0
    held = rows[0]["looked"] == lookahead
    leased = [r for r in rows if r["id"] is not None]
    short = len(leased) < slots and (busy or held or bool(others))
    if held and 2 * len(leased) < slots:
        known.front_held[queue] = time.monotonic() + FRONT_PAUSE
    return FlowClaim(leased, [r["slot"] for r in leased], None, busy, short), others


async def _walk(
    conn: asyncpg.Connection, known: FlowQueues, queue: str, flow: QueueFlow, scan: int
) -> list[asyncpg.Record]:
    """FLOW_KEYS until `scan` keys are locked, on from the first key once past the last: for a `fair`
    queue, from the key after the one its last claim served (kept in its row, for every replica);
    otherwise from where the replica's last walk of the queue stopped, and the next walk starts after the
    last key looked at."""
    walk = q.FLOW_KEYS_RATED if flow.rated else q.FLOW_KEYS
    after = None if flow.fair else known.cursors.get(queue, "")
    reach = scan * KEY_REACH
    looked = await conn.fetch(walk.text, *walk.args(queue=queue, after=after, scan=scan, reach=reach))
    if not flow.fair:
        known.cursors[queue] = looked[-1]["key"] if looked else ""
    return looked


# Ready jobs held back by a limit are counted up to this many per queue and kind of limit.
HELD_COUNT_CAP = 100_000


async def flow_gauges(db: Database) -> list[Row]:
    """Per queue under flow control: ready jobs held back by key concurrency, by key rate and by the
    queue's rate (each counted up to HELD_COUNT_CAP), for the metrics."""
    async with db.acquire() as conn:
        rows = await conn.fetch(q.FLOW_GAUGES.text, *q.FLOW_GAUGES.args(cap=HELD_COUNT_CAP))
    return [dict(r) for r in rows]


# --- the per-key view and overrides ----------------------------------------------------------------


def _key_row(row: asyncpg.Record) -> Row:
    out = dict(row)
    if isinstance(out["rate"], str):
        out["rate"] = json.loads(out["rate"])
    return out


async def get_key(db: Database, queue: str, key: str) -> Row:
    """A key's overrides and jobs; NotFound when it has neither."""
    async with db.acquire() as conn:
        row = await conn.fetchrow(q.GET_KEY.text, *q.GET_KEY.args(queue=queue, key=key))
    assert row is not None
    if row["concurrency"] is None and row["rate"] is None and not row["pending"] and not row["running"]:
        raise NotFound(f"key {key!r} of queue {queue!r} has no jobs waiting or running and no overrides")
    return _key_row(row)


async def put_key(
    runtime: Runtime, queue: str, key: str, concurrency: int | None, rate: tuple[int, float] | None
) -> Row:
    """Set a key's overrides (None: the queue's setting), creating its queue if need be."""
    async with runtime.db.acquire() as conn:
        async with conn.transaction():
            await conn.execute(q.LOCK_QUEUE_ROW.text, *q.LOCK_QUEUE_ROW.args(queue=queue))
            await conn.execute(
                q.PUT_KEY.text,
                *q.PUT_KEY.args(
                    queue=queue,
                    key=key,
                    concurrency=concurrency,
                    rate_limit=rate[0] if rate else None,
                    rate_period=rate[1] if rate else None,
                ),
            )
            await conn.execute(q.SET_FLOW.text, *q.SET_FLOW.args(queue=queue))
        row = await conn.fetchrow(q.GET_KEY.text, *q.GET_KEY.args(queue=queue, key=key))
    runtime.flow.forget(queue)
    assert row is not None
    return _key_row(row)


async def delete_key(runtime: Runtime, queue: str, key: str) -> Row:
    """Remove a key's overrides: it follows the queue's settings again."""
    async with runtime.db.acquire() as conn:
        async with conn.transaction():
            await conn.execute(q.LOCK_QUEUE_ROW.text, *q.LOCK_QUEUE_ROW.args(queue=queue))
            deleted = await conn.fetchval(q.DELETE_KEY.text, *q.DELETE_KEY.args(queue=queue, key=key))
            if not deleted:
                raise NotFound(f"key {key!r} of queue {queue!r} has no overrides")
            await conn.execute(q.SET_FLOW.text, *q.SET_FLOW.args(queue=queue))
    runtime.flow.forget(queue)
    return {"queue": queue, "key": key, "deleted": True}


async def list_keys(db: Database, queue: str, limit: int) -> list[Row]:
    """The queue's keys with the most jobs waiting, and keys with overrides, `limit` at most."""
    async with db.acquire() as conn:
        rows = await conn.fetch(q.LIST_KEYS.text, *q.LIST_KEYS.args(queue=queue, limit=limit))
    return [_key_row(r) for r in rows]
