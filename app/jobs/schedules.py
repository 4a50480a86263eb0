"""Schedules: cron schedules that enqueue a job per slot, and the firing of due slots.

A schedule's `next_run_at` is its first slot not yet fired. The scheduler (app/scheduler.py, on the one
replica that holds the lead) fires a due schedule in one transaction: it locks the row (SKIP LOCKED), works
out which slots to enqueue, inserts their jobs (each recording the schedule and its slot, unique per slot)
and moves `next_run_at` past now. However many replicas race, a slot is enqueued once.

Which slots fire: those at most `grace` seconds late (JOBQ_SCHEDULE_GRACE) always do, each one job. Older
ones were missed (the service was down, or its leader gone longer than the grace): `catch_up` decides,
`skip` none, `once` one job for the latest missed slot, `all` one per missed slot, the latest 1,000 at most.
A paused schedule has no next slot; resuming starts from the next slot after now, so a pause is not
caught up. A change of cron or time zone does the same; a PUT that keeps them keeps the next slot, so
declaring schedules again at start (JOBQ_SCHEDULES_FILE) neither skips nor repeats a slot.
"""

from __future__ import annotations

import logging
import tomllib
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg

from app import queries as q
from app.cron import Cron
from app.db import Database
from app.errors import Forbidden, Invalid, NotFound, PayloadTooLarge
from app.jobs.rows import Row, Scope
from app.jsontext import JSONText, NumberOutOfRange, encode_json, written_out, written_size
from app.models import CatchUp

log = logging.getLogger("jobq.schedules")

MAX_CATCH_UP = 1000  # jobs one `all` catch-up enqueues at most
MISSES_COUNTED = 100_000  # slots counted one by one as missed; past that, the count stops there


@dataclass(frozen=True)
class ScheduleSpec:
    """A schedule as declared (PUT /schedules/{name}, or JOBQ_SCHEDULES_FILE), checked by app/schemas.py."""

    cron: str
    queue: str
    payload: Any
    timezone: str = "UTC"
    kind: str | None = None
    priority: int = 0
    max_attempts: int | None = None
    key: str | None = None
    catch_up: str = CatchUp.ONCE
    paused: bool = False


def as_schedule(row: asyncpg.Record) -> Row:
    out = dict(row)
    out.pop("now", None)
    out["payload"] = JSONText(out["payload"])
    return out


async def put_schedule(db: Database, name: str, spec: ScheduleSpec, scope: Scope = None) -> Row:
    """Create or replace a schedule. Its next slot is kept when cron and time zone stay the same (and it
    stays active); otherwise it is the first slot after now. One of a queue outside `scope` is not
    replaced (Forbidden)."""
    cron = Cron(spec.cron, spec.timezone)
    try:
        payload = encode_json(spec.payload)
    except NumberOutOfRange as exc:
        raise Invalid(f"the payload {exc}") from None
    if len(payload) > db.settings.max_payload_bytes:
        raise PayloadTooLarge(f"the payload is over {db.settings.max_payload_bytes} bytes encoded")
    if (size := written_size(payload, spec.payload)) > db.settings.max_payload_bytes:
        raise Invalid(
            f"the payload {written_out(size, db.settings.max_payload_bytes, 'JOBQ_MAX_PAYLOAD_BYTES')}"
        )
    values = dict(spec.__dict__) | {"payload": payload.decode()}
    async with db.acquire() as conn, conn.transaction():
        now = await conn.fetchval("SELECT now()")
        old = await conn.fetchrow(q.LOCK_SCHEDULE.text, *q.LOCK_SCHEDULE.args(name=name, scope=None))
        same = old is not None and (old["cron"], old["timezone"]) == (spec.cron, spec.timezone)
        if spec.paused:
            next_run_at = None
        elif same and old["next_run_at"] is not None:
            next_run_at = old["next_run_at"]
        else:
            next_run_at = cron.next_after(now)
        row = await conn.fetchrow(
            q.PUT_SCHEDULE.text,
            *q.PUT_SCHEDULE.args(name=name, next_run_at=next_run_at, scope=scope, **values),
        )
    if row is None:
        raise Forbidden(f"schedule {name!r} enqueues into a queue this token may not use")
    return as_schedule(row)


async def _locked(conn: asyncpg.Connection, name: str, scope: Scope) -> asyncpg.Record:
    """The schedule's row, locked to the end of the transaction, with the database's `now`."""
    row = await conn.fetchrow(q.LOCK_SCHEDULE.text, *q.LOCK_SCHEDULE.args(name=name, scope=scope))
    if row is None:
        raise NotFound(f"schedule {name!r} does not exist")
    return row


async def get_schedule(db: Database, name: str, scope: Scope = None) -> Row:
    async with db.acquire() as conn:
        row = await conn.fetchrow(q.GET_SCHEDULE.text, *q.GET_SCHEDULE.args(name=name, scope=scope))
    if row is None:
        raise NotFound(f"schedule {name!r} does not exist")
    return as_schedule(row)


async def list_schedules(db: Database, scope: Scope = None) -> list[Row]:
    async with db.acquire() as conn:
        rows = await conn.fetch(q.LIST_SCHEDULES.text, *q.LIST_SCHEDULES.args(scope=scope))
    return [as_schedule(r) for r in rows]


async def delete_schedule(db: Database, name: str, scope: Scope = None) -> Row:
    """Remove a schedule; the jobs it enqueued stay."""
    async with db.acquire() as conn:
        gone = await conn.fetchval(q.DELETE_SCHEDULE.text, *q.DELETE_SCHEDULE.args(name=name, scope=scope))
    if gone is None:
        raise NotFound(f"schedule {name!r} does not exist")
    return {"name": name, "deleted": True}


async def set_paused(db: Database, name: str, paused: bool, scope: Scope = None) -> Row:
    """Pause (no next slot) or resume (the first slot after now: a pause is not caught up)."""
    async with db.acquire() as conn, conn.transaction():
        old = await _locked(conn, name, scope)
        if old["paused"] == paused:
            return as_schedule(old)
        next_run_at = None if paused else Cron(old["cron"], old["timezone"]).next_after(old["now"])
        row = await conn.fetchrow(
            q.SET_SCHEDULE_PAUSED.text,
            *q.SET_SCHEDULE_PAUSED.args(name=name, paused=paused, next_run_at=next_run_at),
        )
    return as_schedule(row)


async def trigger(db: Database, name: str, scope: Scope = None) -> Row:
    """Enqueue the schedule's job now, outside its slots (the job's schedule_slot is null); the schedule,
    with `job_id`."""
    async with db.acquire() as conn, conn.transaction():
        old = await _locked(conn, name, scope)
        fired = await conn.fetchrow(q.FIRE_SCHEDULE.text, *q.FIRE_SCHEDULE.args(name=name, slots=[None]))
        await conn.execute(
            q.ADVANCE_SCHEDULE.text,
            *q.ADVANCE_SCHEDULE.args(
                name=name, next_run_at=None, last_run_at=old["now"], last_job_id=fired["last_job_id"]
            ),
        )
    db.metrics.schedule_fired(name, 1)
    return as_schedule(old) | {
        "last_run_at": old["now"],
        "last_job_id": fired["last_job_id"],
        "job_id": fired["last_job_id"],
    }


@dataclass(frozen=True)
class Plan:
    """What one firing of a due schedule does."""

    slots: list[datetime]  # the slots to enqueue a job for, oldest first
    missed: int  # slots passed over (late beyond the grace, and not caught up)
    next_run_at: datetime


def plan(cron: Cron, catch_up: str, first: datetime, now: datetime, grace: float) -> Plan:
    """The slots to fire for a schedule whose first unfired slot is `first`, at `now` (see the module)."""
    late = now - timedelta(seconds=grace)
    on_time = cron.slots(max(first - timedelta(microseconds=1), late), now)
    missed: list[datetime] = []
    if first <= late:
        missed = cron.slots(first - timedelta(microseconds=1), late, limit=MISSES_COUNTED)
    caught: list[datetime] = []
    if catch_up == CatchUp.ONCE and missed:
        caught = (
            [missed[-1]]
            if len(missed) < MISSES_COUNTED
            else cron.latest(late, first - timedelta(microseconds=1), 1)
        )
    elif catch_up == CatchUp.ALL and missed:
        caught = (
            missed[-MAX_CATCH_UP:]
            if len(missed) < MISSES_COUNTED
            else cron.latest(late, first - timedelta(microseconds=1), MAX_CATCH_UP)
        )
    caught = [slot for slot in caught if slot not in on_time]
    return Plan(caught + on_time, len(missed) - len(caught), cron.next_after(now))


async def fire_due(db: Database, grace: float) -> int:
    """Fire every due schedule, one transaction each; how many jobs were enqueued."""
    enqueued = 0
    while True:
        async with db.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(q.DUE_SCHEDULE.text)
            if row is None:
                return enqueued
            name = row["name"]
            try:
                cron = Cron(row["cron"], row["timezone"])
            except ValueError as exc:  # checked when declared: only a time zone the system lost since
                log.error("schedule %r cannot fire, and is paused: %s", name, exc)
                await conn.execute(
                    q.SET_SCHEDULE_PAUSED.text,
                    *q.SET_SCHEDULE_PAUSED.args(name=name, paused=True, next_run_at=None),
                )
                continue
            fire = plan(cron, row["catch_up"], row["next_run_at"], row["now"], grace)
            fired = await conn.fetchrow(
                q.FIRE_SCHEDULE.text, *q.FIRE_SCHEDULE.args(name=name, slots=fire.slots)
            )
            await conn.execute(
                q.ADVANCE_SCHEDULE.text,
                *q.ADVANCE_SCHEDULE.args(
                    name=name,
                    next_run_at=fire.next_run_at,
                    last_run_at=fire.slots[-1] if fire.slots else None,
                    last_job_id=fired["last_job_id"],
                ),
            )
        enqueued += fired["jobs"]
        db.metrics.schedule_fired(name, fired["jobs"], fire.missed)
        if fire.missed:
            log.warning(
                "schedule %r missed %d slot(s) (catch_up %s): the scheduler was away",
                name,
                fire.missed,
                row["catch_up"],
            )


async def next_due_in(db: Database) -> float | None:
    """Seconds until the next slot of an active schedule is due (negative: overdue); None: none."""
    async with db.acquire() as conn:
        return await conn.fetchval(q.NEXT_DUE.text)


async def take_lead(db: Database, name: str, holder: str, ttl: float) -> bool:
    async with db.acquire() as conn:
        return (
            await conn.fetchval(q.TAKE_LEAD.text, *q.TAKE_LEAD.args(name=name, holder=holder, ttl=ttl))
            is not None
        )


async def give_up_lead(db: Database, name: str, holder: str) -> None:
    async with db.acquire() as conn:
        await conn.execute(q.GIVE_UP_LEAD.text, *q.GIVE_UP_LEAD.args(name=name, holder=holder))


async def apply(db: Database, specs: dict[str, ScheduleSpec]) -> None:
    """Declare schedules as PUT would (JOBQ_SCHEDULES_FILE, at start)."""
    for name, spec in specs.items():
        await put_schedule(db, name, spec)


def load_file(path: Path) -> dict[str, dict[str, Any]]:
    """The schedules a TOML file declares: a table per schedule under `schedules`, named by its key,
    with the fields of PUT /schedules/{name}:

        [schedules.nightly-report]
        cron = "0 3 * * *"
        timezone = "Europe/Berlin"
        queue = "reports"
        payload = { kind = "daily" }
    """
    with path.open("rb") as file:
        data = tomllib.load(file)
    schedules = data.get("schedules")
    if not isinstance(schedules, dict) or set(data) - {"schedules"}:
        raise ValueError(f"{path}: expected only [schedules.<name>] tables")
    return schedules
