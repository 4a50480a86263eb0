"""The service layer: every jobq operation, in terms of the statements in ``app/queries.py``.

No HTTP here. Each function takes the ``Database``, acquires one connection, runs its statements (a
transaction only where several must commit together) and returns plain dicts, or raises an
``app.errors`` exception. Names match the queries and the routes: ``POST /lease`` -> ``lease`` -> ``LEASE``.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

import asyncpg

from app import queries as q
from app.access_log import note
from app.coalesce import Batcher
from app.db import Database
from app.errors import Conflict, LeaseLost, NotFound, PayloadTooLarge, Unavailable
from app.schemas import AckRequest, EnqueueRequest, NackRequest, QueueSettingsPatch
from app.wakeups import Wakeups
from app.web import encode_json, raw_json

Row = dict[str, Any]

MAX_ID = 2**63 - 1
EXPIRE_BATCH = 1000
RETRY_BATCH = 1000
MAX_SHARED = 1000  # calls per shared ack, nack or enqueue statement
MAX_SHARED_CLAIM = 1000  # jobs per shared claim statement


_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _lease_token(text: str) -> uuid.UUID | str | None:
    """Tokens are UUIDs inside; anything else cannot be any job's current token. A token as jobq wrote
    it goes to asyncpg as it is (its UUID codec parses it in C); other spellings are parsed here."""
    if _CANONICAL_UUID.fullmatch(text):
        return text
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


def _encode_payloads(requests: Sequence[EnqueueRequest], limit: int) -> list[str]:
    """Each job's payload as JSON text for PostgreSQL, none over `limit` bytes."""
    texts = []
    for i, request in enumerate(requests):
        data = encode_json(request.payload)
        if len(data) > limit:
            where = f"jobs[{i}].payload" if len(requests) > 1 else "payload"
            raise PayloadTooLarge(f"{where} is {len(data)} bytes encoded; the limit is {limit} bytes")
        texts.append(data.decode())
    return texts


# --- producers -------------------------------------------------------------------------------------


async def enqueue(
    db: Database,
    requests: Sequence[EnqueueRequest],
    *,
    then: Callable[[asyncpg.Connection, list[Row]], Awaitable[None]] | None = None,
) -> list[Row]:
    """Insert jobs, all or nothing; each result carries `duplicate`.

    A dedup_key already held by an active job of the queue answers with that job. Within one batch, a
    repeated (queue, dedup_key) is a duplicate of its first occurrence. `then`, if given, runs in the
    same transaction with the jobs (the SQS API stores message attributes beside them this way).
    """
    payloads = _encode_payloads(requests, db.settings.max_payload_bytes)
    if all(r.dedup_key is None for r in requests):
        async with db.acquire() as conn:
            if then is None:
                new = await _insert_new(conn, requests, payloads)
            else:
                async with conn.transaction():
                    new = await _insert_new(conn, requests, payloads)
                    await then(conn, new)
        db.metrics.enqueued.count(new)
        return new

    # Collapse repeats within the batch onto their first occurrence before touching the database.
    first: dict[tuple[str, str], int] = {}
    unique: list[int] = []  # request indexes actually inserted
    source: list[tuple[int, bool]] = []  # per request: index into `unique`, and whether it repeats
    for i, r in enumerate(requests):
        key = (r.queue, r.dedup_key) if r.dedup_key is not None else None
        if key is not None and key in first:
            source.append((first[key], True))
            continue
        if key is not None:
            first[key] = len(unique)
        source.append((len(unique), False))
        unique.append(i)

    results: list[Row | None] = [None] * len(unique)
    async with db.acquire() as conn:
        # A duplicate needs a second statement to find its holder; keep the batch all or nothing.
        async with conn.transaction():
            await _insert(conn, requests, payloads, unique, results)
            if then is not None:
                await then(conn, results)  # type: ignore[arg-type]
    db.metrics.enqueued.count([row for row in results if not row["duplicate"]])  # type: ignore[index]
    return [
        {**results[index], "duplicate": True} if repeated else results[index]  # type: ignore[dict-item]
        for index, repeated in source
    ]


def _columns(requests: Sequence[EnqueueRequest], payloads: list[str]) -> dict[str, list | None]:
    """The batch as ENQUEUE's arrays. A column the whole batch leaves at its default is None: unnest pads
    it with NULLs, and asyncpg need not encode a thousand of them."""

    def column(values: list) -> list | None:
        return None if values.count(None) == len(values) else values

    return {
        "queues": [r.queue for r in requests],
        "payloads": payloads,
        "priorities": column([r.priority or None for r in requests]),
        "run_ats": column([r.run_at for r in requests]),
        "delays": column([r.delay for r in requests]),
        "max_attempts": column([r.max_attempts for r in requests]),
    }


async def _insert_new(
    conn: asyncpg.Connection, requests: Sequence[EnqueueRequest], payloads: list[str]
) -> list[Row]:
    """Insert jobs without dedup keys; the new jobs, in request order."""
    row = await conn.fetchrow(q.ENQUEUE_NEW.text, *q.ENQUEUE_NEW.args(**_columns(requests, payloads)))
    created_at = row["created_at"]
    return [
        _new_job(request, payload, job_id, run_at or created_at, max_attempts, created_at)
        for request, payload, job_id, run_at, max_attempts in zip(
            requests, payloads, row["ids"], row["run_ats"], row["max_attempts"], strict=True
        )
    ]


async def _insert(
    conn: asyncpg.Connection,
    requests: Sequence[EnqueueRequest],
    payloads: list[str],
    unique: list[int],
    results: list[Row | None],
) -> None:
    todo = list(range(len(unique)))
    # A holder found in conflict may finish before we read it, freeing its key: then insert again.
    for _ in range(10):
        chosen = [requests[unique[k]] for k in todo]
        rows = await conn.fetch(
            q.ENQUEUE.text,
            *q.ENQUEUE.args(
                **_columns(chosen, [payloads[unique[k]] for k in todo]),
                dedup_keys=[r.dedup_key for r in chosen],
            ),
        )
        conflicted = []
        for row in rows:
            k = todo[row["ord"] - 1]
            if row["id"] is None:
                conflicted.append(k)
            else:
                request, payload = requests[unique[k]], payloads[unique[k]]
                results[k] = _new_job(
                    request, payload, row["id"], row["run_at"], row["max_attempts"], row["created_at"]
                )
        if not conflicted:
            return
        keys = [(requests[unique[k]].queue, requests[unique[k]].dedup_key) for k in conflicted]
        holders = await conn.fetch(
            q.DEDUP_HOLDERS.text,
            *q.DEDUP_HOLDERS.args(queues=[k[0] for k in keys], dedup_keys=[k[1] for k in keys]),
        )
        by_key = {(h["queue"], h["dedup_key"]): h for h in holders}
        todo = []
        for k, key in zip(conflicted, keys, strict=False):
            if key in by_key:
                results[k] = _job(by_key[key]) | {"duplicate": True}
            else:
                todo.append(k)
        if not todo:
            return
    raise Unavailable("dedup keys kept changing hands; retry the request")


def _new_job(
    request: EnqueueRequest,
    payload: str,
    job_id: int,
    run_at: datetime,
    max_attempts: int,
    created_at: datetime,
) -> Row:
    """A job just inserted, as GET /jobs/{id} would show it: the request, and what the database set."""
    return {
        "id": job_id,
        "queue": request.queue,
        "status": "pending",
        "payload": raw_json(payload),
        "priority": request.priority,
        "run_at": run_at,
        "attempts": 0,
        "max_attempts": max_attempts,
        "dedup_key": request.dedup_key,
        "last_error": None,
        "lease_expires_at": None,
        "created_at": created_at,
        "updated_at": created_at,
        "completed_at": None,
        "duplicate": False,
    }


def _job(row: asyncpg.Record) -> Row:
    job = dict(row)
    job.pop("ord", None)  # statements' bookkeeping, not the job's
    job.pop("slot", None)
    job["payload"] = raw_json(job["payload"])
    token = job.pop("lease_token", None)
    if token is not None:
        job["lease_token"] = str(token)
    return job


async def get_job(db: Database, job_id: int) -> Row:
    async with db.acquire() as conn:
        row = await conn.fetchrow(q.GET_JOB.text, *q.GET_JOB.args(id=job_id))
    if row is None:
        raise NotFound(f"job {job_id} does not exist")
    return _job(row)


async def _status_of(conn: asyncpg.Connection, job_id: int) -> str:
    """The state of a job that a guarded statement left alone; NotFound when there is no such job."""
    status = await conn.fetchval(q.JOB_STATUS.text, *q.JOB_STATUS.args(id=job_id))
    if status is None:
        raise NotFound(f"job {job_id} does not exist")
    return status


async def cancel(db: Database, job_id: int) -> Row:
    async with db.acquire() as conn:
        row = await conn.fetchrow(q.CANCEL.text, *q.CANCEL.args(id=job_id))
        if row is None:
            status = await _status_of(conn, job_id)
            raise Conflict(f"job {job_id} is {status}; only pending jobs can be cancelled", job_status=status)
    return _job(row)


# --- workers ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LeaseCall:
    """One caller's share of a shared claim statement."""

    max_jobs: int
    visibility_timeout: float | None
    worker_id: str | None


async def lease(
    db: Database,
    wakeups: Wakeups,
    *,
    queue: str,
    max_jobs: int,
    visibility_timeout: float | None,
    wait: float,
    worker_id: str | None,
    client_gone: Callable[[], Awaitable[bool]] | None = None,
) -> list[Row]:
    """Claim up to max_jobs ready jobs of the queue; with `wait`, long-poll until some are claimed or
    `wait` seconds pass. No connection is held while waiting.

    Concurrent calls on one queue share claim statements (see _claim). A long-poll whose client has
    gone claims nothing more, and hands back what it claimed for it. Once the service is shutting
    down, nothing is claimed.
    """
    call = LeaseCall(max_jobs, visibility_timeout, worker_id)
    if wakeups.closing:
        return []
    if wait <= 0:
        leased = await _claim(db, queue, call)
        note(jobs=len(leased))
        return leased
    deadline = time.monotonic() + wait
    while True:
        with wakeups.waiting(queue) as waiter:
            leased = await _claim(db, queue, call)
            remaining = deadline - time.monotonic()
            if leased or remaining <= 0:
                break
            await waiter.wait(remaining)
        if wakeups.closing or (client_gone is not None and await client_gone()):
            return []
    if client_gone is not None and await client_gone():
        await release(db, leased)
        return []
    note(jobs=len(leased))
    return leased


async def _claim(db: Database, queue: str, call: LeaseCall) -> list[Row]:
    if not db.settings.coalesce:
        (leased,) = await _claim_shared(db, queue, [call])
        return leased
    batcher = db.batcher(
        ("lease", queue),
        lambda: Batcher(
            partial(_claim_shared, db, queue),
            max_items=MAX_SHARED_CLAIM,
            size=lambda c: c.max_jobs,
            orphaned=partial(_release_orphans, db),
            concurrency=db.settings.coalesce_concurrency,
        ),
    )
    return await batcher.submit(call)


async def _claim_shared(db: Database, queue: str, calls: list[LeaseCall]) -> list[list[Row]]:
    """One LEASE statement for several calls: each call owns max_jobs consecutive slots."""
    owner, timeouts, workers = [], [], []
    for k, call in enumerate(calls):
        owner += [k] * call.max_jobs
        timeouts += [call.visibility_timeout] * call.max_jobs
        workers += [call.worker_id] * call.max_jobs
    async with db.acquire() as conn:
        started = time.perf_counter()
        rows = await conn.fetch(
            q.LEASE.text, *q.LEASE.args(queue=queue, visibility_timeouts=timeouts, worker_ids=workers)
        )
        db.metrics.claimed(queue, time.perf_counter() - started, len(rows))
    shares: list[list[tuple[int, Row]]] = [[] for _ in calls]
    for row in rows:
        shares[owner[row["slot"] - 1]].append((row["slot"], _job(row)))
    return [[job for _, job in sorted(share, key=lambda pair: pair[0])] for share in shares]


async def _release_orphans(db: Database, orphans: list[list[Row]]) -> None:
    leased = [job for share in orphans for job in share]
    if leased:
        await release(db, leased)


async def release(db: Database, leased: list[Row]) -> int:
    """Hand back jobs that were claimed but never delivered (their attempt is not counted)."""
    results = await release_leases(db, [(j["id"], j["lease_token"]) for j in leased])
    return sum(r["ok"] for r in results)


async def release_leases(db: Database, items: Sequence[tuple[int, str]]) -> list[Row]:
    """Give running jobs back untouched, under their current lease tokens: pending again at once, the
    attempt not counted (a worker that took more than it will start, or is stopping before it starts).
    A result per item, in order, like /ack/batch."""
    ids = [job_id for job_id, _ in items]
    tokens = [_lease_token(token) for _, token in items]
    async with db.acquire() as conn:
        released = {
            r["id"] for r in await conn.fetch(q.RELEASE.text, *q.RELEASE.args(ids=ids, lease_tokens=tokens))
        }
        failed = [job_id for job_id in ids if job_id not in released]
        states = await _lease_states(conn, failed) if failed else {}
    results = []
    for job_id in ids:
        if job_id in released:
            released.discard(job_id)  # the same lease twice: only the first call gave it back
            results.append({"id": job_id, "ok": True})
        else:
            results.append(_refused(job_id, states))
    return results


async def ack_one(db: Database, item: AckRequest) -> Row:
    """One ack, sharing its statement with concurrent acks."""
    return await _shared(db, "ack", ack, item)


async def nack_one(db: Database, item: NackRequest) -> Row:
    """One nack, sharing its statement with concurrent nacks."""
    return await _shared(db, "nack", nack, item)


async def enqueue_one(db: Database, item: EnqueueRequest) -> Row:
    """One enqueue, sharing its INSERT with concurrent single enqueues. A shared statement that fails
    is retried call by call, so each call still succeeds or fails on its own."""
    return await _shared(db, "enqueue", enqueue, item, isolate=True)


async def _shared(db: Database, name: str, run: Callable, item: Any, *, isolate: bool = False) -> Row:
    if not db.settings.coalesce:
        (result,) = await run(db, [item])
        return result
    batcher = db.batcher(
        name,
        lambda: Batcher(
            partial(run, db),
            max_items=MAX_SHARED,
            isolate=isolate,
            concurrency=db.settings.coalesce_concurrency,
        ),
    )
    return await batcher.submit(item)


async def ack(db: Database, items: Sequence[AckRequest]) -> list[Row]:
    """Complete each job whose current lease token is given; a result per item, in order."""
    tokens = [_lease_token(i.lease_token) for i in items]
    ids = [i.id for i in items]
    async with db.acquire() as conn:
        acked = await conn.fetch(q.ACK.text, *q.ACK.args(ids=ids, lease_tokens=tokens))
        done = {r["id"] for r in acked}
        failed = [k for k, i in enumerate(items) if i.id not in done]
        states = await _lease_states(conn, [ids[k] for k in failed]) if failed else {}
    db.metrics.acked.count(acked)
    results = []
    for job_id, token in zip(ids, tokens, strict=False):
        if job_id in done:
            results.append({"id": job_id, "ok": True})
            continue
        state = states.get(job_id)
        repeated = (
            state is not None
            and state["status"] == "completed"
            and token is not None
            and str(state["lease_token"]) == str(token)
        )
        if repeated:  # a repeated ack: already done, by this lease
            results.append({"id": job_id, "ok": True})
        else:
            results.append(_refused(job_id, states))
    return results


async def _lease_states(conn: asyncpg.Connection, ids: list[int]) -> dict[int, asyncpg.Record]:
    rows = await conn.fetch(q.LEASE_STATES.text, *q.LEASE_STATES.args(ids=ids))
    return {r["id"]: r for r in rows}


def _refused(job_id: int, states: dict[int, asyncpg.Record]) -> Row:
    """The result of an item whose lease did not match: the job exists (lease lost) or it does not."""
    return {"id": job_id, "ok": False, "code": "lease_lost" if job_id in states else "not_found"}


async def nack(db: Database, items: Sequence[NackRequest]) -> list[Row]:
    """Give jobs back after a failed attempt: retry later, or dead. A result per item, in order."""
    cut = db.settings.max_error_chars
    ids = [i.id for i in items]
    async with db.acquire() as conn:
        rows = await conn.fetch(
            q.NACK.text,
            *q.NACK.args(
                ids=ids,
                lease_tokens=[_lease_token(i.lease_token) for i in items],
                # PostgreSQL text cannot hold U+0000; a worker's error message must not fail its nack.
                errors=[
                    i.error[:cut].replace("\x00", "\ufffd") if i.error is not None else None for i in items
                ],
                retry_afters=[i.retry_after for i in items],
                deads=[i.dead for i in items],
            ),
        )
        done = {r["id"]: r for r in rows}
        nacked = set(done)
        failed = [job_id for job_id in ids if job_id not in done]
        states = await _lease_states(conn, failed) if failed else {}
    db.metrics.nacked.count(rows)
    db.metrics.dead_lettered.count([r for r in rows if r["status"] == "dead"])
    results = []
    for job_id in ids:
        if job_id in done:
            # The same lease nacked twice in one statement: only the first call ended it.
            row = done.pop(job_id)
            results.append({"id": job_id, "ok": True, "status": row["status"], "run_at": row["run_at"]})
        elif job_id in nacked:
            results.append({"id": job_id, "ok": False, "code": "lease_lost"})
        else:
            results.append(_refused(job_id, states))
    return results


def single(result: Row) -> Row:
    """The answer of a one-item ack or nack, or its error."""
    if result["ok"]:
        return result
    if result["code"] == "not_found":
        raise NotFound(f"job {result['id']} does not exist")
    raise LeaseLost(f"job {result['id']} is not held under this lease token (it expired, or was ended)")


async def extend(db: Database, job_id: int, lease_token: str, visibility_timeout: float) -> Row:
    async with db.acquire() as conn:
        row = await conn.fetchrow(
            q.EXTEND.text,
            *q.EXTEND.args(
                id=job_id, lease_token=_lease_token(lease_token), visibility_timeout=visibility_timeout
            ),
        )
        if row is None:
            await _status_of(conn, job_id)
            raise LeaseLost(f"job {job_id} is not running under this lease token")
    return dict(row)


# --- operators -------------------------------------------------------------------------------------


async def dead_jobs(db: Database, queue: str | None, limit: int, before_id: int | None) -> Row:
    before = before_id if before_id is not None else MAX_ID
    async with db.acquire() as conn:
        if queue is None:
            query, args = q.DEAD_JOBS, q.DEAD_JOBS.args(before_id=before, limit=limit)
        else:
            query, args = (
                q.DEAD_JOBS_IN_QUEUE,
                q.DEAD_JOBS_IN_QUEUE.args(queue=queue, before_id=before, limit=limit),
            )
        rows = await conn.fetch(query.text, *args)
    jobs = [_job(r) for r in rows]
    return {"jobs": jobs, "next_before_id": jobs[-1]["id"] if len(jobs) == limit else None}


async def retry_dead(db: Database, ids: list[int] | None, queue: str | None) -> Row:
    """Dead jobs back to pending, a page at a time; those whose dedup_key is taken are skipped."""
    retried, skipped = 0, []
    before = MAX_ID
    async with db.acquire() as conn:
        while True:
            try:
                rows = await conn.fetch(
                    q.RETRY_DEAD.text,
                    *q.RETRY_DEAD.args(before_id=before, ids=ids, queue=queue, batch=RETRY_BATCH),
                )
            except asyncpg.UniqueViolationError:
                continue  # an enqueue took a key between our check and update: look again
            for r in rows:
                if r["retried"]:
                    retried += 1
                else:
                    skipped.append(r["id"])
            if len(rows) < RETRY_BATCH:
                break
            before = rows[-1]["id"]
    return {"retried": retried, "skipped": skipped}


async def purge_dead(db: Database, job_id: int) -> Row:
    async with db.acquire() as conn:
        purged = await conn.fetchval(q.PURGE_DEAD.text, *q.PURGE_DEAD.args(id=job_id))
        if purged is None:
            status = await _status_of(conn, job_id)
            raise Conflict(f"job {job_id} is {status}; only dead jobs can be purged", job_status=status)
    return {"id": job_id, "purged": True}


_SETTINGS = ("visibility_timeout", "max_attempts", "backoff_base", "backoff_cap", "retention")


def _queue_row(row: asyncpg.Record, with_settings: bool) -> Row:
    out = {k: v for k, v in row.items() if k not in _SETTINGS}
    if with_settings:
        out["settings"] = {k: row[k] for k in _SETTINGS}
    return out


async def queues(db: Database) -> list[Row]:
    async with db.acquire() as conn:
        rows = await conn.fetch(q.QUEUE_STATS.text, *q.QUEUE_STATS.args(queue=None))
    return [_queue_row(r, with_settings=False) for r in rows]


async def _queue_stats(conn: asyncpg.Connection, name: str) -> asyncpg.Record:
    row = await conn.fetchrow(q.QUEUE_STATS.text, *q.QUEUE_STATS.args(queue=name))
    if row is None:
        raise NotFound(f"queue {name!r} does not exist (no jobs, no settings)")
    return row


async def queue(db: Database, name: str) -> Row:
    async with db.acquire() as conn:
        return _queue_row(await _queue_stats(conn, name), with_settings=True)


async def configure_queue(db: Database, name: str, patch: QueueSettingsPatch) -> Row:
    async with db.acquire() as conn:
        await conn.execute(q.CONFIGURE_QUEUE.text, *q.CONFIGURE_QUEUE.args(queue=name, **patch.model_dump()))
        return _queue_row(await _queue_stats(conn, name), with_settings=True)


async def set_paused(db: Database, name: str, paused: bool) -> Row:
    async with db.acquire() as conn:
        await conn.execute(q.SET_PAUSED.text, *q.SET_PAUSED.args(queue=name, paused=paused))
        return _queue_row(await _queue_stats(conn, name), with_settings=False)


# --- background ------------------------------------------------------------------------------------


async def expire_leases(db: Database) -> list[Row]:
    """Return every expired lease to pending (or dead); the jobs changed."""
    changed: list[Row] = []
    async with db.acquire() as conn:
        while True:
            rows = await conn.fetch(q.EXPIRE_LEASES.text, *q.EXPIRE_LEASES.args(batch=EXPIRE_BATCH))
            changed.extend(dict(r) for r in rows)
            if len(rows) < EXPIRE_BATCH:
                break
    db.metrics.expired.count(changed)
    db.metrics.dead_lettered.count([r for r in changed if r["status"] == "dead"])
    return changed


async def prune_finished(db: Database) -> int:
    """Delete finished jobs past retention in bounded batches; how many went."""
    batch, total = db.settings.prune_batch, 0
    while True:
        async with db.acquire() as conn:  # released between batches: pruning never starves requests
            status = await conn.execute(q.PRUNE_FINISHED.text, *q.PRUNE_FINISHED.args(batch=batch))
        deleted = int(status.split()[-1])
        total += deleted
        if deleted < batch:
            return total


async def queue_gauges(db: Database) -> list[Row]:
    """Per queue: paused, pending, scheduled, running, dead and lag_seconds (for the metrics)."""
    async with db.acquire() as conn:
        return [dict(r) for r in await conn.fetch(q.QUEUE_GAUGES.text)]


async def lock_waits(db: Database) -> Row:
    """Sessions of this database waiting for a lock: `waiting`, and `longest_seconds`."""
    async with db.acquire() as conn:
        return dict(await conn.fetchrow(q.LOCK_WAITS.text))


async def schema_state(db: Database) -> tuple[str | None, str | None]:
    """The schema's revision and the floor recorded with it (both None before any migration)."""
    async with db.acquire() as conn:
        try:
            row = await conn.fetchrow(q.SCHEMA_STATE.text)
        except (asyncpg.UndefinedTableError, asyncpg.InvalidSchemaNameError):
            return None, None
    return row["revision"], row["floor"]
