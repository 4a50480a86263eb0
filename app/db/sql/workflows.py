"""Workflows (API part 6): jobs made together by POST /workflows, each named by a `ref` its siblings give
as parents. A workflow's status is its jobs' (app/service/workflows.py); the row keeps it for lists and
filters, and it is brought up to date by whoever reads the workflow and by the background loop.
"""

from __future__ import annotations

from app.db.sql.jobs import _cancel
from app.db.sql.query import Query

# Ids for a workflow's jobs, drawn before they are inserted: a job names its siblings' ids as parents in
# the same statement. Ascending, in the request's order.
DRAW_JOB_IDS = Query.define(
    "draw_job_ids", "SELECT nextval('jobq.jobs_id_seq') AS id FROM generate_series(1, :n) ORDER BY 1"
)

NEW_WORKFLOW = Query.define(
    "new_workflow",
    """
    INSERT INTO jobq.workflows (name, refs, job_ids) VALUES (:name, :refs::text[], :job_ids::bigint[])
    RETURNING id, name, status, created_at, finished_at
    """,
)

GET_WORKFLOW = Query.define(
    "get_workflow",
    "SELECT id, name, status, refs, job_ids, created_at, finished_at FROM jobq.workflows WHERE id = :id",
)

# A workflow's jobs as they are now, in either table (a job pruned by its queue's retention is gone).
WORKFLOW_JOBS = Query.define(
    "workflow_jobs",
    """
    SELECT id, queue, kind, status, depends_on, coalesce(completed_at, updated_at) AS ended_at
    FROM jobq.all_jobs WHERE workflow_id = :id
    """,
)

# The status a reader worked out from the jobs, kept when it differs (finished_at set when it finishes,
# cleared when a retry makes it run again); a row back only when it changed. A cancelled workflow stays
# cancelled.
SET_WORKFLOW_STATUS = Query.define(
    "set_workflow_status",
    """
    UPDATE jobq.workflows
    SET status = :status,
        finished_at = CASE WHEN :status = 'running' THEN NULL ELSE coalesce(:finished_at, now()) END
    WHERE id = :id AND status IS DISTINCT FROM :status AND status <> 'cancelled'
    RETURNING id, status
    """,
)

# Workflows newest first, by status and name, a page at a time; for a token limited to some queues, those
# whose every job is in them (as GET /workflows/{id} shows a workflow).
LIST_WORKFLOWS = Query.define(
    "list_workflows",
    """
    SELECT w.id, w.name, w.status, w.created_at, w.finished_at FROM jobq.workflows w
    WHERE (:status::text IS NULL OR w.status = :status::text)
      AND (:name::text IS NULL OR w.name = :name::text)
      AND w.id < :before_id
      AND (:scope::text[] IS NULL OR NOT EXISTS (
          SELECT 1 FROM jobq.all_jobs j WHERE j.workflow_id = w.id AND NOT j.queue LIKE ANY(:scope::text[])))
    ORDER BY w.id DESC
    LIMIT :limit
    """,
)

# Running workflows, oldest first, for the background loop to bring their status up to date.
RUNNING_WORKFLOWS = Query.define(
    "running_workflows",
    "SELECT id FROM jobq.workflows WHERE status = 'running' AND id > :after_id ORDER BY id LIMIT :limit",
)

# DELETE /workflows/{id}: its waiting and pending jobs cancelled (running ones finish; their children,
# waiting, are among those cancelled), and the workflow marked cancelled.
CANCEL_WORKFLOW_JOBS = Query.define("cancel_workflow_jobs", _cancel("j.workflow_id = :id"))
MARK_CANCELLED = Query.define(
    "mark_cancelled",
    """
    UPDATE jobq.workflows SET status = 'cancelled', finished_at = now()
    WHERE id = :id AND status = 'running'
    RETURNING id
    """,
)

# POST /workflows/{id}/retry: dead jobs pending again, jobs their end cancelled waiting again
# (app/db/functions.sql, jobq.retry_workflow()); how many.
RETRY_WORKFLOW = Query.define("retry_workflow", "SELECT jobq.retry_workflow(:id) AS reopened")

# Finished workflows whose jobs are all gone (pruned past their queues' retention, or deleted): what is
# left of one is its row, which no job names any more. It looks at the :batch that finished first and
# takes those of them whose jobs are gone, so a batch comes back short (and pruning stops for this round)
# while the oldest finished workflows still have jobs: a workflow outlives its jobs by at most the longest
# retention among the queues of the workflows that finished before it, and pruning reads a batch of rows,
# never every workflow.
PRUNE_WORKFLOWS = Query.define(
    "prune_workflows",
    """
    WITH oldest AS (
        SELECT w.id FROM jobq.workflows w
        WHERE w.status <> 'running'
        ORDER BY w.finished_at
        LIMIT :batch
        FOR UPDATE SKIP LOCKED
    )
    DELETE FROM jobq.workflows w USING oldest
    WHERE w.id = oldest.id AND NOT EXISTS (SELECT 1 FROM jobq.all_jobs j WHERE j.workflow_id = w.id)
    """,
)
