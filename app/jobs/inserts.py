"""Inserting jobs: the statements every enqueue runs, with an idempotency key (app/jobs/idempotency.py)
or without (app/jobs/producers.py), and the job each insert answers with."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg

from app import queries as q
from app.errors import PayloadTooLarge, Unavailable
from app.jobs.arguments import NewJobLike
from app.jobs.rows import Row, as_job
from app.jsontext import JSONText, encode_json

DEDUP_ROUNDS = 10  # tries of an insert whose dedup keys' holders keep finishing under it


def encode_payloads(requests: Sequence[NewJobLike], limit: int) -> list[str]:
    """Each job's payload as JSON text for PostgreSQL, none over `limit` bytes."""
    texts = []
    for i, request in enumerate(requests):
        data = encode_json(request.payload)
        if len(data) > limit:
            where = f"jobs[{i}].payload" if len(requests) > 1 else "payload"
            raise PayloadTooLarge(f"{where} is {len(data)} bytes encoded; the limit is {limit} bytes")
        texts.append(data.decode())
    return texts


def _columns(requests: Sequence[NewJobLike], payloads: list[str]) -> dict[str, list | None]:
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
        "kinds": column([r.kind for r in requests]),
        "job_keys": column([r.key for r in requests]),
    }


async def insert_new(
    conn: asyncpg.Connection,
    requests: Sequence[NewJobLike],
    payloads: list[str],
    query: q.Query = q.ENQUEUE_NEW,
    **keys: Any,
) -> list[Row]:
    """Insert jobs without dedup keys; the new jobs, in request order. (ENQUEUE_NEW_ONCE and
    ENQUEUE_NEW_EACH_ONCE, with `keys`, also keep the answer under idempotency keys.)"""
    row = await conn.fetchrow(query.text, *query.args(**_columns(requests, payloads), **keys))
    created_at = row["created_at"]
    return [
        new_job(request, payload, job_id, run_at or created_at, max_attempts, created_at)
        for request, payload, job_id, run_at, max_attempts in zip(
            requests, payloads, row["ids"], row["run_ats"], row["max_attempts"], strict=True
        )
    ]


async def insert_deduplicated(
    conn: asyncpg.Connection, requests: Sequence[NewJobLike], payloads: list[str]
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
    await _insert_or_find_holders(conn, requests, payloads, unique, results)
    answers = [
        {**results[index], "duplicate": True} if repeated else results[index]  # type: ignore[dict-item]
        for index, repeated in source
    ]
    return answers, results  # type: ignore[return-value]


async def _insert_or_find_holders(
    conn: asyncpg.Connection,
    requests: Sequence[NewJobLike],
    payloads: list[str],
    unique: list[int],
    results: list[Row | None],
) -> None:
    """ENQUEUE the `unique` requests; each one whose dedup_key an active job holds is answered by that
    job (DEDUP_HOLDERS), as a duplicate."""
    todo = list(range(len(unique)))
    # A holder found in conflict may finish before we read it, freeing its key: then insert again.
    for _ in range(DEDUP_ROUNDS):
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
                results[k] = new_job(
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
                results[k] = as_job(by_key[key]) | {"duplicate": True}
            else:
                todo.append(k)
        if not todo:
            return
    raise Unavailable("dedup keys kept changing hands; retry the request")


def new_job(
    request: NewJobLike,
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
        "kind": request.kind,
        "key": request.key,
        "status": "pending",
        "payload": JSONText(payload),
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
        "result": None,
        "progress": None,
        "schedule": None,
        "schedule_slot": None,
        "duplicate": False,
    }
