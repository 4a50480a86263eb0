"""Jobs take a `kind` (what the job is: send_email), and jobq.enqueue() takes `kind => ...`

Expand only: a nullable column without a default (no rewrite), its CHECK added NOT VALID and validated
after the step's exclusive lock is gone, and jobq.enqueue() with one trailing parameter more, defaulted,
so every existing call (positional or named) runs as before. Code of revision 0002 runs on this schema
unchanged: it never reads or writes the column, and its rows leave it NULL, which the CHECK allows.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-12
"""

from alembic import op

from app.db.migrations import lock_tables

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# The oldest code revision that runs on this schema (expand only: 0003's floor).
compatible_from = "0002"

SCHEMA = "jobq"

# The queue-name alphabet and length (app/db/tables.py QUEUE_NAME_PATTERN), written out: a revision must
# build the same schema whatever the models say later.
KIND_CHECK = "kind ~ '^[A-Za-z0-9_.:-]{1,128}$'"

# The column, and its CHECK added NOT VALID: new rows are checked at once, and the ALTER, which holds
# ACCESS EXCLUSIVE on jobs, scans nothing. Each part is idempotent, because the step runs again from the
# start when its validation (below, after this part committed) times out on its lock.
ADD_KIND = f"""
ALTER TABLE {SCHEMA}.jobs
    ADD COLUMN IF NOT EXISTS kind text,
    DROP CONSTRAINT IF EXISTS ck_jobs_kind_format,
    ADD CONSTRAINT ck_jobs_kind_format CHECK ({KIND_CHECK}) NOT VALID
"""
# Validation scans the table under SHARE UPDATE EXCLUSIVE, which enqueues, leases and acks do not wait for.
VALIDATE_KIND = f"ALTER TABLE {SCHEMA}.jobs VALIDATE CONSTRAINT ck_jobs_kind_format"

# jobq.enqueue() as 0003 made it, with `kind` (marked): a new parameter cannot be added in place (CREATE
# OR REPLACE keeps the argument list), and two overloads would make every call that leaves out the new
# argument ambiguous, so the old function is dropped and this one created in one transaction. `kind` is
# last and defaulted: `jobq.enqueue('q', '{}')`, positional calls up to `dedup_key` and named ones
# resolve to it unchanged. A bad kind fails the CHECK, as a bad queue name does.
OLD_SIGNATURE = "jobq.enqueue(text, jsonb, integer, timestamptz, integer, text)"
NEW_SIGNATURE = "jobq.enqueue(text, jsonb, integer, timestamptz, integer, text, text)"
ENQUEUE_FUNCTION = """
CREATE OR REPLACE FUNCTION jobq.enqueue(
    queue text,
    payload jsonb,
    priority integer DEFAULT 0,
    run_at timestamptz DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    dedup_key text DEFAULT NULL{kind_parameter}
) RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    job_id bigint;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(1785684593, hashtext(enqueue.queue));
    INSERT INTO jobq.queues (name) VALUES (enqueue.queue) ON CONFLICT DO NOTHING;
    LOOP
        INSERT INTO jobq.jobs (queue, payload, priority, run_at, max_attempts, dedup_key{kind_column})
        VALUES (enqueue.queue, coalesce(enqueue.payload, 'null'::jsonb), coalesce(enqueue.priority, 0),
                coalesce(enqueue.run_at, now()), enqueue.max_attempts, enqueue.dedup_key{kind_value})
        ON CONFLICT (queue, dedup_key) WHERE status IN ('pending', 'running') AND dedup_key IS NOT NULL
        DO NOTHING
        RETURNING id INTO job_id;
        IF job_id IS NOT NULL THEN
            PERFORM pg_notify('jobq', json_build_object(
                'queue', enqueue.queue, 'n', 1,
                'run_at', extract(epoch FROM coalesce(enqueue.run_at, now())))::text);
            RETURN job_id;
        END IF;
        -- A duplicate: answer with the active holder. It may finish between the two statements; then
        -- the key is free again and the insert is retried.
        SELECT id INTO job_id FROM jobq.jobs j
        WHERE j.queue = enqueue.queue AND j.dedup_key = enqueue.dedup_key
          AND j.status IN ('pending', 'running');
        IF job_id IS NOT NULL THEN
            RETURN job_id;
        END IF;
    END LOOP;
END
$$;
"""
WITH_KIND = {
    "kind_parameter": ",\n    kind text DEFAULT NULL",  # new
    "kind_column": ", kind",  # new
    "kind_value": ", enqueue.kind",  # new
}
WITHOUT_KIND = dict.fromkeys(WITH_KIND, "")


def upgrade() -> None:
    lock_tables("jobs")
    op.execute(ADD_KIND)
    op.execute(f"DROP FUNCTION IF EXISTS {OLD_SIGNATURE}")
    op.execute(ENQUEUE_FUNCTION.format(**WITH_KIND))
    # Commits the part above (releasing its lock), then validates outside any transaction.
    with op.get_context().autocommit_block():
        op.execute(VALIDATE_KIND)


def downgrade() -> None:
    lock_tables("jobs")
    op.execute(f"DROP FUNCTION IF EXISTS {NEW_SIGNATURE}")
    op.execute(ENQUEUE_FUNCTION.format(**WITHOUT_KIND))
    op.execute(f"ALTER TABLE {SCHEMA}.jobs DROP COLUMN IF EXISTS kind")
