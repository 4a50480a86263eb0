"""Workers' operations once they have leased jobs (app/service/leasing.py): end each lease (ack, nack,
release) or extend it.

Every call after the lease names a job and the lease token the lease handed out, and changes the job only
under that token (the statements' guards, app/db/sql/ends.py). Each item of a batch is answered on its own
(`ok`, or the `code` of why not); one-item calls raise that answer as an error (``single``).
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Sequence

import asyncpg

from app.core.errors import Invalid, JobqError, LeaseLost, NotFound, PayloadTooLarge
from app.core.jsontext import NumberOutOfRange, encode_json, written_out, written_size
from app.core.tokens import parse_token
from app.db import sql as q
from app.db.pool import Database
from app.service.arguments import AckLike, JobLeaseLike, NackLike
from app.service.coalesce import Shared
from app.service.rows import Row, job_status
from app.service.runtime import Runtime
from app.telemetry import tracing
from app.telemetry.metrics import PerQueue

Tokens = list[uuid.UUID | str | None]


def _leases(items: Sequence[JobLeaseLike]) -> tuple[list[int], list[str | None], Tokens]:
    """The items' job ids, and the queues and UUIDs their lease tokens carry (app/core/tokens.py)."""
    parsed = [parse_token(i.lease_token) for i in items]
    return [i.id for i in items], [queue for _, queue in parsed], [token for token, _ in parsed]


async def _with_queues(
    conn: asyncpg.Connection, ids: list[int], queues: list[str | None]
) -> list[str | None]:
    """`queues`, with the queue of each job whose token did not name it (a bare UUID, as jobq issued
    before tokens named their queue) looked up by id; None for a job that does not exist."""
    if None not in queues:
        return queues
    missing = [job_id for job_id, queue in zip(ids, queues, strict=True) if queue is None]
    found = dict(await conn.fetch(q.JOB_QUEUES.text, *q.JOB_QUEUES.args(ids=missing)))
    return [found.get(job_id) if queue is None else queue for job_id, queue in zip(ids, queues, strict=True)]


# --- ending a lease: ack, nack, release ------------------------------------------------------------


def _item_keys(ids: list[int], tokens: Tokens) -> list[tuple[int, str]]:
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


async def _lease_status(conn: asyncpg.Connection, ids: list[int]) -> dict[int, asyncpg.Record]:
    """Each job's status and lease token, for the items a guarded statement left alone."""
    rows = await conn.fetch(q.LEASE_STATUS.text, *q.LEASE_STATUS.args(ids=ids))
    return {r["id"]: r for r in rows}


def _refused(job_id: int, leases: dict[int, asyncpg.Record]) -> Row:
    """The result of an item whose lease did not match: the job exists (lease lost) or it does not."""
    return {"id": job_id, "ok": False, "code": "lease_lost" if job_id in leases else "not_found"}


def single(result: Row) -> Row:
    """The answer of a one-item ack or nack, or its error."""
    if result["ok"]:
        return result
    if result["code"] == "not_found":
        raise NotFound(f"job {result['id']} does not exist")
    raise LeaseLost(f"job {result['id']} is not held under this lease token (it expired, or was ended)")


# --- results and progress: JSON a worker sends to keep with its job ----------------------------------

# A NUL character, as JSON text escapes it (orjson writes U+0000 so): jsonb cannot hold it. An escaped
# backslash before the "u" (`\\u0000`, the six characters) is another string, and is fine.
_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


def _json_text(
    value: object, limit: int, what: str, again: str, setting: str = "JOBQ_MAX_RESULT_BYTES"
) -> str | None:
    """`value` (any JSON value; None: none) as the JSON text to keep, at most `limit` bytes (the
    `setting`): PayloadTooLarge past it, Invalid past it once its numbers are written out, Invalid for
    text jsonb cannot hold. Checked before anything is sent, so a refused value changes nothing; the
    detail says what to send instead (`again`)."""
    if value is None:
        return None
    try:
        data = encode_json(value)
    except UnicodeEncodeError:  # a lone surrogate ("\udce9"), which no UTF-8 text can hold
        raise Invalid(f"{what} holds a lone surrogate (a \\uD800-\\uDFFF escape): {again}") from None
    except NumberOutOfRange as exc:
        raise Invalid(f"{what} {exc}: {again}") from None
    if len(data) > limit:
        raise PayloadTooLarge(
            f"{what} is {len(data)} bytes encoded; the limit is {limit} bytes ({setting}):"
            f" nothing changed, {again}"
        )
    if (size := written_size(data, value)) > limit:
        raise Invalid(f"{what} {written_out(size, limit, setting)}; nothing changed, {again}")
    if b"\\u0000" in data and _NUL.search(data):
        raise Invalid(f"{what} holds a NUL character (\\u0000), which PostgreSQL cannot store: {again}")
    return data.decode()


def _result_text(item: JobLeaseLike | AckLike, result: object, limit: int) -> str | None:
    """An ack's result as JSON text to keep (None: no result)."""
    return _json_text(
        result,
        limit,
        f"the result of job {item.id}",
        "the job is still running under this lease; ack again without the result or with a smaller one",
    )


# --- ack -------------------------------------------------------------------------------------------


async def ack(runtime: Runtime, item: JobLeaseLike | AckLike, delivery: str | None = None) -> Row:
    """One ack, sharing its statement with concurrent acks. Its result is checked first: refused (over
    the limit, PayloadTooLarge), nothing is sent, and the job stays running under its lease. `delivery`:
    a push delivery's outcome as JSON text (app/service/push.py), kept with the job."""
    result = getattr(item, "result", None)  # a plain JobLease has none
    text = None if result is None else _result_text(item, result, runtime.settings.max_result_bytes)
    return await runtime.coalescing.submit(ACKS, (item, text, delivery))


async def _ack_shared(
    runtime: Runtime, calls: Sequence[tuple[JobLeaseLike, str | None, str | None]]
) -> list[Row]:
    """The acks of concurrent calls, each with its result as JSON text (or None) and its delivery's
    outcome (or None), in one ACK."""
    deliveries = [delivery for _, _, delivery in calls]
    return await _ack(
        runtime,
        [item for item, _, _ in calls],
        [text for _, text, _ in calls],
        None if deliveries.count(None) == len(deliveries) else deliveries,
    )


ACKS = Shared("ack", _ack_shared)


async def ack_batch(runtime: Runtime, items: Sequence[JobLeaseLike | AckLike]) -> list[Row]:
    """Complete each job whose current lease token is given, keeping its result; a result per item, in
    order. An item whose result is refused (payload_too_large, validation_error) changes nothing and
    is answered so, as an item with a lost lease is; the others complete."""
    values = [getattr(i, "result", None) for i in items]
    if values.count(None) == len(values):  # no results, as in most acks: nothing to encode or check
        return await _ack(runtime, items, None)
    limit = runtime.settings.max_result_bytes
    kept: list[int] = []  # places of the items that go to ACK
    texts: list[str | None] = []
    refused: dict[int, Row] = {}  # by place
    for n, (item, value) in enumerate(zip(items, values, strict=True)):
        try:
            text = None if value is None else _result_text(item, value, limit)
        except JobqError as exc:
            refused[n] = {"id": item.id, "ok": False, "code": exc.code}
            continue
        kept.append(n)
        texts.append(text)
    done = await _ack(runtime, [items[n] for n in kept], texts) if kept else []
    answers = dict(zip(kept, done, strict=True)) | refused
    return [answers[n] for n in range(len(items))]


async def _ack(
    runtime: Runtime,
    items: Sequence[JobLeaseLike],
    texts: list[str | None] | None,
    deliveries: list[str | None] | None = None,
) -> list[Row]:
    """ACK: complete each job under its lease token, with its result (JSON text; None: none). `texts`
    is None, or all None, for a statement without results: ACK then gets NULL, and no more work; so
    `deliveries` (push deliveries' outcomes) for a worker's acks."""
    ids, queues, tokens = _leases(items)
    keys = _item_keys(ids, tokens)
    sent = None if texts is None or texts.count(None) == len(texts) else texts
    started = time.time_ns()
    async with runtime.db.acquire() as conn:
        queues = await _with_queues(conn, ids, queues)
        acked = await conn.fetch(
            q.ACK.text,
            *q.ACK.args(ids=ids, queues=queues, lease_tokens=tokens, results=sent, deliveries=deliveries),
        )
        # An (id, token) twice in one statement is one ack repeated: every such item is done.
        done = _done(acked)
        failed = [job_id for job_id, key in zip(ids, keys, strict=True) if key not in done]
        leases = await _lease_status(conn, failed) if failed else {}
    runtime.metrics.acked.count(acked)
    tracing.record("ack", acked, started)
    results = []
    for job_id, key, token in zip(ids, keys, tokens, strict=True):
        if key in done:
            results.append({"id": job_id, "ok": True})
            continue
        now = leases.get(job_id)
        repeated = (
            now is not None
            and now["status"] == "completed"
            and token is not None
            and str(now["lease_token"]) == key[1]
        )
        if repeated:  # a repeated ack: already done, by this lease
            results.append({"id": job_id, "ok": True})
        else:
            results.append(_refused(job_id, leases))
    return results


async def nack(runtime: Runtime, item: NackLike, delivery: str | None = None) -> Row:
    """One nack, sharing its statement with concurrent nacks (NACKS); `delivery` as for ack."""
    return await runtime.coalescing.submit(NACKS, (item, delivery))


async def _nack_shared(runtime: Runtime, calls: Sequence[tuple[NackLike, str | None]]) -> list[Row]:
    deliveries = [delivery for _, delivery in calls]
    kept = None if deliveries.count(None) == len(deliveries) else deliveries
    return await nack_batch(runtime, [item for item, _ in calls], kept)


async def nack_batch(
    runtime: Runtime, items: Sequence[NackLike], deliveries: list[str | None] | None = None
) -> list[Row]:
    """Give jobs back after a failed attempt: retry later, or dead. A result per item, in order.
    `deliveries`: push deliveries' outcomes (JSON text) to keep with the jobs; None for a worker's."""
    cut = runtime.settings.max_error_chars
    ids, queues, tokens = _leases(items)
    started = time.time_ns()
    async with runtime.db.acquire() as conn:
        queues = await _with_queues(conn, ids, queues)
        rows = await conn.fetch(
            q.NACK.text,
            *q.NACK.args(
                ids=ids,
                queues=queues,
                lease_tokens=tokens,
                errors=[_error_text(i.error, cut) for i in items],
                retry_afters=[i.retry_after for i in items],
                deads=[i.dead for i in items],
                deliveries=deliveries,
            ),
        )
        # The same lease nacked twice in one statement: only the first item ended it.
        nacked = _row_per_item(_item_keys(ids, tokens), rows)
        failed = [job_id for job_id, row in zip(ids, nacked, strict=True) if row is None]
        leases = await _lease_status(conn, failed) if failed else {}
    runtime.metrics.nacked.count(rows)
    dead = [r for r in rows if r["status"] == "dead"]
    runtime.metrics.dead_lettered.count(dead)
    tracing.record("nack", rows, started)
    tracing.record("dead-letter", dead, started)
    return [
        {"id": job_id, "ok": True, "status": row["status"], "run_at": row["run_at"]}
        if row is not None
        else _refused(job_id, leases)
        for job_id, row in zip(ids, nacked, strict=True)
    ]


NACKS = Shared("nack", _nack_shared)


# What PostgreSQL text cannot hold: U+0000, and lone surrogates (a JSON escape such as "\udce9" that
# pairs with nothing), which UTF-8 cannot encode. A worker's error message must not fail its nack: each
# becomes U+FFFD.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _error_text(error: str | None, cut: int) -> str | None:
    """A nack's error as last_error: at most `cut` characters, every one storable."""
    if error is None:
        return None
    return _UNSTORABLE.sub("\ufffd", error[:cut])


async def release(
    db: Database,
    items: Sequence[JobLeaseLike],
    delays: list[float | None] | None = None,
    deliveries: list[str | None] | None = None,
    slept: PerQueue | None = None,
) -> list[Row]:
    """Give running jobs back untouched, under their current lease tokens: pending again at once (or,
    with `delays`, that many seconds from now), the attempt not counted (a worker that took more than
    it will start, or is stopping before it starts; a push its endpoint wants again later; a durable
    sleep). A result per item, in order, like ack_batch. `deliveries` as for nack_batch; `slept` counts
    the jobs released with a delay, per queue."""
    ids, queues, tokens = _leases(items)
    keys = _item_keys(ids, tokens)
    async with db.acquire() as conn:
        queues = await _with_queues(conn, ids, queues)
        rows = await conn.fetch(
            q.RELEASE.text,
            *q.RELEASE.args(
                ids=ids, queues=queues, lease_tokens=tokens, delays=delays, deliveries=deliveries
            ),
        )
        # The same lease twice: only the first item gave it back.
        released = _row_per_item(keys, rows)
        failed = [job_id for job_id, row in zip(ids, released, strict=True) if row is None]
        leases = await _lease_status(conn, failed) if failed else {}
    if slept is not None and delays is not None:
        slept.count_queues(
            [row["queue"] for row, delay in zip(released, delays, strict=True) if row is not None and delay]
        )
    return [
        {"id": job_id, "ok": True} if row is not None else _refused(job_id, leases)
        for job_id, row in zip(ids, released, strict=True)
    ]


async def release_to_sleep(runtime: Runtime, items: Sequence[JobLeaseLike]) -> list[Row]:
    """A worker's release (POST /release): each item pending again at once, or after its `delay` (a
    durable sleep, app/service/durable.py), the attempt not counted; sleeps counted per queue. Items read
    by the fast reader (app/http/fastpath/bodies.py) carry no delay."""
    delays = [getattr(item, "delay", None) for item in items]
    if delays.count(None) == len(delays):
        return await release(runtime.db, items)
    return await release(runtime.db, items, delays=delays, slept=runtime.metrics.sleeps)


# --- extend ----------------------------------------------------------------------------------------


async def extend(
    db: Database, job_id: int, lease_token: str, visibility_timeout: float, progress: object = None
) -> Row:
    """Move the lease's deadline to now + visibility_timeout; LeaseLost unless it is the current lease.
    `progress` (any JSON value; None keeps the last one) becomes the job's progress, checked first
    like an ack's result: refused, nothing changes. A worker that only reports progress gives its
    lease's visibility_timeout again."""
    text = _json_text(
        progress,
        db.settings.max_result_bytes,
        f"the progress of job {job_id}",
        "the lease is as it was; extend again without progress or with a smaller one",
    )
    token, queue = parse_token(lease_token)
    async with db.acquire() as conn:
        (queue,) = await _with_queues(conn, [job_id], [queue])
        row = await conn.fetchrow(
            q.EXTEND.text,
            *q.EXTEND.args(
                id=job_id,
                queue=queue,
                lease_token=token,
                visibility_timeout=visibility_timeout,
                progress=text,
            ),
        )
        if row is None:
            await job_status(conn, job_id)
            raise LeaseLost(f"job {job_id} is not running under this lease token")
    return dict(row)
