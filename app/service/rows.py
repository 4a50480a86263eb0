"""A job as the service answers with it, and a guarded statement on one job: its row, or why it changed
nothing (the status it left the job in)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import asyncpg

from app.core.errors import Conflict, NotFound
from app.core.jsontext import JSONText
from app.core.tokens import token_text
from app.db import sql as q

Row = dict[str, Any]
# The queues a caller may see, as LIKE patterns (app/core/access.py Grant.like); None: every queue. Queries
# take it as :scope, and a job outside it is answered as one that does not exist.
Scope = list[str] | None


def as_job(row: asyncpg.Record) -> Row:
    """A job row as answered: its payload, result and progress as stored JSON text (the last two None
    when NULL), its lease token (if any) as text."""
    out = dict(row)
    out.pop("ord", None)  # statements' bookkeeping, not the job's
    out.pop("slot", None)
    out.pop("done", None)
    out["payload"] = JSONText(out["payload"])
    if "result" in out:  # a whole job (sql.JOB); a lease's rows (LEASED_JOB) have neither column
        result, progress = out["result"], out["progress"]
        if result is not None:
            out["result"] = JSONText(result)
        if progress is not None:
            out["progress"] = JSONText(progress)
    if out.get("delivery") is not None:
        out["delivery"] = JSONText(out["delivery"])
    _durable(out)
    token = out.pop("lease_token", None)
    if token is not None:
        out["lease_token"] = token_text(token, out["queue"])
    return out


def _durable(out: Row) -> None:
    """A job's steps and events (API part 8) as stored JSON text. A lease's rows (LEASED_JOB) hand them
    out only when the job has some; a whole job (sql.JOB) shows them (null: none), with what it waits
    for and until when it sleeps in place of the columns they are read from."""
    if "journal" in out:  # a lease's row: steps and events in one array, when the job has some
        journal = out.pop("journal")
        if journal is not None:
            for name, value in zip(("steps", "events"), journal, strict=True):
                if value is not None:
                    out[name] = JSONText(value)
        return
    if "steps" not in out:  # a row of neither kind (an SQS message's, say)
        return
    for name in ("steps", "events"):
        if out[name] is not None:
            out[name] = JSONText(out[name])
    event, sleep_until, status = out.pop("wait_event"), out.pop("sleep_until"), out["status"]
    out["waiting_for"] = (
        {"event": event, "until": out["run_at"]} if status == "waiting" and event is not None else None
    )
    out["sleeping_until"] = (
        sleep_until
        if status == "pending" and sleep_until is not None and sleep_until > datetime.now(UTC)
        else None
    )


async def job_status(conn: asyncpg.Connection, job_id: int, scope: Scope = None) -> str:
    """The status of a job that a guarded statement left alone; NotFound when there is no such job (or
    it is outside `scope`)."""
    status = await conn.fetchval(q.JOB_STATUS.text, *q.JOB_STATUS.args(id=job_id, scope=scope))
    if status is None:
        raise NotFound(f"job {job_id} does not exist")
    return status


async def run_guarded(
    conn: asyncpg.Connection, query: q.Query, job_id: int, scope: Scope, only: str
) -> asyncpg.Record:
    """The row of `query`, a statement that changes job `job_id` only in the status it expects (`only`
    says which, for the error): Conflict naming the job's status when it is in another, NotFound when
    there is no such job (or it is outside `scope`)."""
    row = await conn.fetchrow(query.text, *query.args(id=job_id, scope=scope))
    if row is None:
        status = await job_status(conn, job_id, scope)
        raise Conflict(f"job {job_id} is {status}; only {only}", job_status=status)
    return row
