"""Jobs keep the W3C trace context they were enqueued under (`traceparent`, `tracestate`), and
jobq.enqueue() takes it: `traceparent => ..., tracestate => ...`

Expand only, as revision 0008 did for `key`: nullable columns without a default (no rewrite), their
CHECKs added NOT VALID and validated after the step's exclusive lock is gone, and jobq.enqueue() with
two trailing parameters more, defaulted, so every existing call runs as before. Code of revision 0002
runs on this schema unchanged: it never reads or writes the columns.

Revision ID: 0015
Revises: 0014
Create Date: 2027-02-20
"""

from alembic import op

from app.db.migrations import lock_tables

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

# The oldest code revision that runs on this schema (expand only: 0014's floor).
compatible_from = "0002"

SCHEMA = "jobq"

# As app/db/tables.py has them (TRACEPARENT_PATTERN, MAX_TRACESTATE), written out: a revision is frozen.
TRACE_CHECK = (
    "traceparent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'"
    " AND char_length(coalesce(tracestate, '')) <= 512"
)

# Each part idempotent: the step runs again from the start when its validation times out on its lock.
ADD_TRACE = f"""
ALTER TABLE {SCHEMA}.jobs
    ADD COLUMN IF NOT EXISTS traceparent text,
    ADD COLUMN IF NOT EXISTS tracestate text,
    DROP CONSTRAINT IF EXISTS ck_jobs_trace_context,
    ADD CONSTRAINT ck_jobs_trace_context CHECK ({TRACE_CHECK}) NOT VALID
"""
VALIDATE_TRACE = f"ALTER TABLE {SCHEMA}.jobs VALIDATE CONSTRAINT ck_jobs_trace_context"

# jobq.enqueue() as 0008 made it, with the trace context (marked) last: see 0004 for why the old
# function is dropped and this one created in the same transaction rather than overloaded.
OLD_SIGNATURE = "jobq.enqueue(text, jsonb, integer, timestamptz, integer, text, text, text)"
NEW_SIGNATURE = "jobq.enqueue(text, jsonb, integer, timestamptz, integer, text, text, text, text, text)"
ENQUEUE_FUNCTION = """
CREATE OR REPLACE FUNCTION jobq.enqueue(
    queue text,
    payload jsonb,
    priority integer DEFAULT 0,
    run_at timestamptz DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    dedup_key text DEFAULT NULL,
    kind text DEFAULT NULL,
    key text DEFAULT NULL{trace_parameters}
) RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    job_id bigint;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(1785684593, hashtext(enqueue.queue));
    INSERT INTO jobq.queues (name) VALUES (enqueue.queue) ON CONFLICT DO NOTHING;
    LOOP
        INSERT INTO jobq.jobs
            (queue, payload, priority, run_at, max_attempts, dedup_key, kind, key{trace_columns})
        VALUES (enqueue.queue, coalesce(enqueue.payload, 'null'::jsonb), coalesce(enqueue.priority, 0),
                coalesce(enqueue.run_at, now()), enqueue.max_attempts, enqueue.dedup_key,
                enqueue.kind, enqueue.key{trace_values})
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
WITH_TRACE = {
    "trace_parameters": ",\n    traceparent text DEFAULT NULL,\n    tracestate text DEFAULT NULL",  # new
    "trace_columns": ", traceparent, tracestate",  # new
    "trace_values": ", enqueue.traceparent, enqueue.tracestate",  # new
}
WITHOUT_TRACE = dict.fromkeys(WITH_TRACE, "")


def upgrade() -> None:
    lock_tables("jobs")
    op.execute(ADD_TRACE)
    op.execute(f"DROP FUNCTION IF EXISTS {OLD_SIGNATURE}")
    op.execute(ENQUEUE_FUNCTION.format(**WITH_TRACE))
    # Commits the part above (releasing its lock), then validates outside any transaction.
    with op.get_context().autocommit_block():
        op.execute(VALIDATE_TRACE)


def downgrade() -> None:
    lock_tables("jobs")
    op.execute(f"DROP FUNCTION IF EXISTS {NEW_SIGNATURE}")
    op.execute(ENQUEUE_FUNCTION.format(**WITHOUT_TRACE))
    op.execute(
        f"ALTER TABLE {SCHEMA}.jobs DROP COLUMN IF EXISTS tracestate, DROP COLUMN IF EXISTS traceparent"
    )
