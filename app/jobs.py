"""The service layer: every jobq operation, in terms of the statements in ``app/queries.py``.

No HTTP here. Each function takes the ``Database``, acquires one connection, runs its statements (a
transaction only where several must commit together) and returns plain dicts, or raises an
``app.errors`` exception. Names match the queries and the routes: ``POST /lease`` -> ``lease`` -> ``LEASE``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

import asyncpg
import orjson

from app import queries as q
from app.access_log import note
from app.coalesce import Batcher
from app.db import Database
from app.errors import Conflict, JobqError, LeaseLost, NotFound, PayloadTooLarge, Unavailable
from app.models import MAX_JOB_ID
from app.schemas import AckRequest, EnqueueRequest, NackRequest, QueueSettingsPatch
from app.wakeups import Wakeups
from app.web import encode_json, raw_json

Row = dict[str, Any]
# The queues a caller may see, as LIKE patterns (app/auth.py Grant.like); None: every queue. Queries
# take it as :scope, and a job outside it is answered as one that does not exist.
Scope = list[str] | None

# Keyset paging starts below this: every job.
PAST_LAST_ID = MAX_JOB_ID + 1
EXPIRE_BATCH = 1000
RETRY_BATCH = 1000
MAX_SHARED = 1000  # calls per shared ack, nack or enqueue statement
MAX_SHARED_CLAIM = 1000  # jobs per shared claim statement
RETRY_AFTER_FULL = 1  # seconds a long-poll refused for max_waiters is told to wait before trying again


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


@dataclass(frozen=True, slots=True)
class Once:
    """An `Idempotency-Key` sent with an enqueue (POST /jobs, /jobs/batch), working as Stripe's keys and
    SQS's MessageDeduplicationId do: the first request with the key is carried out and its answer kept for
    `idempotency_ttl` seconds, in the same statement or transaction as its jobs; the same request sent
    again under the key (a client retrying after a lost answer) gets that answer again, same status
    and same bytes, and inserts nothing; another request under the key is 409 conflict."""

    # Whose key: the hex SHA-256 of the caller's bearer token, '' without tokens configured. Keys are per
    # credential, as Stripe's are per account: one producer's key never answers another's request.
    scope: str
    key: str
    route: str  # where it was sent: the same jobs under the same key to another route are another request


async def enqueue(
    db: Database,
    requests: Sequence[EnqueueRequest],
    *,
    then: Callable[[asyncpg.Connection, list[Row]], Awaitable[None]] | None = None,
    once: Once | None = None,
) -> list[Row]:
    """Insert jobs, all or nothing; each result carries `duplicate`.

    A dedup_key already held by an active job of the queue answers with that job. Within one batch, a
    repeated (queue, dedup_key) is a duplicate of its first occurrence. `then`, if given, runs in the
    same transaction with the jobs (the SQS API stores message attributes beside them this way).
    With `once` (an idempotency key, see `Once`), the request is carried out at most once.
    """
    payloads = _encode_payloads(requests, db.settings.max_payload_bytes)
    if once is not None:
        if then is not None:
            raise TypeError("enqueue: `then` and `once` do not go together")
        (answer,) = await _enqueue_once(db, [_keyed(requests, payloads, once)])
        if isinstance(answer, JobqError):
            raise answer
        return answer
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

    async with db.acquire() as conn:
        async with conn.transaction():
            answers, results = await _insert_deduplicated(conn, requests, payloads)
            if then is not None:
                await then(conn, results)
    db.metrics.enqueued.count([row for row in results if not row["duplicate"]])
    return answers


async def _insert_deduplicated(
    conn: asyncpg.Connection, requests: Sequence[EnqueueRequest], payloads: list[str]
) -> tuple[list[Row], list[Row]]:
    """Insert jobs some of which have a dedup_key, in the caller's transaction (a duplicate needs a
    second statement to find its holder, and the batch stays all or nothing). The answer per request,
    and the row per job asked for once (a repeat within the batch is a duplicate of its first occurrence)."""
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
    await _insert(conn, requests, payloads, unique, results)
    answers = [
        {**results[index], "duplicate": True} if repeated else results[index]  # type: ignore[dict-item]
        for index, repeated in source
    ]
    return answers, results  # type: ignore[return-value]


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
    conn: asyncpg.Connection,
    requests: Sequence[EnqueueRequest],
    payloads: list[str],
    query: q.Query = q.ENQUEUE_NEW,
    **keys: Any,
) -> list[Row]:
    """Insert jobs without dedup keys; the new jobs, in request order. (ENQUEUE_NEW_ONCE and
    ENQUEUE_NEW_EACH_ONCE, with `keys`, also keep the answer under idempotency keys.)"""
    row = await conn.fetchrow(query.text, *query.args(**_columns(requests, payloads), **keys))
    created_at = row["created_at"]
    return [
        _new_job(request, payload, job_id, run_at or created_at, max_attempts, created_at)
        for request, payload, job_id, run_at, max_attempts in zip(
            requests, payloads, row["ids"], row["run_ats"], row["max_attempts"], strict=True
        )
    ]


# --- idempotency keys ------------------------------------------------------------------------------

KEY_ROUNDS = 10  # tries of a keyed insert whose keys keep being taken (or expiring) under it


@dataclass(frozen=True, slots=True)
class _Keyed:
    """One enqueue call under an idempotency key: its jobs, their payloads as stored, and `digest`, what
    a repeat must match (see _keyed)."""

    requests: Sequence[EnqueueRequest]
    payloads: list[str]
    once: Once
    digest: bytes


def _keyed(requests: Sequence[EnqueueRequest], payloads: list[str], once: Once) -> _Keyed:
    """The call, with the SHA-256 of its route and of every field of every job (payloads as stored: the
    request's spacing does not matter, its values do)."""
    fields = [
        once.route,
        [
            [r.queue, p, r.priority, r.run_at, r.delay, r.max_attempts, r.dedup_key]
            for r, p in zip(requests, payloads, strict=True)
        ],
    ]
    return _Keyed(requests, payloads, once, hashlib.sha256(orjson.dumps(fields)).digest())


async def _enqueue_singles_once(
    db: Database, items: Sequence[tuple[EnqueueRequest, Once]]
) -> list[Row | JobqError]:
    """Single keyed enqueues in one statement: each call's job, or the error that is its own answer."""
    limit = db.settings.max_payload_bytes
    calls: list[_Keyed] = []
    place: list[int | JobqError] = []  # per item: its index in `calls`, or its error
    for request, once in items:
        try:
            place.append(len(calls))
            calls.append(_keyed([request], _encode_payloads([request], limit), once))
        except PayloadTooLarge as exc:
            place[-1] = exc
    answers = await _enqueue_once(db, calls) if calls else []
    out: list[Row | JobqError] = []
    for p in place:
        answer = p if isinstance(p, JobqError) else answers[p]
        out.append(answer if isinstance(answer, JobqError) else answer[0])
    return out


async def _enqueue_once(db: Database, calls: list[_Keyed]) -> list[list[Row] | JobqError]:
    """Carry out keyed calls together, each at most once; per call, its answer or its Conflict.

    The jobs and the keys go in one statement (or transaction). When a key is already there, that fails
    on the key's primary key and inserts nothing: the calls whose keys were answered before get the
    kept answers (or Conflict, for another request under the key), and the others are inserted again.
    """
    ttl = db.settings.idempotency_ttl
    answers: list[list[Row] | JobqError | None] = [None] * len(calls)
    # One key twice among these calls (a retry overtaking its first try): the first goes to the
    # database, the others answer as it does.
    lead: dict[tuple[str, str], int] = {}
    followers: list[tuple[int, int]] = []
    todo: list[int] = []
    for i, call in enumerate(calls):
        name = (call.once.scope, call.once.key)
        if name in lead:
            followers.append((i, lead[name]))
        else:
            lead[name] = i
            todo.append(i)
    for _ in range(KEY_ROUNDS):
        chosen = [calls[i] for i in todo]
        kept = None
        async with db.acquire() as conn:
            try:
                inserted, new = await _insert_keyed(db, conn, chosen)
            except asyncpg.UniqueViolationError as exc:
                if exc.constraint_name != "pk_idempotency_keys":
                    raise
                kept = await _kept_answers(conn, chosen)
        if kept is None:
            db.metrics.enqueued.count(new)
            for i, rows in zip(todo, inserted, strict=True):
                answers[i] = rows
            todo = []
            break
        for i in todo:
            row = kept.get((calls[i].once.scope, calls[i].once.key))
            if row is not None:
                answers[i] = _replay(calls[i], row, ttl)
        todo = [i for i in todo if answers[i] is None]
        if not todo:
            break
    if todo:
        raise Unavailable("idempotency keys kept changing hands; retry the request")
    for i, j in followers:
        answers[i] = answers[j] if calls[i].digest == calls[j].digest else _reused(calls[i].once, ttl)
    return answers  # type: ignore[return-value]


async def _insert_keyed(
    db: Database, conn: asyncpg.Connection, calls: list[_Keyed]
) -> tuple[list[list[Row]], list[Row]]:
    """Insert the calls' jobs and keep each call's answer under its key, in one statement (ENQUEUE_NEW
    with one more CTE) or, with dedup keys, one more statement in ENQUEUE's transaction. The calls are
    one call, or single enqueues sharing a statement. The answers per call, and the jobs inserted."""
    requests = [r for call in calls for r in call.requests]
    payloads = [p for call in calls for p in call.payloads]
    ttl = db.settings.idempotency_ttl
    keys = {
        "scopes": [call.once.scope for call in calls],
        "keys": [call.once.key for call in calls],
        "request_hashes": [call.digest for call in calls],
    }
    if all(r.dedup_key is None for r in requests):
        if len(calls) == 1:
            one = {"scope": calls[0].once.scope, "key": calls[0].once.key, "request_hash": calls[0].digest}
            answers = await _insert_new(conn, requests, payloads, q.ENQUEUE_NEW_ONCE, ttl=ttl, **one)
        else:
            assert len(requests) == len(calls), "shared statements hold single enqueues"
            answers = await _insert_new(conn, requests, payloads, q.ENQUEUE_NEW_EACH_ONCE, ttl=ttl, **keys)
        new = answers
    else:
        calls_of = [n for n, call in enumerate(calls, 1) for _ in call.requests]
        async with conn.transaction():
            answers, results = await _insert_deduplicated(conn, requests, payloads)
            await conn.execute(
                q.KEEP_ANSWERS.text,
                *q.KEEP_ANSWERS.args(calls=calls_of, ttl=ttl, **keys, **_kept_columns(answers)),
            )
        new = [row for row in results if not row["duplicate"]]
    per_call, start = [], 0
    for call in calls:
        per_call.append(answers[start : start + len(call.requests)])
        start += len(call.requests)
    return per_call, new


def _kept_columns(answers: list[Row]) -> dict[str, list]:
    """KEEP_ANSWERS' arrays: what the database decided for each new job, and each duplicate's answer as
    JSON text, exactly as JSONBody writes it (a duplicate shows another job, which the request cannot
    rebuild)."""
    columns: dict[str, list] = {"ids": [], "run_ats": [], "max_attempts": [], "holders": []}
    for answer in answers:
        columns["ids"].append(answer["id"])
        duplicate = answer["duplicate"]
        run_at = None if duplicate or answer["run_at"] == answer["created_at"] else answer["run_at"]
        columns["run_ats"].append(run_at)
        columns["max_attempts"].append(None if duplicate else answer["max_attempts"])
        columns["holders"].append(
            orjson.dumps(answer, option=orjson.OPT_UTC_Z).decode() if duplicate else None
        )
    return columns


async def _kept_answers(
    conn: asyncpg.Connection, calls: list[_Keyed]
) -> dict[tuple[str, str], asyncpg.Record]:
    rows = await conn.fetch(
        q.ANSWERS.text,
        *q.ANSWERS.args(scopes=[c.once.scope for c in calls], keys=[c.once.key for c in calls]),
    )
    return {(r["scope"], r["key"]): r for r in rows}


def _replay(call: _Keyed, kept: asyncpg.Record, ttl: float) -> list[Row] | JobqError:
    """The first answer of a repeated call, rebuilt from the request and what was kept; Conflict when the
    key was first sent with another request."""
    if bytes(kept["request_hash"]) != call.digest:
        return _reused(call.once, ttl)
    created_at, ids = kept["created_at"], kept["ids"]
    run_ats = kept["run_ats"] or [None] * len(ids)
    holders = kept["holders"] or [None] * len(ids)
    return [
        _as_answered(holder)
        if holder is not None
        else _new_job(request, payload, job_id, run_at or created_at, max_attempts, created_at)
        for request, payload, job_id, run_at, max_attempts, holder in zip(
            call.requests, call.payloads, ids, run_ats, kept["max_attempts"], holders, strict=True
        )
    ]


_DECODER = json.JSONDecoder()


def _as_answered(text: str) -> Row:
    """A job answer kept as JSON text (orjson's: no whitespace between members), as a Row that writes out
    exactly that text: each member's value as written, but `id` and `duplicate`, which callers read."""
    row: Row = {}
    i = 1  # past "{"
    while text[i] != "}":
        name, i = json.decoder.scanstring(text, i + 1)  # type: ignore[attr-defined]
        start = i + 1  # past ":"
        value, i = _DECODER.raw_decode(text, start)
        row[name] = value if name in ("id", "duplicate") else raw_json(text[start:i])
        i += text[i] == ","
    return row


def _reused(once: Once, ttl: float) -> Conflict:
    return Conflict(
        f"Idempotency-Key {once.key!r} was first sent with another request (other jobs, or to another "
        f"route) in the last {ttl:g} s; a new request needs a new key"
    )


async def prune_idempotency_keys(db: Database) -> int:
    """Forget idempotency keys past their expiry, in bounded batches; how many went."""
    batch, total = db.settings.prune_batch, 0
    while True:
        async with db.acquire() as conn:  # released between batches, as in prune_finished
            status = await conn.execute(
                q.PRUNE_IDEMPOTENCY_KEYS.text, *q.PRUNE_IDEMPOTENCY_KEYS.args(batch=batch)
            )
        deleted = int(status.split()[-1])
        total += deleted
        if deleted < batch:
            return total


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


async def get_job(db: Database, job_id: int, scope: Scope = None) -> Row:
    async with db.acquire() as conn:
        row = await conn.fetchrow(q.GET_JOB.text, *q.GET_JOB.args(id=job_id, scope=scope))
    if row is None:
        raise NotFound(f"job {job_id} does not exist")
    return _job(row)


async def _status_of(conn: asyncpg.Connection, job_id: int, scope: Scope = None) -> str:
    """The state of a job that a guarded statement left alone; NotFound when there is no such job (or
    it is outside `scope`)."""
    status = await conn.fetchval(q.JOB_STATUS.text, *q.JOB_STATUS.args(id=job_id, scope=scope))
    if status is None:
        raise NotFound(f"job {job_id} does not exist")
    return status


async def cancel(db: Database, job_id: int, scope: Scope = None) -> Row:
    async with db.acquire() as conn:
        row = await conn.fetchrow(q.CANCEL.text, *q.CANCEL.args(id=job_id, scope=scope))
        if row is None:
            status = await _status_of(conn, job_id, scope)
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
    disconnected: Callable[[], Awaitable[object]] | None = None,
) -> list[Row]:
    """Claim up to max_jobs ready jobs of the queue; with `wait`, long-poll until some are claimed or
    `wait` seconds pass. No connection is held while waiting.

    Concurrent calls on one queue share claim statements (see _claim). `disconnected` returns once the
    client has gone (app/web.py): a long-poll watches it while it waits and leaves at once, so wake-ups
    go to waiters still listening; it claims nothing more, and hands back what it claimed for a client
    that left meanwhile. Once the service is shutting down, nothing is claimed. At most
    `max_waiters` long-polls wait at once (app/wakeups.py); past that a long-poll is refused with
    Unavailable (503, Retry-After) before any work, while short leases (`wait` 0) go on.
    """
    call = LeaseCall(max_jobs, visibility_timeout, worker_id)
    if wakeups.closing:
        return []
    if wait <= 0:
        leased = await _claim(db, queue, call)
        note(jobs=len(leased))
        return leased
    with wakeups.long_poll() as admitted:
        if not admitted:
            raise Unavailable(
                f"this service process already holds {wakeups.max_waiters} waiting long-polls"
                " (JOBQ_MAX_WAITERS); retry after the Retry-After seconds, lease with wait 0, or"
                " spread workers over more replicas",
                retry_after=RETRY_AFTER_FULL,
                nothing_done=True,  # refused before any work: safe to send again (app/errors.py)
            )
        gone = asyncio.ensure_future(disconnected()) if disconnected is not None else None
        try:
            leased = await _long_poll(db, wakeups, queue, call, wait, gone)
            if leased and gone is not None and gone.done():
                await release(db, leased)  # its client left while the claim ran: nobody to deliver to
                return []
        finally:
            if gone is not None:
                gone.cancel()
    note(jobs=len(leased))
    return leased


async def _long_poll(
    db: Database, wakeups: Wakeups, queue: str, call: LeaseCall, wait: float, gone: asyncio.Future | None
) -> list[Row]:
    """Claim, and wait for a wake-up while nothing is claimed, until `wait` seconds pass or the client
    goes (`gone` completes). A wake-up this waiter does not act on is passed on (see Wakeups.waiting)."""
    deadline = time.monotonic() + wait
    while True:
        with wakeups.waiting(queue) as waiter:
            leased = await _claim(db, queue, call)
            remaining = deadline - time.monotonic()
            if leased or remaining <= 0:
                return leased
            await waiter.wait(remaining, gone)
            if wakeups.closing or (gone is not None and gone.done()):
                return []  # leaves without looking again: a wake-up it got goes to the next waiter
            waiter.used = waiter.woken  # it looks again, next time round


async def _claim(db: Database, queue: str, call: LeaseCall) -> list[Row]:
    if not db.settings.coalesce:
        (leased,) = await _claim_shared(db, queue, [call])
        return leased
    # Per queue, and only while calls are in it: queue names come from clients (see Database.sharing).
    with db.sharing(
        ("lease", queue),
        lambda: Batcher(
            partial(_claim_shared, db, queue),
            max_items=MAX_SHARED_CLAIM,
            size=lambda c: c.max_jobs,
            orphaned=partial(_release_orphans, db),
            concurrency=db.settings.coalesce_concurrency,
        ),
    ) as batcher:
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
    keys = _item_keys(ids, tokens)
    async with db.acquire() as conn:
        rows = await conn.fetch(q.RELEASE.text, *q.RELEASE.args(ids=ids, lease_tokens=tokens))
        # The same lease twice: only the first item gave it back.
        released = _row_per_item(keys, rows)
        failed = [job_id for job_id, row in zip(ids, released, strict=True) if row is None]
        states = await _lease_states(conn, failed) if failed else {}
    return [
        {"id": job_id, "ok": True} if row is not None else _refused(job_id, states)
        for job_id, row in zip(ids, released, strict=True)
    ]


def _item_keys(ids: list[int], tokens: list[uuid.UUID | str | None]) -> list[tuple[int, str]]:
    """What tells the items of one ACK, NACK or RELEASE apart: (job id, lease token as text). Several
    items may name one job (a batch, or calls of two workers coalesced); each is answered by whether
    its own token did the deed, never by whether the job changed."""
    return [(job_id, str(token)) for job_id, token in zip(ids, tokens, strict=True)]


def _done(rows: Sequence[asyncpg.Record]) -> dict[tuple[int, str], asyncpg.Record]:
    """The rows of ACK, NACK or RELEASE by the (id, token) that changed each job."""
    return {(r["id"], str(r["lease_token"])): r for r in rows}


def _row_per_item(keys: list[tuple[int, str]], rows: Sequence[asyncpg.Record]) -> list[asyncpg.Record | None]:
    """Per item, in order, the row its own (id, token) changed; an (id, token) repeated in the statement
    gets it once, on its first item (the lease was ended once)."""
    done = _done(rows)
    return [done.pop(key, None) for key in keys]


async def ack_one(db: Database, item: AckRequest) -> Row:
    """One ack, sharing its statement with concurrent acks."""
    return await _shared(db, "ack", ack, item)


async def nack_one(db: Database, item: NackRequest) -> Row:
    """One nack, sharing its statement with concurrent nacks."""
    return await _shared(db, "nack", nack, item)


async def enqueue_one(db: Database, item: EnqueueRequest, once: Once | None = None) -> Row:
    """One enqueue, sharing its INSERT with concurrent single enqueues. A shared statement PostgreSQL
    refused is retried call by call, so each call still succeeds or fails on its own (app/coalesce.py).
    Enqueues with an idempotency key (`once`) share theirs with each other, so the others' statement
    stays ENQUEUE_NEW, with nothing of the keys."""
    if once is None:
        return await _shared(db, "enqueue", enqueue, item)
    answer = await _shared(db, "enqueue_once", _enqueue_singles_once, (item, once))
    if isinstance(answer, JobqError):
        raise answer
    return answer


async def _shared(db: Database, name: str, run: Callable, item: Any) -> Row:
    if not db.settings.coalesce:
        (result,) = await run(db, [item])
        return result
    batcher = db.batcher(
        name,
        lambda: Batcher(
            partial(run, db),
            max_items=MAX_SHARED,
            concurrency=db.settings.coalesce_concurrency,
        ),
    )
    return await batcher.submit(item)


async def ack(db: Database, items: Sequence[AckRequest]) -> list[Row]:
    """Complete each job whose current lease token is given; a result per item, in order."""
    tokens = [_lease_token(i.lease_token) for i in items]
    ids = [i.id for i in items]
    keys = _item_keys(ids, tokens)
    async with db.acquire() as conn:
        acked = await conn.fetch(q.ACK.text, *q.ACK.args(ids=ids, lease_tokens=tokens))
        # An (id, token) twice in one statement is one ack repeated: every such item is done.
        done = _done(acked)
        failed = [job_id for job_id, key in zip(ids, keys, strict=True) if key not in done]
        states = await _lease_states(conn, failed) if failed else {}
    db.metrics.acked.count(acked)
    results = []
    for job_id, key, token in zip(ids, keys, tokens, strict=True):
        if key in done:
            results.append({"id": job_id, "ok": True})
            continue
        state = states.get(job_id)
        repeated = (
            state is not None
            and state["status"] == "completed"
            and token is not None
            and str(state["lease_token"]) == key[1]
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
    tokens = [_lease_token(i.lease_token) for i in items]
    async with db.acquire() as conn:
        rows = await conn.fetch(
            q.NACK.text,
            *q.NACK.args(
                ids=ids,
                lease_tokens=tokens,
                errors=[_error_text(i.error, cut) for i in items],
                retry_afters=[i.retry_after for i in items],
                deads=[i.dead for i in items],
            ),
        )
        # The same lease nacked twice in one statement: only the first item ended it.
        nacked = _row_per_item(_item_keys(ids, tokens), rows)
        failed = [job_id for job_id, row in zip(ids, nacked, strict=True) if row is None]
        states = await _lease_states(conn, failed) if failed else {}
    db.metrics.nacked.count(rows)
    db.metrics.dead_lettered.count([r for r in rows if r["status"] == "dead"])
    return [
        {"id": job_id, "ok": True, "status": row["status"], "run_at": row["run_at"]}
        if row is not None
        else _refused(job_id, states)
        for job_id, row in zip(ids, nacked, strict=True)
    ]


# What PostgreSQL text cannot hold: U+0000, and lone surrogates (a JSON escape such as "\udce9" that
# pairs with nothing), which UTF-8 cannot encode. A worker's error message must not fail its nack: each
# becomes U+FFFD.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _error_text(error: str | None, cut: int) -> str | None:
    """A nack's error as last_error: at most `cut` characters, every one storable."""
    if error is None:
        return None
    return _UNSTORABLE.sub("\ufffd", error[:cut])


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


async def dead_jobs(
    db: Database, queue: str | None, limit: int, before_id: int | None, scope: Scope = None
) -> Row:
    """Dead jobs of `queue`, or of every queue in `scope` (the caller has checked `queue` against it)."""
    before = before_id if before_id is not None else PAST_LAST_ID
    async with db.acquire() as conn:
        if queue is None:
            query, args = q.DEAD_JOBS, q.DEAD_JOBS.args(before_id=before, limit=limit, scope=scope)
        else:
            query, args = (
                q.DEAD_JOBS_IN_QUEUE,
                q.DEAD_JOBS_IN_QUEUE.args(queue=queue, before_id=before, limit=limit),
            )
        rows = await conn.fetch(query.text, *args)
    jobs = [_job(r) for r in rows]
    return {"jobs": jobs, "next_before_id": jobs[-1]["id"] if len(jobs) == limit else None}


async def retry_dead(db: Database, ids: list[int] | None, queue: str | None, scope: Scope = None) -> Row:
    """Dead jobs back to pending, a page at a time; those whose dedup_key is taken are skipped, those
    outside `scope` are left alone (not counted, as jobs that are not dead)."""
    retried, skipped = 0, []
    before = PAST_LAST_ID
    async with db.acquire() as conn:
        while True:
            try:
                rows = await conn.fetch(
                    q.RETRY_DEAD.text,
                    *q.RETRY_DEAD.args(
                        before_id=before, ids=ids, queue=queue, scope=scope, batch=RETRY_BATCH
                    ),
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


async def purge_dead(db: Database, job_id: int, scope: Scope = None) -> Row:
    async with db.acquire() as conn:
        purged = await conn.fetchval(q.PURGE_DEAD.text, *q.PURGE_DEAD.args(id=job_id, scope=scope))
        if purged is None:
            status = await _status_of(conn, job_id, scope)
            raise Conflict(f"job {job_id} is {status}; only dead jobs can be purged", job_status=status)
    return {"id": job_id, "purged": True}


_SETTINGS = ("visibility_timeout", "max_attempts", "backoff_base", "backoff_cap", "retention")


def _queue_row(row: asyncpg.Record, with_settings: bool) -> Row:
    out = {k: v for k, v in row.items() if k not in _SETTINGS}
    if with_settings:
        out["settings"] = {k: row[k] for k in _SETTINGS}
    return out


async def queues(db: Database, scope: Scope = None) -> list[Row]:
    """Every queue's row, or those of the queues in `scope`."""
    async with db.acquire() as conn:
        rows = await conn.fetch(q.QUEUE_STATS.text, *q.QUEUE_STATS.args(queue=None, scope=scope))
    return [_queue_row(r, with_settings=False) for r in rows]


async def _queue_stats(conn: asyncpg.Connection, name: str) -> asyncpg.Record:
    row = await conn.fetchrow(q.QUEUE_STATS.text, *q.QUEUE_STATS.args(queue=name, scope=None))
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
