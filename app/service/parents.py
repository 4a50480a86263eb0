"""A job's parents as its workers and readers see them (API part 6): carried by a lease, so that a child
reads what its parents returned without another request, and paged for any job; and a job's children, for
its page in the dashboard."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from app.core.errors import NotFound
from app.core.jsontext import JSONText
from app.core.limits import MAX_LEASED_PARENTS
from app.db import sql as q
from app.db.pool import Database
from app.service.rows import Row, Scope


def _parent(row: object) -> Row:
    parent = dict(row)  # type: ignore[call-overload]
    if parent["result"] is not None:
        parent["result"] = JSONText(parent["result"])
    return parent


async def attach_parents(db: Database, jobs: Sequence[Row]) -> None:
    """Give each leased job with at most MAX_LEASED_PARENTS parents its `parents` ({id, kind, status,
    result}, in id order as GET /jobs/{id}/parents pages them; one pruned already is left out), read in
    one statement for the whole lease; a job with more has none (GET /jobs/{id}/parents pages them). The
    lease rows' `depends_on` goes: a job without parents is handed out as it always was, and costs no
    statement."""
    wanted: dict[int, list[int]] = {}
    for job in jobs:
        parents = job.pop("depends_on", None)
        if parents is not None and len(parents) <= MAX_LEASED_PARENTS:
            wanted[job["id"]] = parents
    if not wanted:
        return
    ids = sorted({p for parents in wanted.values() for p in parents})
    async with db.acquire() as conn:
        rows = await conn.fetch(q.PARENTS.text, *q.PARENTS.args(ids=ids))
    found = {row["id"]: _parent(row) for row in rows}
    for job in jobs:
        parents = wanted.get(job["id"])
        if parents is not None:
            job["parents"] = [found[p] for p in sorted(set(parents)) if p in found]


async def job_parents(db: Database, job_id: int, limit: int, after_id: int, scope: Scope = None) -> Row:
    """A page of a job's parents in id order after `after_id`, and the `after_id` of the next page (None
    once none is left); NotFound when there is no such job (or it is outside `scope`)."""
    return await _page(db, q.JOB_PARENTS, "parents", _parent, job_id, limit, after_id, scope)


async def job_children(db: Database, job_id: int, limit: int, after_id: int, scope: Scope = None) -> Row:
    """A page of a job's children ({id, queue, kind, status, run_at}) in id order after `after_id`, and the
    `after_id` of the next page (None once none is left): the jobs waiting for it, and those of its
    workflow that name it (JOB_CHILDREN says which it cannot find); children outside `scope` are left out.
    NotFound when there is no such job (or it is outside `scope`)."""
    return await _page(db, q.JOB_CHILDREN, "children", dict, job_id, limit, after_id, scope)


async def _page(
    db: Database,
    query: q.Query,
    name: str,
    made: Callable[[Any], Row],
    job_id: int,
    limit: int,
    after_id: int,
    scope: Scope,
) -> Row:
    """A page of `query`'s rows about a job (`name`: what they are), each `made` into its answer. The
    query answers no row for a job that does not exist (or is out of scope), one row of NULLs for a job
    with none, and `limit` + 1 rows when there are more."""
    async with db.acquire() as conn:
        rows = await conn.fetch(
            query.text, *query.args(id=job_id, limit=limit + 1, after_id=after_id, scope=scope)
        )
    if not rows:
        raise NotFound(f"job {job_id} does not exist")
    found = [made(row) for row in rows if row["id"] is not None]
    page = found[:limit]
    return {name: page, "next_after_id": page[-1]["id"] if len(found) > limit else None}
