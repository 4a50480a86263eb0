"""jobs and queues tables, their indexes, and the jobq.enqueue() SQL function

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# The oldest code revision that runs on the schema once this revision is applied (app/db/migrations.py).
compatible_from = "0001"

SCHEMA = "jobq"

# Enqueue inside the caller's own transaction: the job exists exactly when the caller's writes commit.
# Returns the new job's id, or the id of the pending/running job already holding `dedup_key`.
# A new job wakes waiting workers with the same NOTIFY the service's own statements send
# (app/db/sql/), delivered when the caller commits; a duplicate sends none.
ENQUEUE_FUNCTION = """
CREATE FUNCTION jobq.enqueue(
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
    INSERT INTO jobq.queues (name) VALUES (enqueue.queue) ON CONFLICT DO NOTHING;
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


def upgrade() -> None:
    op.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    op.create_table(
        "queues",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("paused", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("visibility_timeout", sa.Double(), server_default=sa.text("30.0"), nullable=False),
        sa.Column("max_attempts", sa.Integer(), server_default=sa.text("5"), nullable=False),
        sa.Column("backoff_base", sa.Double(), server_default=sa.text("30.0"), nullable=False),
        sa.Column("backoff_cap", sa.Double(), server_default=sa.text("3600.0"), nullable=False),
        sa.Column("retention", sa.Double(), server_default=sa.text("86400.0"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint("name ~ '^[A-Za-z0-9_.:-]{1,128}$'", name="ck_queues_name_format"),
        sa.PrimaryKeyConstraint("name", name="pk_queues"),
        schema=SCHEMA,
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), server_default=sa.text("'pending'"), nullable=False),
        sa.Column("payload", postgresql.JSONB(), nullable=False),
        sa.Column("priority", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("run_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=True),
        sa.Column("dedup_key", sa.Text(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("lease_token", postgresql.UUID(as_uuid=True), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("worker_id", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'running', 'completed', 'dead', 'cancelled')", name="ck_jobs_status_known"
        ),
        sa.CheckConstraint("max_attempts IS NULL OR max_attempts >= 1", name="ck_jobs_max_attempts_positive"),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
        schema=SCHEMA,
    )
    # Rows are updated several times each (lease, ack) and then deleted: leave room on each page for
    # HOT updates, and vacuum after 2 % of the table changed instead of PostgreSQL's 20 %.
    op.execute(
        "ALTER TABLE jobq.jobs SET (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.02,"
        " autovacuum_vacuum_insert_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02,"
        " autovacuum_vacuum_cost_delay = 1)"
    )
    op.create_index(
        "ix_jobs_claim",
        "jobs",
        ["queue", "priority", "run_at", "id"],
        schema=SCHEMA,
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_index(
        "ix_jobs_lease_expiry",
        "jobs",
        ["lease_expires_at"],
        schema=SCHEMA,
        postgresql_where=sa.text("status = 'running'"),
    )
    op.create_index(
        "uq_jobs_dedup",
        "jobs",
        ["queue", "dedup_key"],
        unique=True,
        schema=SCHEMA,
        postgresql_where=sa.text("status IN ('pending', 'running') AND dedup_key IS NOT NULL"),
    )
    op.create_index(
        "ix_jobs_dead", "jobs", ["queue", "id"], schema=SCHEMA, postgresql_where=sa.text("status = 'dead'")
    )
    op.create_index(
        "ix_jobs_finished",
        "jobs",
        ["completed_at"],
        schema=SCHEMA,
        postgresql_where=sa.text("status IN ('completed', 'cancelled')"),
    )
    op.execute(ENQUEUE_FUNCTION)


def downgrade() -> None:
    op.execute("DROP FUNCTION jobq.enqueue(text, jsonb, integer, timestamptz, integer, text)")
    op.drop_table("jobs", schema=SCHEMA)
    op.drop_table("queues", schema=SCHEMA)
