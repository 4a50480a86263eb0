"""Schedules: cron schedules that enqueue a job per slot, and the firing of due slots.

A schedule's `next_run_at` is its first slot not yet fired. The scheduler (app/service/loops/scheduler.py, on
the one replica that holds the lead) fires due schedules set-wise, thousands in one statement (fire_due): it
works out which slots each enqueues, in a thread and once for schedules alike, then claims those still as
planned, inserts their jobs (each recording the schedule and its slot, unique per slot) and moves each
`next_run_at` past now. However many replicas race, a slot is enqueued once.

Which slots fire: those at most `grace` seconds late (JOBQ_SCHEDULE_GRACE) always do, each one job. Older
ones were missed (the service was down, or its leader gone longer than the grace): `catch_up` decides,
`skip` none, `once` one job for the latest missed slot, `all` one per missed slot, the latest 1,000 at most.
A paused schedule has no next slot; resuming starts from the next slot after now, so a pause is not
caught up. A change of cron or time zone does the same; a PUT that keeps them keeps the next slot, so
declaring schedules again at start (JOBQ_SCHEDULES_FILE) neither skips nor repeats a slot.
"""

from __future__ import annotations

import asyncio
import logging
import tomllib
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg

from app.core.cron import CatchUp, Cron, CronError
from app.core.errors import Forbidden, Invalid, NotFound, PayloadTooLarge
from app.core.jsontext import JSONText, NumberOutOfRange, encode_json, written_out, written_size
from app.db import sql as q
from app.db.pool import Database
from app.service.rows import Row, Scope
from app.service.runtime import Runtime

log = logging.getLogger("jobq.schedules")

MAX_CATCH_UP = 1000  # jobs one `all` catch-up enqueues at most
MAX_LISTED = 1000  # schedules a page of GET /schedules holds at most, and by default
# Due schedules fired in one statement at most: 10,000 of them at the same second take five rounds.
FIRE_BATCH = 2000


@dataclass(frozen=True)
class ScheduleSpec:
    """A schedule as declared (PUT /schedules/{name}, or JOBQ_SCHEDULES_FILE), checked by
    app/http/schemas/schedules.py."""

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


async def list_schedules(
    db: Database, scope: Scope = None, limit: int = MAX_LISTED, after: str | None = None
) -> Row:
    """A page of schedules by name, `limit` at most, from the first after `after`; `next_after`: the
    name to pass as `after` for the next page (None: none)."""
    async with db.acquire() as conn:
        rows = await conn.fetch(
            q.LIST_SCHEDULES.text, *q.LIST_SCHEDULES.args(scope=scope, after=after, limit=limit)
        )
    page = [as_schedule(r) for r in rows[:limit]]
    return {"schedules": page, "next_after": page[-1]["name"] if len(rows) > limit else None}


async def delete_schedule(db: Database, name: str, scope: Scope = None) -> Row:
    """Remove a schedule; the jobs it enqueued stay."""
    async with db.acquire() as conn:
        gone = await conn.fetchval(q.DELETE_SCHEDULE.text, *q.DELETE_SCHEDULE.args(name=name, scope=scope))
    if gone is None:
        raise NotFound(f"schedule {name!r} does not exist")
    return {"name": name, "deleted": True}


async def set_paused(db: Database, name: str, paused: bool, scope: Scope = None) -> Row:
    """Pause (no next slot) or resume (the first slot after now: a pause is not caught up). A schedule
    stored with a cron that never fires (refused since, but kept paused) does not resume (Invalid)."""
    async with db.acquire() as conn, conn.transaction():
        old = await _locked(conn, name, scope)
        if old["paused"] == paused:
            return as_schedule(old)
        try:
            next_run_at = None if paused else Cron(old["cron"], old["timezone"]).next_after(old["now"])
        except CronError as exc:
            raise Invalid(f"schedule {name!r} cannot resume: {exc}. PUT it with another cron") from None
        row = await conn.fetchrow(
            q.SET_SCHEDULE_PAUSED.text,
            *q.SET_SCHEDULE_PAUSED.args(name=name, paused=paused, next_run_at=next_run_at),
        )
    return as_schedule(row)


async def trigger(runtime: Runtime, name: str, scope: Scope = None) -> Row:
    """Enqueue the schedule's job now, outside its slots (the job's schedule_slot is null); the schedule,
    with `job_id`."""
    async with runtime.db.acquire() as conn, conn.transaction():
        old = await _locked(conn, name, scope)
        fired = await conn.fetchrow(q.FIRE_SCHEDULE.text, *q.FIRE_SCHEDULE.args(name=name, slots=[None]))
        await conn.execute(
            q.ADVANCE_SCHEDULE.text,
            *q.ADVANCE_SCHEDULE.args(
                name=name, next_run_at=None, last_run_at=old["now"], last_job_id=fired["last_job_id"]
            ),
        )
    runtime.metrics.schedule_fired(name, 1)
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
    """The slots to fire for a schedule whose first unfired slot is `first`, at `now` (see the module).
    Missed slots are counted (Cron.count), not walked; only those fired are stepped to, the latest
    MAX_CATCH_UP at most, and those within the grace."""
    before_first = first - timedelta(microseconds=1)
    late = now - timedelta(seconds=grace)
    on_time = cron.slots(max(before_first, late), now)
    missed = cron.count(before_first, late) if first <= late else 0
    caught: list[datetime] = []
    if missed and catch_up != CatchUp.SKIP:
        caught = cron.latest(late, before_first, 1 if catch_up == CatchUp.ONCE else MAX_CATCH_UP)
    return Plan(caught + on_time, missed - len(caught), cron.next_after(now))


@dataclass
class Firing:
    """One round of due schedules (FIRE_DUE_SCHEDULES' arguments), as planned off the event loop."""

    names: list[str] = field(default_factory=list)
    firsts: list[datetime] = field(default_factory=list)
    crons: list[str] = field(default_factory=list)
    timezones: list[str] = field(default_factory=list)
    catch_ups: list[str] = field(default_factory=list)
    next_run_ats: list[datetime] = field(default_factory=list)
    last_run_ats: list[datetime | None] = field(default_factory=list)
    slot_names: list[str] = field(default_factory=list)
    slots: list[datetime] = field(default_factory=list)
    missed: dict[str, int] = field(default_factory=dict)  # by schedule, those with missed slots
    broken: dict[str, str] = field(default_factory=dict)  # schedules that cannot fire, and why

    def args(self) -> list[Any]:
        return q.FIRE_DUE_SCHEDULES.args(
            names=self.names,
            firsts=self.firsts,
            crons=self.crons,
            timezones=self.timezones,
            catch_ups=self.catch_ups,
            next_run_ats=self.next_run_ats,
            last_run_ats=self.last_run_ats,
            slot_names=self.slot_names,
            slots=self.slots,
        )


def plan_round(due: list[asyncpg.Record], grace: float) -> Firing:
    """Plan every due schedule of a round. Schedules alike (the same cron, zone, catch-up and next slot,
    as thousands of `* * * * *` are) share one plan: working out slots costs tens of microseconds a
    schedule, and 10,000 schedules are due at the same second."""
    firing = Firing()
    plans: dict[tuple[str, str, str, datetime], Plan | str] = {}
    crons: dict[tuple[str, str], Cron | str] = {}
    for row in due:
        name, first = row["name"], row["next_run_at"]
        key = (row["cron"], row["timezone"], row["catch_up"], first)
        planned = plans.get(key)
        if planned is None:
            cron = crons.get(key[:2])
            try:
                if cron is None:
                    cron = crons[key[:2]] = Cron(row["cron"], row["timezone"])
                if isinstance(cron, str):
                    raise CronError(cron)
                planned = plans[key] = plan(cron, row["catch_up"], first, row["now"], grace)
            except CronError as exc:  # checked when declared: only a time zone the system lost since
                planned = plans[key] = crons[key[:2]] = str(exc)
        if isinstance(planned, str):
            firing.broken[name] = planned
            continue
        firing.names.append(name)
        firing.firsts.append(first)
        firing.crons.append(row["cron"])
        firing.timezones.append(row["timezone"])
        firing.catch_ups.append(row["catch_up"])
        firing.next_run_ats.append(planned.next_run_at)
        firing.last_run_ats.append(planned.slots[-1] if planned.slots else None)
        firing.slot_names.extend([name] * len(planned.slots))
        firing.slots.extend(planned.slots)
        if planned.missed:
            firing.missed[name] = planned.missed
    return firing


async def fire_due(runtime: Runtime, grace: float) -> int:
    """Fire every due schedule, set-wise, a round of at most FIRE_BATCH schedules at a time; how many
    jobs were enqueued.

    A round reads the due schedules (no lock), plans them in a thread, so that no schedule's slots are
    worked out on the event loop, and fires them all in one statement, FIRE_DUE_SCHEDULES: it claims
    each schedule only if it is still as planned (the same next slot, cron, zone and catch-up, not
    paused) and nobody else holds it, moves it to its next slot and inserts its slots' jobs. A schedule
    fired, paused or changed meanwhile, by this replica or another, is left out: each slot once."""
    enqueued = 0
    while True:
        async with runtime.db.acquire() as conn:
            due = await conn.fetch(q.DUE_SCHEDULES.text, *q.DUE_SCHEDULES.args(batch=FIRE_BATCH))
            if not due:
                return enqueued
            firing = await asyncio.to_thread(plan_round, due, grace)
            for name, why in firing.broken.items():
                log.error("schedule %r cannot fire, and is paused: %s", name, why)
                await conn.execute(
                    q.SET_SCHEDULE_PAUSED.text,
                    *q.SET_SCHEDULE_PAUSED.args(name=name, paused=True, next_run_at=None),
                )
            fired = []
            if firing.names:
                async with conn.transaction():
                    # Its CTEs join one another by name, thousands of rows each, and PostgreSQL cannot
                    # tell how many: estimated at a row, joined by nested loops, a round of 2,000 took
                    # seconds; by hashing, a tenth of a second.
                    await conn.execute("SET LOCAL enable_nestloop = off")
                    fired = await conn.fetch(q.FIRE_DUE_SCHEDULES.text, *firing.args())
        missed = 0
        for row in fired:
            enqueued += row["jobs"]
            missed_here = firing.missed.get(row["name"], 0)
            missed += missed_here
            runtime.metrics.schedule_fired(row["name"], row["jobs"], missed_here)
        if missed:
            late = sorted(name for name in firing.missed if name in {row["name"] for row in fired})
            log.warning(
                "%d schedule(s) missed %d slot(s) in all, the scheduler being away: %s%s",
                len(late),
                missed,
                ", ".join(repr(name) for name in late[:10]),
                f" and {len(late) - 10} more" if len(late) > 10 else "",
            )
        if len(due) < FIRE_BATCH or not fired:
            return enqueued


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
