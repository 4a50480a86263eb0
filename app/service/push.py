"""Push delivery: the service is the worker of a queue with a push target, and POSTs each of its jobs to
an HTTP endpoint (API part 7). The loop that does it on each replica is app/service/loops/pusher.py;
here are its parts: a queue's target and secrets, the claim of deliveries, one delivery, and what its
answer does to the job.

The model. A delivery is a lease like any worker's (the claim statements of app/db/sql/claim.py, flow
control's included), taken under the worker id `push:<host>:<pid>` for the target's `timeout` plus
LEASE_SLACK seconds; priorities, delays, pause, attempts, backoff, dead letters, keys, fairness and
rates all apply as they do for workers. The job is then POSTed, signed as Standard Webhooks specifies
(the `standardwebhooks` library signs; `webhook-id` is `job_<id>`, the same on every attempt, so that an
endpoint can deduplicate), and the answer ends the lease as a worker's call would:

- `2xx`: ack. A JSON body of at most JOBQ_MAX_RESULT_BYTES becomes the job's result; a larger one, or
  one that is not JSON, is not kept, and the job's `delivery` says why (the job is completed all the
  same: the endpoint did the work).
- `429` or `503` with `Retry-After` (seconds, or an HTTP date; at most MAX_RETRY_AFTER): release, the
  attempt not counted, the job pending again after that delay; and the job's key, or for a job without
  one the whole queue, is held as long (no delivery of it on any replica before then: PUSH_GATE).
- Anything else (another status, a redirect, which is never followed, a timeout, a refused connection,
  a TLS failure): nack, with `last_error` saying what happened (`HTTP 500: <start of the body>`), and
  the queue's backoff.

A delivery costs at most the target's `timeout`, however the endpoint answers (slowly, a byte at a time,
or without end): the whole exchange runs under that deadline, and at most MAX_RESULT_BYTES + 1 bytes of
the answer are read. A replica that is killed mid-delivery leaves leases that expire, and the jobs are
delivered again with the same `webhook-id`; one that stops gracefully waits JOBQ_PUSH_STOP_GRACE seconds
for its deliveries in flight, then gives the rest back, their attempts not counted.

`concurrency` holds across replicas: a claim of deliveries runs under the queue's push lock, counts the
queue's deliveries in flight on every replica (their leases, by the push worker id: a slot is a live
lease, as a key's slot is a running job, freed by whatever ends it, its expiry included), and claims at
most what is left. Workers' leases of the same queue take no slot: they send the endpoint nothing.
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import logging
import math
import os
import socket
import ssl
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlsplit

import asyncpg
import orjson
from standardwebhooks import Webhook

from app import __version__
from app.core.errors import Invalid, JobqError
from app.core.jsontext import WRITE_OPTIONS, read_json, written
from app.db import sql as q
from app.db.pool import Database, transaction_with
from app.service import outbound
from app.service.arguments import Ack, JobLease, Nack, PushSettingsLike
from app.service.flow import lease_flow, queue_flow
from app.service.parents import attach_parents
from app.service.rows import Row, as_job
from app.service.runtime import Runtime
from app.service.workers import ack, nack, release
from app.settings import Settings
from app.telemetry import tracing

log = logging.getLogger("jobq.push")

# Seconds a delivery's lease outlasts its timeout: the answer is read, and the lease ended, within it.
LEASE_SLACK = 5.0
# Seconds the secret a rotation replaced stays valid.
SECRET_OVERLAP = 24 * 3600
# Longest Retry-After taken, in seconds (a day); a longer one is taken as this.
MAX_RETRY_AFTER = 86_400.0
# Characters of an error answer's body kept in last_error.
ERROR_BODY_CHARS = 200
USER_AGENT = f"jobq/{__version__}"


@dataclass(frozen=True, slots=True)
class PushTarget:
    queue: str
    url: str
    timeout: float
    concurrency: int
    signers: tuple[Webhook, ...]  # the current secret's first; the one it replaced while still valid
    endpoint: outbound.Endpoint  # the URL, taken apart


def new_secret() -> str:
    """A signing secret as Standard Webhooks writes one: `whsec_` and 32 random bytes in base64."""
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


def allowed_url(settings: Settings, url: str) -> str:
    """`url` as a push target may name it, or Invalid saying why not: an http(s) URL without user or
    password that starts with one of JOBQ_PUSH_ALLOWED_URLS (a URL without a path compared with its
    `/`)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Invalid(f"push.url must be an http or https URL with a host, not {url!r}")
    if parts.username is not None or parts.password is not None:
        raise Invalid("push.url must not hold a user or password: put credentials in the URL's path or query")
    if parts.fragment:
        raise Invalid("push.url must not have a #fragment")
    if not settings.push_allowed_urls:
        raise Invalid(
            "push delivery is off on this service: JOBQ_PUSH_ALLOWED_URLS lists no URL (set it to the"
            " prefixes your endpoints' URLs start with, comma-separated)"
        )
    spelled = url if parts.path else url.replace(parts.netloc, parts.netloc + "/", 1)
    if not any(spelled.startswith(prefix) for prefix in settings.push_allowed_urls):
        raise Invalid(
            f"push.url {url!r} starts with none of JOBQ_PUSH_ALLOWED_URLS"
            f" ({', '.join(settings.push_allowed_urls)})"
        )
    return url


async def set_push(
    runtime: Runtime, conn: asyncpg.Connection, queue: str, target: PushSettingsLike | None
) -> str | None:
    """Set the queue's push target (None: stop pushing), in the caller's transaction; every replica
    reads it again at once. The secret made for a queue given its first target, to be answered this
    once; None when it had one."""
    push = None
    if target is not None:
        url = allowed_url(runtime.settings, target.url)
        settings = {"url": url, "timeout": target.timeout, "concurrency": target.concurrency}
        push = orjson.dumps(settings).decode()
    secret = new_secret()
    made = await conn.fetchval(q.SET_PUSH.text, *q.SET_PUSH.args(queue=queue, push=push, secret=secret))
    return secret if made else None


async def rotate_secret(db: Database, queue: str) -> str:
    """A new signing secret for the queue (made if need be), answered this once; the one it replaces
    stays valid for SECRET_OVERLAP seconds."""
    secret = new_secret()
    async with db.acquire() as conn:
        await conn.execute(
            q.ROTATE_PUSH_SECRET.text,
            *q.ROTATE_PUSH_SECRET.args(queue=queue, secret=secret, overlap=SECRET_OVERLAP),
        )
    return secret


async def prune_holds(db: Database) -> None:
    """Forget the holds that are over."""
    async with db.acquire() as conn:
        await conn.execute(q.PRUNE_PUSH_HOLDS.text)


async def targets(db: Database, settings: Settings) -> tuple[dict[str, PushTarget], dict[str, str]]:
    """Every queue's push target that this replica's JOBQ_PUSH_ALLOWED_URLS admits; and, by queue, why
    each other is not (a replica allowed fewer URLs than the one that set a target leaves its queue to
    the others)."""
    async with db.acquire() as conn:
        rows = await conn.fetch(q.PUSH_TARGETS.text)
    found, passed = {}, {}
    for row in rows:
        push = orjson.loads(row["push"])
        try:
            allowed_url(settings, push["url"])
        except Invalid as refused:
            passed[row["queue"]] = str(refused.detail)
            continue
        secrets = [s for s in (row["push_secret"], row["push_secret_previous"]) if s]
        found[row["queue"]] = PushTarget(
            row["queue"],
            push["url"],
            float(push["timeout"]),
            int(push["concurrency"]),
            tuple(Webhook(secret) for secret in secrets),
            outbound.Endpoint.of(push["url"]),
        )
    return found, passed


# --- the claim -------------------------------------------------------------------------------------

# Seconds until a claim looks again when the queue's deliveries in flight fill its concurrency (those of
# other replicas: their ends wake nobody here).
FULL_RETRY = 0.05


@dataclass(slots=True)
class Claim:
    jobs: list[Row]
    wait: float | None  # seconds until a claim may find more: the queue is held, or full; None: woken
    stale: bool = False  # the queue's push target is no longer the one claimed for: read them again


def worker_id() -> str:
    """The worker id of this replica's deliveries' leases: `push:<host>:<pid>` (what PUSH_GATE counts)."""
    return f"{q.PUSH_WORKER_PREFIX}{socket.gethostname()}:{os.getpid()}"


async def claim(runtime: Runtime, target: PushTarget, most: int, worker: str) -> Claim:
    """Lease up to `most` of the queue's ready jobs for delivery, leaving at most `concurrency` of its
    deliveries in flight across every replica. Jobs of keys that are held go back at once, pending until the
    hold ends, their attempts not counted."""
    queue = target.queue
    async with runtime.db.acquire() as conn, transaction_with(conn, q.push_lock(queue)):
        gate = await conn.fetchrow(q.PUSH_GATE.text, *q.PUSH_GATE.args(queue=queue))
        if gate["url"] != target.url:  # the target was changed or taken away since this replica read it
            return Claim([], None, stale=True)
        room = min(most, target.concurrency - gate["running"])
        if gate["held_for"] is not None or room <= 0:
            return Claim([], gate["held_for"] or FULL_RETRY)  # its transaction wrote nothing
        timeouts: list[float | None] = [target.timeout + LEASE_SLACK] * room
        workers: list[str | None] = [worker] * room
        flow = await queue_flow(runtime, queue)
        started, began = time.perf_counter(), time.time_ns()
        if flow.flow:
            # On a connection of its own: the lock is held until it has committed.
            flow_claim = await lease_flow(runtime, queue, flow, timeouts, workers)
            rows = [row for _, row in sorted(zip(flow_claim.slots, flow_claim.rows, strict=True))]
        else:
            rows = await conn.fetch(
                q.LEASE.text, *q.LEASE.args(queue=queue, visibility_timeouts=timeouts, worker_ids=workers)
            )
    runtime.metrics.claimed(queue, time.perf_counter() - started, len(rows))
    tracing.record("lease", rows, began)
    jobs = [as_job(row) for row in rows]
    held = dict(zip(gate["held_keys"], gate["held_key_seconds"], strict=True))
    if held:
        jobs = await _hold_back(runtime.db, jobs, held)
    await attach_parents(runtime.db, jobs)
    return Claim(jobs, None)


async def _hold_back(db: Database, jobs: list[Row], held: dict[str, float]) -> list[Row]:
    """The jobs whose keys are not held; the others given back until their key's hold ends."""
    back = [job for job in jobs if job["key"] in held]
    if back:
        await release(
            db,
            [JobLease(job["id"], job["lease_token"]) for job in back],
            delays=[held[job["key"]] for job in back],
        )
    return [job for job in jobs if job["key"] not in held]


# --- one delivery ----------------------------------------------------------------------------------


@dataclass(slots=True)
class Outcome:
    """What a delivery's answer does to its job."""

    outcome: str  # completed, failed, retry_later, released
    status: int | None  # the answer's HTTP status; None: no answer
    seconds: float
    error: str | None = None  # why the attempt failed (last_error)
    body: bytes = b""  # a 2xx answer's body, at most the result limit + 1 bytes
    json: bool = False  # and its content type is JSON
    retry_after: float | None = None


def request_body(job: Row) -> bytes:
    """The JSON a job is POSTed as: {id, queue, kind, key, payload, attempts, max_attempts, run_at,
    created_at, parents?}. The payload is written as stored, byte for byte."""
    doc = {
        "id": job["id"],
        "queue": job["queue"],
        "kind": job["kind"],
        "key": job["key"],
        "payload": job["payload"],
        "attempts": job["attempts"],
        "max_attempts": job["max_attempts"],
        "run_at": job["run_at"],
        "created_at": job["created_at"],
    }
    if "parents" in job:
        doc["parents"] = job["parents"]
    return orjson.dumps(doc, default=written, option=WRITE_OPTIONS)


def signed_headers(target: PushTarget, job: Row, body: bytes, now: datetime | None = None) -> dict[str, str]:
    """The request's headers: Standard Webhooks' three (one signature per valid secret), the attempt,
    and the job's trace context."""
    when = now or datetime.now(UTC)
    message = f"job_{job['id']}"
    headers = {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        "webhook-id": message,
        "webhook-timestamp": str(math.floor(when.timestamp())),
        "webhook-signature": " ".join(signer.sign(message, when, body) for signer in target.signers),
        "jobq-attempt": str(job["attempts"]),
    }
    if job.get("traceparent"):
        headers["traceparent"] = job["traceparent"]
        if job.get("tracestate"):
            headers["tracestate"] = job["tracestate"]
    return headers


async def deliver(client: outbound.Client, target: PushTarget, job: Row, limit: int) -> Outcome:
    """POST the job to the target and read at most `limit` + 1 bytes of the answer, all within the
    target's timeout; what the answer means for the job. Cancelled (the replica stopping), it raises."""
    body = request_body(job)
    headers = signed_headers(target, job, body)
    started = time.perf_counter()
    try:
        async with asyncio.timeout(target.timeout):
            answer = await client.post(target.endpoint, headers, body, limit + 1, ERROR_BODY_CHARS * 4)
    except TimeoutError:
        took = time.perf_counter() - started
        return Outcome("failed", None, took, f"timeout: no full answer within {target.timeout:g} s")
    except ssl.SSLError as exc:
        return Outcome("failed", None, time.perf_counter() - started, f"TLS failed: {_reason(exc)}")
    except OSError as exc:
        return Outcome("failed", None, time.perf_counter() - started, f"connection failed: {_reason(exc)}")
    except outbound.Broken as exc:
        return Outcome("failed", None, time.perf_counter() - started, f"connection error: {_reason(exc)}")
    seconds = time.perf_counter() - started
    status = answer.status
    if 200 <= status < 300:
        media = answer.headers.get("content-type", "").partition(";")[0].strip().lower()
        is_json = media == "application/json" or media.endswith("+json")
        return Outcome("completed", status, seconds, body=answer.body, json=is_json)
    if status in (429, 503) and (delay := parse_retry_after(answer.headers.get("retry-after"))) is not None:
        return Outcome("retry_later", status, seconds, retry_after=delay)
    if 300 <= status < 400:
        location = answer.headers.get("location")
        return Outcome(
            "failed", status, seconds, f"HTTP {status}: redirects are not followed (Location: {location})"
        )
    text = answer.body.decode("utf-8", "replace")[:ERROR_BODY_CHARS]
    return Outcome("failed", status, seconds, f"HTTP {status}: {text}" if text else f"HTTP {status}")


def _reason(exc: BaseException) -> str:
    """An exception's words, for last_error."""
    text = str(exc) or type(exc).__name__
    return text[: ERROR_BODY_CHARS * 2]


def parse_retry_after(value: str | None) -> float | None:
    """Seconds a Retry-After header asks for (delay-seconds, or an HTTP date), at most MAX_RETRY_AFTER;
    None for none, or one that is neither."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), MAX_RETRY_AFTER)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return min(max((when - datetime.now(UTC)).total_seconds(), 0.0), MAX_RETRY_AFTER)


# --- the answer's end of the job -------------------------------------------------------------------


def _delivery(outcome: Outcome, note: str | None = None) -> str:
    """The job's `delivery`, as JSON text."""
    doc: dict[str, object] = {
        "at": datetime.now(UTC),
        "outcome": outcome.outcome,
        "status": outcome.status,
        "ms": round(outcome.seconds * 1000, 1),
    }
    if outcome.error is not None:
        doc["error"] = outcome.error
    if outcome.retry_after is not None:
        doc["retry_after"] = outcome.retry_after
    if note is not None:
        doc["note"] = note
    return orjson.dumps(doc, option=WRITE_OPTIONS).decode()


def _result(outcome: Outcome, limit: int) -> tuple[object, str | None]:
    """A 2xx answer's body as the job's result (None: none) and, when it is not kept, why."""
    if not outcome.body:
        return None, None
    if len(outcome.body) > limit:
        return None, f"result not kept: the answer's body is over {limit} bytes (JOBQ_MAX_RESULT_BYTES)"
    if not outcome.json:
        return None, "result not kept: the answer is not JSON (content-type application/json)"
    try:
        return read_json(outcome.body), None
    except (ValueError, RecursionError) as exc:
        return None, f"result not kept: the answer's body is not valid JSON ({exc})"


async def finish(runtime: Runtime, target: PushTarget, job: Row, outcome: Outcome) -> None:
    """End the job's lease as its delivery's outcome says; a lease that ended meanwhile (it expired, and
    the job was leased again) is left alone."""
    lease = (job["id"], job["lease_token"])
    if outcome.outcome == "completed":
        result, note = _result(outcome, runtime.settings.max_result_bytes)
        try:
            await ack(runtime, Ack(*lease, result=result), _delivery(outcome, note))
        except JobqError as refused:  # a result the service cannot keep (a NUL, a number too long)
            if result is None:
                raise
            note = f"result not kept: {refused.detail}"
            await ack(runtime, Ack(*lease), _delivery(outcome, note))
    elif outcome.outcome == "retry_later":
        # The hold first: by the time the job is pending again, no claim on any replica passes it.
        delay = outcome.retry_after or 0.0
        async with runtime.db.acquire() as conn:
            await conn.execute(
                q.HOLD_PUSH.text, *q.HOLD_PUSH.args(queue=target.queue, key=job["key"], seconds=delay)
            )
        await release(runtime.db, [JobLease(*lease)], delays=[delay], deliveries=[_delivery(outcome)])
    elif outcome.outcome == "released":
        await release(runtime.db, [JobLease(*lease)], deliveries=[_delivery(outcome)])
    else:
        await nack(runtime, Nack(*lease, error=outcome.error), _delivery(outcome))
