"""Jobs take a `key` (a tenant, a customer, an SQS MessageGroupId: what flow control will group jobs by),
and jobq.enqueue() takes `key => ...`

Expand only, as revision 0004 did for `kind`: a nullable column without a default (no rewrite), its
CHECK (1-256 characters) added NOT VALID and validated after the step's exclusive lock is gone, and
jobq.enqueue() with one trailing parameter more, defaulted, so every existing call runs as before. Code
of revision 0002 runs on this schema unchanged: it never reads or writes the column.

Revision ID: 0008
Revises: 0007
Create Date: 2027-01-09
"""

from alembic import op

from app.db.migrations import lock_tables

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

# The oldest code revision that runs on this schema (expand only: 0007's floor).
compatible_from = "0002"

SCHEMA = "jobq"

KEY_CHECK = "char_length(key) BETWEEN 1 AND 256"

# Each part idempotent: the step runs again from the start when its validation times out on its lock.
ADD_KEY = f"""
ALTER TABLE {SCHEMA}.jobs
    ADD COLUMN IF NOT EXISTS key text,
    DROP CONSTRAINT IF EXISTS ck_jobs_key_length,
    ADD CONSTRAINT ck_jobs_key_length CHECK ({KEY_CHECK}) NOT VALID
"""
VALIDATE_KEY = f"ALTER TABLE {SCHEMA}.jobs VALIDATE CONSTRAINT ck_jobs_key_length"

# jobq.enqueue() as 0004 made it, with `key` (marked) last: see 0004 for why the old function is dropped
# and this one created in the same transaction rather than overloaded.
OLD_SIGNATURE = "jobq.enqueue(text, jsonb, integer, timestamptz, integer, text, text)"
NEW_SIGNATURE = "jobq.enqueue(text, jsonb, integer, timestamptz, integer, text, text, text)"
ENQUEUE_FUNCTION = """
CREATE OR REPLACE FUNCTION jobq.enqueue(
    queue text,
    payload jsonb,
    priority integer DEFAULT 0,
    run_at timestamptz DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    dedup_key text DEFAULT NULL,
    kind text DEFAULT NULL{key_parameter}
) RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    job_id bigint;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(1785684593, hashtext(enqueue.queue));
    INSERT INTO jobq.queues (name) VALUES (enqueue.queue) ON CONFLICT DO NOTHING;
    LOOP
        INSERT INTO jobq.jobs (queue, payload, priority, run_at, max_attempts, dedup_key, kind{key_column})
        VALUES (enqueue.queue, coalesce(enqueue.payload, 'null'::jsonb), coalesce(enqueue.priority, 0),
                coalesce(enqueue.run_at, now()), enqueue.max_attempts, enqueue.dedup_key,
                enqueue.kind{key_value})
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
WITH_KEY = {
    "key_parameter": ",\n    key text DEFAULT NULL",  # new
    "key_column": ", key",  # new
    "key_value": ", enqueue.key",  # new
}
WITHOUT_KEY = dict.fromkeys(WITH_KEY, "")


def upgrade() -> None:
    lock_tables("jobs")
    op.execute(ADD_KEY)
    op.execute(f"DROP FUNCTION IF EXISTS {OLD_SIGNATURE}")
    op.execute(ENQUEUE_FUNCTION.format(**WITH_KEY))
    # Commits the part above (releasing its lock), then validates outside any transaction.
    with op.get_context().autocommit_block():
        op.execute(VALIDATE_KEY)


def downgrade() -> None:
    lock_tables("jobs")
    op.execute(f"DROP FUNCTION IF EXISTS {NEW_SIGNATURE}")
    op.execute(ENQUEUE_FUNCTION.format(**WITHOUT_KEY))
    op.execute(f"ALTER TABLE {SCHEMA}.jobs DROP COLUMN IF EXISTS key")
