"""A job's parents (API part 6): linking new waiting jobs to them, their results for a lease, and a page of
them for any job. What decides a waiting job is app/db/functions.sql (jobq.add_parents(), jobq.decide(),
jobq.parents_ended()) and its triggers: the transaction that ends a parent decides its children.
"""

from __future__ import annotations

from app.db.sql.fragments import _in_scope
from app.db.sql.query import Query

# Link new waiting jobs to their parents (jobq.add_parents()): each job's `delay` counts from its decision.
# Parents that are no job raise foreign_key_violation, their ids in the DETAIL.
ADD_PARENTS = Query.define("add_parents", "SELECT jobq.add_parents(:ids::bigint[], :delays::float8[])")

# The parents that leased jobs carry: each one's id, kind, how it ended and its result. A parent gone
# already (pruned by its queue's retention) has no row.
PARENTS = Query.define(
    "parents",
    "SELECT id, kind, status, result FROM jobq.all_jobs WHERE id = ANY(:ids::bigint[])",
)

# A page of a job's parents, in id order after :after_id; no row at all (not even the NULL one) when the
# job does not exist or is out of scope. A job without parents answers one row of NULLs.
JOB_PARENTS = Query.define(
    "job_parents",
    f"""
    SELECT p.id, p.kind, p.status, p.result
    FROM jobq.all_jobs c
    LEFT JOIN LATERAL (
        SELECT d.id FROM unnest(c.depends_on) AS d(id)
        WHERE d.id > :after_id ORDER BY d.id LIMIT :limit
    ) d ON true
    LEFT JOIN jobq.all_jobs p ON p.id = d.id
    WHERE c.id = :id AND {_in_scope("c.queue")}
    ORDER BY d.id
    """,
)
