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

# Of the parents named by jobs a token limited to some queues sends (each job's as the text of an array),
# those it may not see: in none of its queues, or no job at all. It may name only jobs it could read, so
# that a child never carries (or pages) the result of a job outside them.
PARENTS_OUT_OF_SCOPE = Query.define(
    "parents_out_of_scope",
    f"""
    SELECT coalesce(array_agg(DISTINCT p ORDER BY p), '{{}}') FROM unnest(:parents::text[]) d(ids)
    CROSS JOIN LATERAL unnest(d.ids::bigint[]) p
    WHERE NOT EXISTS (SELECT 1 FROM jobq.all_jobs a WHERE a.id = p AND {_in_scope("a.queue")})
    """,
)

# The parents that leased jobs carry: each one's id, kind, how it ended and its result. A parent gone
# already (pruned by its queue's retention) has no row.
PARENTS = Query.define(
    "parents",
    "SELECT id, kind, status, result FROM jobq.all_jobs WHERE id = ANY(:ids::bigint[])",
)

# A page of a job's parents, in id order after :after_id; no row at all (not even the NULL one) when the
# job does not exist or is out of scope. A job without parents answers one row of NULLs. Parents out of
# scope (which only a token of wider scope could have named) are left out, as are those pruned already.
JOB_PARENTS = Query.define(
    "job_parents",
    f"""
    SELECT p.id, p.kind, p.status, p.result
    FROM jobq.all_jobs c
    LEFT JOIN LATERAL (
        SELECT p.id, p.kind, p.status, p.result
        FROM unnest(c.depends_on) AS d(id) JOIN jobq.all_jobs p ON p.id = d.id AND {_in_scope("p.queue")}
        WHERE d.id > :after_id ORDER BY d.id LIMIT :limit
    ) p ON true
    WHERE c.id = :id AND {_in_scope("c.queue")}
    ORDER BY p.id
    """,
)

# A page of a job's children, in id order after :after_id, for its page in the dashboard: the jobs that
# still wait for it (jobq.job_edges, while it has not ended) and, for a job of a workflow, the jobs of its
# workflow that name it in depends_on (their own index, whatever has ended). Children outside its workflow
# whose parent has ended are not found: nothing indexes depends_on, and no page scans every job for them.
# No row at all when the job does not exist or is out of scope; a job without children answers one row of
# NULLs. Children out of scope are left out.
JOB_CHILDREN = Query.define(
    "job_children",
    f"""
    WITH parent AS (
        SELECT p.id, p.workflow_id FROM jobq.all_jobs p WHERE p.id = :id AND {_in_scope("p.queue")}
    ), kids AS (
        SELECT e.child_id AS id FROM jobq.job_edges e WHERE e.parent_id = :id AND e.child_id > :after_id
        UNION
        SELECT w.id FROM parent JOIN jobq.all_jobs w ON w.workflow_id = parent.workflow_id
        WHERE w.id > :after_id AND parent.id = ANY(w.depends_on)
    )
    SELECT c.id, c.queue, c.kind, c.status, c.run_at
    FROM parent
    LEFT JOIN LATERAL (
        SELECT c.id, c.queue, c.kind, c.status, c.run_at
        FROM kids JOIN jobq.all_jobs c ON c.id = kids.id
        WHERE {_in_scope("c.queue")}
        ORDER BY c.id LIMIT :limit
    ) c ON true
    ORDER BY c.id
    """,
)
