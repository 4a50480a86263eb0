"""Idempotency keys of enqueues; enqueues and DeleteQueue serialise per queue (jobq.enqueue takes the lock)

Expand only: a new table, and jobq.enqueue() replaced with the same signature and behaviour plus a shared
advisory lock on its queue. Code of revision 0002 runs on this schema unchanged (it never reads the new
table, and its enqueues simply do not take the lock).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

# The oldest code revision that runs on this schema.
compatible_from = "0002"

SCHEMA = "jobq"

# jobq.enqueue() as 0001 made it, with one line more (marked): the shared lock on its queue that every
# enqueue takes and DeleteQueue takes exclusively (app/db/sql/fragments.py, QUEUE_LOCK_CLASS; 1785684593
# is 'jobq' in ASCII, the lock class jobq's queue locks use). Held until the caller's transaction ends, so a
# DeleteQueue of this queue waits for the caller to commit, and then deletes this job with the others.
ENQUEUE_FUNCTION = """
CREATE OR REPLACE FUNCTION jobq.enqueue(
    queue text,
    payload jsonb,
    priority integer DEFAULT 0,
    run_at timestamptz DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    dedup_key text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    job_id bigint;
BEGIN
    {lock}INSERT INTO jobq.queues (name) VALUES (enqueue.queue) ON CONFLICT DO NOTHING;
    LOOP
        INSERT INTO jobq.jobs (queue, payload, priority, run_at, max_attempts, dedup_key)
        VALUES (enqueue.queue, coalesce(enqueue.payload, 'null'::jsonb), coalesce(enqueue.priority, 0),
                coalesce(enqueue.run_at, now()), enqueue.max_attempts, enqueue.dedup_key)
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
LOCK = "PERFORM pg_advisory_xact_lock_shared(1785684593, hashtext(enqueue.queue));\n    "


def upgrade() -> None:
    # Answers of enqueues sent with an Idempotency-Key (app/service.py), kept until expires_at.
    op.create_table(
        "idempotency_keys",
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("request_hash", sa.LargeBinary(), nullable=False),
        sa.Column("ids", postgresql.ARRAY(sa.BigInteger()), nullable=False),
        sa.Column("run_ats", postgresql.ARRAY(sa.DateTime(timezone=True)), nullable=True),
        sa.Column("max_attempts", postgresql.ARRAY(sa.Integer()), nullable=False),
        sa.Column("holders", postgresql.ARRAY(sa.Text()), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("scope", "key", name="pk_idempotency_keys"),
        schema=SCHEMA,
    )
    op.create_index("ix_idempotency_keys_expires_at", "idempotency_keys", ["expires_at"], schema=SCHEMA)
    op.execute(ENQUEUE_FUNCTION.replace("{lock}", LOCK))


def downgrade() -> None:
    op.execute(ENQUEUE_FUNCTION.replace("{lock}", ""))
    op.drop_index("ix_idempotency_keys_expires_at", table_name="idempotency_keys", schema=SCHEMA)
    op.drop_table("idempotency_keys", schema=SCHEMA)
