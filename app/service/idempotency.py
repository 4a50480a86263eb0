"""Idempotency keys: an enqueue sent again under its `Idempotency-Key` is carried out once (see `Once`).

A repeat's answer is rebuilt from the request and what the database kept of the first answer: the ids, run_ats
and max_attempts it decided, and whole only the answers the request cannot rebuild (a duplicate's: another
job). Keys past their expiry are pruned by the background loop (app/service/loops/background.py)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg
import orjson

from app.core.errors import Conflict, JobqError, PayloadTooLarge, Unavailable
from app.core.jsontext import WRITE_OPTIONS, JSONText
from app.db import sql as q
from app.db.pool import Database
from app.service.arguments import NewJobLike
from app.service.inserts import encode_payloads, insert_deduplicated, insert_new, new_job
from app.service.rows import Row
from app.service.runtime import Runtime
from app.service.upkeep import prune_in_batches

KEY_ROUNDS = 10  # tries of a keyed insert whose keys keep being taken (or expiring) under it


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


@dataclass(frozen=True, slots=True)
class Keyed:
    """One enqueue call under an idempotency key: its jobs, their payloads as stored, and `digest`, what
    a repeat must match (see keyed)."""

    requests: Sequence[NewJobLike]
    payloads: list[str]
    once: Once
    digest: bytes


def keyed(requests: Sequence[NewJobLike], payloads: list[str], once: Once) -> Keyed:
    """The call, with the SHA-256 of its route and of every field of every job (payloads as stored: the
    request's spacing does not matter, its values do). A field added later (`kind`, `key`) is hashed only when
    given, so a request without it hashes as it did before: its retry may reach an older replica, or
    one of this build may answer a retry of a request an older replica carried out. The trace context
    is not hashed: a client's retry is a span of its own (the job keeps the first one's)."""
    fields = [
        once.route,
        [
            [r.queue, p, r.priority, r.run_at, r.delay, r.max_attempts, r.dedup_key]
            + ([] if r.kind is None else [r.kind])
            + ([] if r.key is None else [["key", r.key]])
            + ([] if r.depends_on is None else [["depends_on", list(r.depends_on), r.run_if]])
            + (
                []
                if r.debounce is None
                else [["debounce", r.debounce.key, r.debounce.seconds, r.debounce.max_seconds]]
            )
            for r, p in zip(requests, payloads, strict=True)
        ],
    ]
    return Keyed(requests, payloads, once, hashlib.sha256(orjson.dumps(fields)).digest())


async def enqueue_singles_once(
    runtime: Runtime, items: Sequence[tuple[NewJobLike, Once]]
) -> list[Row | JobqError]:
    """Single keyed enqueues in one statement: each call's job, or the error that is its own answer."""
    limit = runtime.settings.max_payload_bytes
    calls: list[Keyed] = []
    place: list[int | JobqError] = []  # per item: its index in `calls`, or its error
    for request, once in items:
        try:
            place.append(len(calls))
            calls.append(keyed([request], encode_payloads([request], limit), once))
        except PayloadTooLarge as exc:
            place[-1] = exc
    answers = await enqueue_once(runtime, calls) if calls else []
    out: list[Row | JobqError] = []
    for p in place:
        answer = p if isinstance(p, JobqError) else answers[p]
        out.append(answer if isinstance(answer, JobqError) else answer[0])
    return out


async def enqueue_once(runtime: Runtime, calls: list[Keyed]) -> list[list[Row] | JobqError]:
    """Carry out keyed calls together, each at most once; per call, its answer or its Conflict.

    The jobs and the keys go in one statement (or transaction). When a key is already there, that fails
    on the key's primary key and inserts nothing: the calls whose keys were answered before get the
    kept answers (or Conflict, for another request under the key), and the others are inserted again.
    """
    ttl = runtime.settings.idempotency_ttl
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
        async with runtime.db.acquire() as conn:
            try:
                inserted, new = await _insert_keyed(runtime, conn, chosen)
            except asyncpg.UniqueViolationError as exc:
                if exc.constraint_name != "pk_idempotency_keys":
                    raise
                kept = await _kept_answers(conn, chosen)
        if kept is None:
            runtime.metrics.enqueued.count(new)
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
    runtime: Runtime, conn: asyncpg.Connection, calls: list[Keyed]
) -> tuple[list[list[Row]], list[Row]]:
    """Insert the calls' jobs and keep each call's answer under its key, in one statement (ENQUEUE_NEW
    with one more CTE) or, with dedup keys, one more statement in ENQUEUE's transaction. The calls are
    one call, or single enqueues sharing a statement. The answers per call, and the jobs inserted."""
    requests = [r for call in calls for r in call.requests]
    payloads = [p for call in calls for p in call.payloads]
    ttl = runtime.settings.idempotency_ttl
    keys = {
        "scopes": [call.once.scope for call in calls],
        "keys": [call.once.key for call in calls],
        "request_hashes": [call.digest for call in calls],
    }
    if all(r.dedup_key is None for r in requests):
        if len(calls) == 1:
            one = {"scope": calls[0].once.scope, "key": calls[0].once.key, "request_hash": calls[0].digest}
            answers = await insert_new(conn, requests, payloads, q.ENQUEUE_NEW_ONCE, ttl=ttl, **one)
        else:
            assert len(requests) == len(calls), "shared statements hold single enqueues"
            answers = await insert_new(conn, requests, payloads, q.ENQUEUE_NEW_EACH_ONCE, ttl=ttl, **keys)
        new = answers
    else:
        calls_of = [n for n, call in enumerate(calls, 1) for _ in call.requests]
        async with conn.transaction():
            answers, results = await insert_deduplicated(conn, requests, payloads)
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
    JSON text, exactly as an answer writes it (a duplicate shows another job, which the request cannot
    rebuild)."""
    columns: dict[str, list] = {"ids": [], "run_ats": [], "max_attempts": [], "holders": []}
    for answer in answers:
        columns["ids"].append(answer["id"])
        duplicate = answer["duplicate"]
        run_at = None if duplicate or answer["run_at"] == answer["created_at"] else answer["run_at"]
        columns["run_ats"].append(run_at)
        columns["max_attempts"].append(None if duplicate else answer["max_attempts"])
        columns["holders"].append(orjson.dumps(answer, option=WRITE_OPTIONS).decode() if duplicate else None)
    return columns


async def _kept_answers(
    conn: asyncpg.Connection, calls: list[Keyed]
) -> dict[tuple[str, str], asyncpg.Record]:
    rows = await conn.fetch(
        q.ANSWERS.text,
        *q.ANSWERS.args(scopes=[c.once.scope for c in calls], keys=[c.once.key for c in calls]),
    )
    return {(r["scope"], r["key"]): r for r in rows}


def _replay(call: Keyed, kept: asyncpg.Record, ttl: float) -> list[Row] | JobqError:
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
        else new_job(request, payload, job_id, run_at or created_at, max_attempts, created_at)
        for request, payload, job_id, run_at, max_attempts, holder in zip(
            call.requests, call.payloads, ids, run_ats, kept["max_attempts"], holders, strict=True
        )
    ]


_DECODER = json.JSONDecoder()


def as_answered_jobs(text: bytes) -> list[Row]:
    """Job answers kept whole as a JSON array (orjson's), each as _as_answered makes it."""
    decoded, rows, i = text.decode(), [], 1  # past "["
    while decoded[i] != "]":
        _, end = _DECODER.raw_decode(decoded, i)
        rows.append(_as_answered(decoded[i:end]))
        i = end + (decoded[end] == ",")
    return rows


def _as_answered(text: str) -> Row:
    """A job answer kept as JSON text (orjson's: no whitespace between members), as a Row that writes out
    exactly that text: each member's value as written, but `id`, `duplicate` and `debounced`, which callers
    read."""
    row: Row = {}
    i = 1  # past "{"
    while text[i] != "}":
        name, i = json.decoder.scanstring(text, i + 1)  # type: ignore[attr-defined]
        start = i + 1  # past ":"
        value, i = _DECODER.raw_decode(text, start)
        row[name] = value if name in ("id", "duplicate", "debounced") else JSONText(text[start:i])
        i += text[i] == ","
    return row


async def claim(conn: asyncpg.Connection, once: Once, digest: bytes, ttl: float) -> bytes | None:
    """For a request whose answer cannot be rebuilt from it (a workflow, jobs with parents or debounce),
    in the transaction that will carry it out: take its key (None: carry it out, then `keep` the answer),
    or the answer kept under the key when this request was carried out before (Conflict when the key was
    first sent with another). A second request under the key waits here for the first to commit."""
    for _ in range(KEY_ROUNDS):
        claimed = await conn.fetchval(
            q.CLAIM_KEY.text,
            *q.CLAIM_KEY.args(scope=once.scope, key=once.key, request_hash=digest, ttl=ttl),
        )
        if claimed is not None:
            return None
        kept = await conn.fetchrow(q.KEPT_KEY.text, *q.KEPT_KEY.args(scope=once.scope, key=once.key))
        if kept is None or not kept["live"]:
            await conn.execute(
                q.FREE_EXPIRED_KEY.text, *q.FREE_EXPIRED_KEY.args(scope=once.scope, key=once.key)
            )
            continue
        if kept["request_hash"] != digest or kept["answer"] is None:
            raise _reused(once, ttl)
        return kept["answer"].encode()
    raise Unavailable("idempotency keys kept changing hands; retry the request")


async def keep(conn: asyncpg.Connection, once: Once, answer: str, ids: Sequence[int]) -> None:
    """Keep a claimed request's answer (JSON text, as sent) and the ids it made under its key."""
    await conn.execute(
        q.KEEP_ANSWER.text, *q.KEEP_ANSWER.args(answer=answer, ids=list(ids), scope=once.scope, key=once.key)
    )


def _reused(once: Once, ttl: float) -> Conflict:
    return Conflict(
        f"Idempotency-Key {once.key!r} was first sent with another request (other jobs, or to another "
        f"route) in the last {ttl:g} s; a new request needs a new key"
    )


async def prune_idempotency_keys(db: Database) -> int:
    """Forget idempotency keys past their expiry, in bounded batches; how many went."""
    return await prune_in_batches(db, q.PRUNE_IDEMPOTENCY_KEYS)
