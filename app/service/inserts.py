"""Inserting jobs: the statements every enqueue runs, with an idempotency key (app/service/idempotency.py)
or without (app/service/producers.py), and the job each insert answers with."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Iterator, Sequence
from datetime import datetime
from typing import Any, TypeVar, overload

import asyncpg
import msgspec
import orjson

from app.core.errors import Invalid, PayloadTooLarge, Unavailable
from app.core.jsontext import (
    WRITE_OPTIONS,
    JSONText,
    NumberOutOfRange,
    any_may_write_out_past,
    encode_json,
    payload_text,
    read_json,
    written_out,
    written_size,
)
from app.db import sql as q
from app.db.pool import Database
from app.service.arguments import NewJobLike
from app.service.rows import Row, Scope, as_job

DEDUP_ROUNDS = 10  # tries of an insert whose dedup keys' holders keep finishing under it


def encode_payloads(requests: Sequence[NewJobLike], limit: int) -> list[str]:
    """Each job's payload as JSON text for PostgreSQL, none over `limit` bytes (PayloadTooLarge), nor
    over it with its numbers written out (Invalid), none with a number jsonb cannot hold (Invalid)."""
    texts = []
    # Payloads read by app/http/fastpath/bodies.py (Raw: the JSON text each job came in) are all of a
    # request's or none; whether any number of theirs may write out past the limit is looked for in all at
    # once.
    fast = [request.payload for request in requests if type(request.payload) is msgspec.Raw]
    look = bool(fast) and any_may_write_out_past(fast, limit)
    for i, request in enumerate(requests):
        payload = request.payload
        try:
            if type(payload) is msgspec.Raw:
                data, size = payload_text(payload, limit, look)
            else:
                data = encode_json(payload)
                size = written_size(data, payload)
        except NumberOutOfRange as exc:
            raise Invalid(f"{_payload_of(i, requests)} {exc}") from None
        if len(data) > limit:
            raise PayloadTooLarge(
                f"{_payload_of(i, requests)} is {len(data)} bytes encoded; the limit is {limit} bytes"
            )
        if size > limit:
            raise Invalid(f"{_payload_of(i, requests)} {written_out(size, limit, _LIMIT_SETTING)}")
        texts.append(data.decode())
    return texts


_LIMIT_SETTING = "JOBQ_MAX_PAYLOAD_BYTES"


def _payload_of(i: int, requests: Sequence[NewJobLike]) -> str:
    return f"jobs[{i}].payload" if len(requests) > 1 else "payload"


def refuse_unstorable_numbers(requests: Sequence[NewJobLike]) -> None:
    """Once PostgreSQL has refused a number (numeric_value_out_of_range): Invalid for the first payload
    that holds one, worded as ``encode_payloads`` words it for a payload the model read. A payload read
    fast is sent as its text, unchecked: checking every one for the rare number past jsonb's range
    (1e131072) would cost every enqueue, where PostgreSQL checks it in any case."""
    for i, request in enumerate(requests):
        if type(request.payload) is msgspec.Raw:
            try:
                encode_json(read_json(bytes(request.payload)))
            except NumberOutOfRange as exc:
                raise Invalid(f"{_payload_of(i, requests)} {exc}") from None


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
        "traceparents": column([r.traceparent for r in requests]),
        "tracestates": column([r.tracestate for r in requests]),
    }


async def insert_new(
    conn: asyncpg.Connection,
    requests: Sequence[NewJobLike],
    payloads: list[str],
    query: q.Query = q.ENQUEUE_NEW,
    **keys: Any,
) -> NewJobs:
    """Insert jobs without dedup keys; the new jobs, in request order. (ENQUEUE_NEW_ONCE and
    ENQUEUE_NEW_EACH_ONCE, with `keys`, also keep the answer under idempotency keys.)"""
    try:
        row = await conn.fetchrow(query.text, *query.args(**_columns(requests, payloads), **keys))
    except asyncpg.NumericValueOutOfRangeError:
        refuse_unstorable_numbers(requests)
        raise
    return NewJobs(requests, payloads, row["ids"], row["run_ats"], row["max_attempts"], row["created_at"])


class NewJobs(Sequence[Row]):
    """The jobs one statement has just inserted, in request order, kept as the columns they came from:
    each job read from it is the Row `new_job` makes, and an answer that holds it (app/http/web.py
    ``JSONBody``) is written by ``json_fragment`` without making those Rows at all.

    An answer to a batch of 1,000 is 1,000 jobs of 21 fields each, and building their dicts and then
    encoding them took longer than anything else the service does for the batch but parse it. Nearly all
    of a job's fields are the same across a batch: a template per shape (queue, kind, key, priority,
    dedup_key, run_at, max_attempts) is encoded once, by the same encoder with the same options, and
    each job is its id and its payload text put into the template."""

    __slots__ = ("requests", "payloads", "ids", "run_ats", "max_attempts", "created_at")

    def __init__(
        self,
        requests: Sequence[NewJobLike],
        payloads: Sequence[str],
        ids: Sequence[int],
        run_ats: Sequence[datetime | None],  # None: the insert time
        max_attempts: Sequence[int],
        created_at: datetime,
    ) -> None:
        self.requests, self.payloads, self.ids = requests, payloads, ids
        self.run_ats, self.max_attempts, self.created_at = run_ats, max_attempts, created_at

    def __len__(self) -> int:
        return len(self.ids)

    @overload
    def __getitem__(self, index: int) -> Row: ...
    @overload
    def __getitem__(self, index: slice) -> NewJobs: ...
    def __getitem__(self, index: int | slice) -> Row | NewJobs:
        if isinstance(index, slice):
            return NewJobs(
                self.requests[index],
                self.payloads[index],
                self.ids[index],
                self.run_ats[index],
                self.max_attempts[index],
                self.created_at,
            )
        return new_job(
            self.requests[index],
            self.payloads[index],
            self.ids[index],
            self.run_ats[index] or self.created_at,
            self.max_attempts[index],
            self.created_at,
        )

    def __iter__(self) -> Iterator[Row]:
        return (self[i] for i in range(len(self.ids)))

    @property
    def queues(self) -> list[str]:
        return [r.queue for r in self.requests]

    def json_fragment(self) -> JSONText:
        """The jobs as a JSON array, exactly as encoding their Rows would write it."""
        templates: dict[tuple, tuple[bytes, bytes]] = {}
        parts = []
        for request, payload, job_id, run_at, max_attempts in zip(
            self.requests, self.payloads, self.ids, self.run_ats, self.max_attempts, strict=True
        ):
            r = request
            shape = (
                r.queue,
                r.kind,
                r.key,
                r.priority,
                r.dedup_key,
                run_at,
                max_attempts,
                r.traceparent,
                r.tracestate,
            )
            template = templates.get(shape)
            if template is None:
                template = templates[shape] = self._template(request, run_at, max_attempts)
            before, after = template
            parts.append(b'{"id":%d%b%b%b' % (job_id, before, payload.encode(), after))
        return JSONText(b"[" + b",".join(parts) + b"]")

    def _template(
        self, request: NewJobLike, run_at: datetime | None, max_attempts: int
    ) -> tuple[bytes, bytes]:
        """What a job of this shape writes between its id and its payload, and after its payload."""
        row = new_job(request, "null", 0, run_at or self.created_at, max_attempts, self.created_at)
        del row["id"]
        fields = list(row)
        cut = fields.index("payload")
        head = orjson.dumps({k: row[k] for k in fields[:cut]}, option=WRITE_OPTIONS)
        tail = orjson.dumps({k: row[k] for k in fields[cut + 1 :]}, option=WRITE_OPTIONS)
        return b"," + head[1:-1] + b',"payload":', b"," + tail[1:]


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
        try:
            rows = await conn.fetch(
                q.ENQUEUE.text,
                *q.ENQUEUE.args(
                    **_columns(chosen, [payloads[unique[k]] for k in todo]),
                    dedup_keys=[r.dedup_key for r in chosen],
                ),
            )
        except asyncpg.NumericValueOutOfRangeError:
            refuse_unstorable_numbers(requests)
            raise
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


LINK_ROUNDS = 10  # transactions tried, making jobs with parents, while their parents are being ended
Made = TypeVar("Made")


async def linked(db: Database, make: Callable[[asyncpg.Connection], Awaitable[Made]]) -> Made:
    """`make` (which inserts jobs with parents: insert_waiting) in a transaction of its own, made again in
    a new one when jobq.add_parents() gave up waiting for a parent's row that another statement held
    (lock_not_available: an ack of many parents may take their rows in another order than it does, and
    would deadlock with it; app/db/functions.sql says why). Unavailable after LINK_ROUNDS tries."""
    for tried in range(1, LINK_ROUNDS + 1):
        try:
            async with db.acquire() as conn:
                async with conn.transaction():
                    return await make(conn)
        except asyncpg.LockNotAvailableError:
            await asyncio.sleep(random.uniform(0, 0.01 * tried))
    raise Unavailable("the parents named kept being ended as their children were linked to them; retry")


async def insert_waiting(
    conn: asyncpg.Connection,
    requests: Sequence[NewJobLike],
    payloads: list[str],
    workflow_id: int | None = None,
    ids: list[int] | None = None,
    scope: Scope = None,
) -> list[Row]:
    """Insert jobs some of which have parents, in the caller's transaction: those `waiting`, linked to
    their parents (ADD_PARENTS), which decides at once the ones whose parents have all ended. The jobs as
    they are then, in request order. A parent that is no job: Invalid, naming every such id; so is one
    outside `scope`, the queues of the caller's token (a child carries its parents' results). `ids`: the
    jobs' ids, drawn beforehand (a workflow's); None draws them."""
    columns = _columns(requests, payloads)
    parents = [None if r.depends_on is None else _id_array(r.depends_on) for r in requests]
    run_ifs = [r.run_if for r in requests]
    try:
        rows = await conn.fetch(
            q.ENQUEUE_WAITING.text,
            *q.ENQUEUE_WAITING.args(
                **columns,
                parents=parents,
                run_ifs=None if run_ifs.count(None) == len(run_ifs) else run_ifs,
                workflow_id=workflow_id,
                ids=ids,
            ),
        )
    except asyncpg.NumericValueOutOfRangeError:
        refuse_unstorable_numbers(requests)
        raise
    if scope is not None:
        named = [p for p in parents if p is not None]
        hidden = await conn.fetchval(
            q.PARENTS_OUT_OF_SCOPE.text, *q.PARENTS_OUT_OF_SCOPE.args(parents=named, scope=scope)
        )
        if hidden:
            raise Invalid(f"depends_on names jobs that do not exist: {', '.join(map(str, hidden))}")
    ids = [row["id"] for row in rows]
    children = [(i, r.delay) for i, r in zip(ids, requests, strict=True) if r.depends_on is not None]
    try:
        await conn.execute(
            q.ADD_PARENTS.text,
            *q.ADD_PARENTS.args(ids=[c[0] for c in children], delays=[c[1] for c in children]),
        )
    except asyncpg.ForeignKeyViolationError as exc:
        unknown = (exc.detail or "").replace(",", ", ")
        raise Invalid(f"depends_on names jobs that do not exist: {unknown}") from None
    jobs = await conn.fetch(q.GET_JOBS.text, *q.GET_JOBS.args(ids=ids))
    return [as_job(row) | {"duplicate": False} for row in jobs]


def _id_array(ids: Sequence[int]) -> str:
    """Job ids as the text of a PostgreSQL array: a batch's jobs each have a list of parents of its own
    length, which no two-dimensional array holds, so each list goes as one text element."""
    return "{" + ",".join(str(int(i)) for i in ids) + "}"


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
        "worker_id": None,
        "traceparent": request.traceparent,
        "tracestate": request.tracestate,
        "depends_on": None,
        "run_if": None,
        "workflow_id": None,
        "delivery": None,
        "steps": None,
        "events": None,
        "waiting_for": None,
        "sleeping_until": None,
        "duplicate": False,
    }
