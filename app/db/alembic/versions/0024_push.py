"""Push delivery: a queue's jobs POSTed to an HTTP endpoint by the service itself (API part 7)

Expand only: on queues, the push target (`push`: url, timeout, concurrency), its signing secrets (the
current one, and the one it replaced with the time that one stops being valid) and how long the queue's
deliveries are held after an endpoint answered 429 or 503 with Retry-After; the table of keys held so; and
on jobs and jobs_history the outcome of the job's last delivery (`delivery`), appended to the all_jobs view;
and an index of the deliveries in flight per queue (running jobs leased by a replica's pusher, worker id
`push:...`), which a claim of deliveries counts. Every column is nullable: no rewrite, and code of an older
revision never reads or writes them (an older replica's workers may still lease a push queue's jobs, as any
worker may).

Revision ID: 0024
Revises: 0023
Create Date: 2027-06-01
"""

from alembic import op

from app.db.migrations import lock_tables

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

# The oldest code revision that runs on this schema (expand only: 0023's floor).
compatible_from = "0014"

SCHEMA = "jobq"

QUEUE_COLUMNS = f"""ALTER TABLE {SCHEMA}.queues
    ADD COLUMN IF NOT EXISTS push jsonb,
    ADD COLUMN IF NOT EXISTS push_secret text,
    ADD COLUMN IF NOT EXISTS push_secret_previous text,
    ADD COLUMN IF NOT EXISTS push_secret_previous_until timestamptz,
    ADD COLUMN IF NOT EXISTS push_held_until timestamptz"""
JOB_COLUMN = "ADD COLUMN IF NOT EXISTS delivery jsonb"
HOLDS = f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.push_holds (
    queue text NOT NULL,
    key text NOT NULL,
    until timestamptz NOT NULL,
    CONSTRAINT pk_push_holds PRIMARY KEY (queue, key)
)"""

# Built concurrently, outside the migration's transaction: the table is not locked meanwhile.
PUSHING_INDEX = (
    f"CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_jobs_pushing ON {SCHEMA}.jobs (queue)"
    " WHERE status = 'running' AND worker_id LIKE 'push:%'"
)

# The view as 0023 made it, `delivery` appended.
NAMES = (
    "id, queue, status, payload, priority, run_at, attempts, max_attempts, dedup_key, last_error, "
    "lease_token, lease_expires_at, worker_id, created_at, updated_at, completed_at, message_attributes, "
    "first_received_at, kind, result, progress, awaited, schedule, schedule_slot, key, traceparent, "
    "tracestate"
)
OLD_NAMES = "depends_on, run_if, workflow_id, has_children, debounce_key, debounce_until"


def view(extra: str) -> str:
    return f"""
CREATE OR REPLACE VIEW {SCHEMA}.all_jobs AS
SELECT * FROM (
    SELECT {NAMES}, NULL::timestamptz AS purge_after, {OLD_NAMES}{extra} FROM {SCHEMA}.jobs
    UNION ALL
    SELECT {NAMES}, purge_after, {OLD_NAMES}{extra} FROM {SCHEMA}.jobs_history
) j
WHERE purge_after IS NULL OR purge_after > now()
"""


def upgrade() -> None:
    lock_tables("jobs")
    op.execute(f"ALTER TABLE {SCHEMA}.jobs {JOB_COLUMN}")
    op.execute(f"ALTER TABLE {SCHEMA}.jobs_history {JOB_COLUMN}")
    op.execute(view(", delivery"))
    op.execute(QUEUE_COLUMNS)
    op.execute(HOLDS)
    # Commits the part above (releasing its lock), then builds the index outside any transaction.
    with op.get_context().autocommit_block():
        op.execute(PUSHING_INDEX)


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {SCHEMA}.ix_jobs_pushing")
    lock_tables("jobs")
    op.execute(f"DROP TABLE IF EXISTS {SCHEMA}.push_holds")
    op.execute(f"DROP VIEW IF EXISTS {SCHEMA}.all_jobs")
    op.execute(view(""))
    for table in ("jobs", "jobs_history"):
        op.execute(f"ALTER TABLE {SCHEMA}.{table} DROP COLUMN IF EXISTS delivery")
    op.execute(f"""ALTER TABLE {SCHEMA}.queues
        DROP COLUMN IF EXISTS push, DROP COLUMN IF EXISTS push_secret,
        DROP COLUMN IF EXISTS push_secret_previous, DROP COLUMN IF EXISTS push_secret_previous_until,
        DROP COLUMN IF EXISTS push_held_until""")
