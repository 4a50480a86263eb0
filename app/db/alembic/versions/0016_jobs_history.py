"""Finished jobs get a table of their own: `jobs_history`, range-partitioned by day of `purge_after`, and
the `all_jobs` view over both tables

Expand only: a new partitioned table, its default partition and a view; nothing existing changes. Its
day partitions are the service's to make and to drop (app/service/history.py). The code of this revision
moves a job to jobs_history in the statement that completes or cancels it, and moves the completed and
cancelled rows still in `jobs` in batches in the background: those written before the upgrade, and
those that replicas of an older release write while a rolling upgrade runs.

Code of revision 0002 runs on this schema unchanged, but it does not know jobs_history: while old and new
replicas serve side by side, an old replica answers 404 for a job that a new one finished (GET
/jobs/{id}), and 404 instead of 200 to a repeated ack of such a job. Nothing is lost or done twice.

Revision ID: 0016
Revises: 0015
Create Date: 2027-02-27
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

# The oldest code revision that runs on this schema (expand only: 0015's floor).
compatible_from = "0002"

SCHEMA = "jobq"

# A job's columns as they are at this revision, written out: a revision is frozen. A later revision that
# adds a column to jobs adds it to jobs_history too, and makes the view again.
COLUMNS = """
    id bigint NOT NULL,
    queue text NOT NULL,
    status text NOT NULL,
    payload jsonb NOT NULL,
    priority integer NOT NULL,
    run_at timestamptz NOT NULL,
    attempts integer NOT NULL,
    max_attempts integer,
    dedup_key text,
    last_error text,
    lease_token uuid,
    lease_expires_at timestamptz,
    worker_id text,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    completed_at timestamptz,
    message_attributes jsonb,
    first_received_at timestamptz,
    kind text,
    result jsonb,
    progress jsonb,
    awaited boolean NOT NULL,
    schedule text,
    schedule_slot timestamptz,
    key text,
    traceparent text,
    tracestate text
"""
NAMES = ", ".join(line.split()[0] for line in COLUMNS.strip().splitlines())

CREATE = f"""
CREATE TABLE IF NOT EXISTS {SCHEMA}.jobs_history (
    {COLUMNS.strip()},
    purge_after timestamptz NOT NULL,
    CONSTRAINT pk_jobs_history PRIMARY KEY (id, purge_after)
) PARTITION BY RANGE (purge_after)
"""
INDEX = f"CREATE INDEX IF NOT EXISTS ix_jobs_history_queue_id ON {SCHEMA}.jobs_history (queue, id)"
DEFAULT_PARTITION = (
    f"CREATE TABLE IF NOT EXISTS {SCHEMA}.jobs_history_default PARTITION OF {SCHEMA}.jobs_history DEFAULT"
)
# Every job, wherever it is, and when it is purged (NULL: not finished, in jobs); a finished job past its
# purge_after is gone already for the API, although its partition may still be there (until its day
# ends). A statement reads it with one snapshot, so it sees a job that moves at that moment in one table
# or the other, never in both or neither. The filter stands outside the UNION ALL: PostgreSQL flattens
# the two tables (and jobs_history's partitions) into one list only when no branch has a WHERE of its
# own, and only then can it walk them all in id order at once (a page of GET /jobs, newest first).
VIEW = f"""
CREATE OR REPLACE VIEW {SCHEMA}.all_jobs AS
SELECT * FROM (
    SELECT {NAMES}, NULL::timestamptz AS purge_after FROM {SCHEMA}.jobs
    UNION ALL
    SELECT {NAMES}, purge_after FROM {SCHEMA}.jobs_history
) j
WHERE purge_after IS NULL OR purge_after > now()
"""


def upgrade() -> None:
    op.execute(CREATE)
    op.execute(INDEX)
    op.execute(DEFAULT_PARTITION)
    op.execute(VIEW)


def downgrade() -> None:
    # The finished jobs go back to jobs first, as the code before this revision keeps them.
    op.execute(f"""
        WITH moved AS (DELETE FROM {SCHEMA}.jobs_history WHERE purge_after > now() RETURNING *)
        INSERT INTO {SCHEMA}.jobs ({NAMES}) SELECT {NAMES} FROM moved
    """)
    op.execute(f"DROP VIEW IF EXISTS {SCHEMA}.all_jobs")
    op.execute(f"DROP TABLE IF EXISTS {SCHEMA}.jobs_history")
