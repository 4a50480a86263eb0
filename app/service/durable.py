"""Durable steps, sleeps and events (API part 8): long-running work that survives crashes without redoing
what it already did.

The model is durable execution as workers in any language run it over plain HTTP:
- A **step** is a result the handler records under its lease (`POST /jobs/{id}/steps`) once the step's side
  effect is done. Every later lease of the job carries its steps (`steps: {name: result}`), so a handler
  run again from the top (after a crash, a retry, a sleep or an event) answers each recorded step from the
  record and runs only what is left. The first write of a name wins: a second is refused (409) with the
  result recorded. Recorded only under the current lease (fenced like ack): a worker whose lease was
  taken over records nothing.
- A **sleep** is a release with a delay (`POST /release`, app/service/workers.py): the job is pending
  again at now + delay, the attempt not counted, and no worker is held while it sleeps; its long-polls
  are woken when it comes due (app/service/wakeups.py), as for any delayed job.
- A **wait** parks the job `waiting` for an event by name (`POST /jobs/{id}/await`) for at most `timeout`
  seconds, the attempt not counted; `POST /events` makes every job awaiting the name pending at once, the
  event appended to its `events`. Events are kept (JOBQ_EVENT_RETENTION), and an await that finds an event
  of its name sent since the job was enqueued, which has not reached it yet, does not park at all: an
  event sent before the await is not lost. A wait that runs out makes the job pending with a
  `timed_out` entry in its events instead (EXPIRE_WAITS, run with lease expiry every second).
  jobq.await_event() and jobq.send_event() (app/db/functions.sql) say how the two never miss each other.

What happens to a parked job otherwise (docs/how-to/durable.md says it to users):
- `DELETE /jobs/{id}` cancels a sleeping (pending) or waiting job, as any pending or waiting job; an
  event sent later finds nothing to wake, and a workflow's `DELETE` does the same to its jobs.
- A sleeping or waiting job is not dead, so `POST /dead/retry` leaves it alone. A dead job retried keeps
  its steps and events: it resumes after its last recorded step.
- `POST /jobs/{id}/run` (run now) makes a sleeping job due at once.
"""

from __future__ import annotations

import orjson

from app.core.errors import Conflict, LeaseLost, NotFound, PayloadTooLarge
from app.core.tokens import parse_token
from app.db import sql as q
from app.db.pool import Database
from app.service.rows import Row, Scope, job_status
from app.service.runtime import Runtime
from app.service.upkeep import prune_in_batches
from app.service.workers import _json_text, _with_queues

EXPIRE_BATCH = 1000  # waits per EXPIRE_WAITS statement


async def record_step(runtime: Runtime, job_id: int, lease_token: str, name: str, result: object) -> Row:
    """Record step `name`'s `result` (any JSON value, null included) with a job running under
    `lease_token`. LeaseLost when the lease is not the job's current one, NotFound for no such job,
    Conflict (with the recorded `result`) when the name is recorded already, PayloadTooLarge when the
    job's steps would pass JOBQ_MAX_STEPS_BYTES; each changes nothing."""
    limit = runtime.settings.max_steps_bytes
    text = _json_text(
        result,
        limit,
        f"the result of step {name!r} of job {job_id}",
        "the step is not recorded; record a smaller result (a reference to where the data is)",
        "JOBQ_MAX_STEPS_BYTES",
    )
    text = "null" if text is None else text
    token, queue = parse_token(lease_token)
    async with runtime.db.acquire() as conn:
        (queue,) = await _with_queues(conn, [job_id], [queue])
        recorded = await conn.fetchval(
            q.RECORD_STEP.text,
            *q.RECORD_STEP.args(
                id=job_id, queue=queue, lease_token=token, name=name, result=text, limit=limit
            ),
        )
        if recorded is None:
            why = await conn.fetchrow(q.STEP_REFUSED.text, *q.STEP_REFUSED.args(id=job_id, name=name))
    if recorded is not None:
        runtime.metrics.steps.inc(queue)
        return {"id": job_id, "name": name, "recorded": True}
    if why is None:
        raise NotFound(f"job {job_id} does not exist")
    if why["status"] != "running" or str(why["lease_token"]) != str(token):
        raise LeaseLost(f"job {job_id} is not running under this lease token: step {name!r} is not recorded")
    if why["taken"]:
        raise Conflict(
            f"step {name!r} of job {job_id} is recorded already: the first result stands (it is in `result`)",
            name=name,
            result=orjson.loads(why["recorded"]),
        )
    raise PayloadTooLarge(
        f"the steps of job {job_id} are {why['size']} bytes as JSON; with step {name!r} they would pass "
        f"{limit} bytes (JOBQ_MAX_STEPS_BYTES), which every lease of the job carries: the step is not "
        "recorded; record a smaller result (a reference to where the data is)"
    )


async def await_event(runtime: Runtime, job_id: int, lease_token: str, event: str, timeout: float) -> Row:
    """End the job's lease and park it `waiting` for `event`, for at most `timeout` seconds; or make it
    pending at once when such an event was sent since it was enqueued and has not reached it. The
    attempt is not counted either way. {id, status, run_at, event_id}; LeaseLost / NotFound as for a
    step."""
    token, queue = parse_token(lease_token)
    async with runtime.db.acquire() as conn:
        (queue,) = await _with_queues(conn, [job_id], [queue])
        row = await conn.fetchrow(
            q.AWAIT_EVENT.text,
            *q.AWAIT_EVENT.args(id=job_id, queue=queue, lease_token=token, event=event, timeout=timeout),
        )
        if row is None:
            await job_status(conn, job_id)  # NotFound when there is no such job
            raise LeaseLost(f"job {job_id} is not running under this lease token: it is not parked")
    runtime.metrics.awaits.inc(queue)
    if row["event_id"] is not None:
        runtime.metrics.events_woken.inc(queue)
    return {"id": row["id"], "status": row["status"], "run_at": row["run_at"], "event_id": row["event_id"]}


async def send_event(runtime: Runtime, name: str, payload: object, scope: Scope = None) -> Row:
    """Send event `name` with `payload` (any JSON value; None: none): kept, and every job awaiting it (in
    `scope`, a token's queues) pending now. {id, woken}."""
    text = _json_text(
        payload,
        runtime.settings.max_payload_bytes,
        f"the payload of event {name!r}",
        "the event is not sent; send a smaller payload",
        "JOBQ_MAX_PAYLOAD_BYTES",
    )
    async with runtime.db.acquire() as conn:
        row = await conn.fetchrow(q.SEND_EVENT.text, *q.SEND_EVENT.args(name=name, payload=text, scope=scope))
    runtime.metrics.events_sent.inc()
    for queue, n in orjson.loads(row["queues"]).items():
        runtime.metrics.events_woken.inc(queue, n)
    return {"id": row["event_id"], "name": name, "woken": row["woken"]}


async def expire_waits(runtime: Runtime) -> int:
    """Make every job whose wait for an event ran out pending again; how many."""
    total = 0
    async with runtime.db.acquire() as conn:
        while True:
            rows = await conn.fetch(q.EXPIRE_WAITS.text, *q.EXPIRE_WAITS.args(batch=EXPIRE_BATCH))
            runtime.metrics.waits_expired.count(rows)
            total += len(rows)
            if len(rows) < EXPIRE_BATCH:
                return total


async def prune_events(db: Database) -> int:
    """Forget the events past JOBQ_EVENT_RETENTION; how many."""
    return await prune_in_batches(db, q.PRUNE_EVENTS, kept=db.settings.event_retention)


async def prune_journals(db: Database) -> int:
    """Forget the journals (steps and events) of jobs gone; how many."""
    return await prune_in_batches(db, q.PRUNE_JOURNALS)


async def list_events(
    db: Database, name: str | None, limit: int, before_id: int | None, scope: Scope = None
) -> Row:
    """The events kept, newest first (of `name` when given), and the `before_id` of the next page."""
    async with db.acquire_read() as conn:
        rows = await conn.fetch(
            q.LIST_EVENTS.text,
            *q.LIST_EVENTS.args(name=name, before_id=before_id or 2**63 - 1, limit=limit + 1, scope=scope),
        )
    events = [
        {"id": r["id"], "name": r["name"], "payload": orjson.loads(r["payload"] or "null"), "at": r["at"]}
        for r in rows[:limit]
    ]
    return {"events": events, "next_before_id": events[-1]["id"] if len(rows) > limit else None}
