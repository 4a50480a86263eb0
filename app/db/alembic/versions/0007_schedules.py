"""Schedules: cron schedules that enqueue jobs, the lease that lets one replica fire them, and jobs that
record the schedule and slot they came from

Expand only: two new tables; two nullable columns on jobs (catalog only, no rewrite); a partial unique
index on them, built CONCURRENTLY outside the step's transaction (so enqueues and claims go on while it
scans jobs), which makes a slot's job unique: two replicas racing for one slot cannot both enqueue it.
Code of revision 0002 runs on this schema unchanged.

Revision ID: 0007
Revises: 0006
Create Date: 2027-01-02
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from app.db.migrations import build_index, lock_tables

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# The oldest code revision that runs on this schema (expand only: 0006's floor).
compatible_from = "0002"

SCHEMA = "jobq"

ADD_COLUMNS = f"""
ALTER TABLE {SCHEMA}.jobs
    ADD COLUMN IF NOT EXISTS schedule text,
    ADD COLUMN IF NOT EXISTS schedule_slot timestamptz
"""
DROP_COLUMNS = f"""
ALTER TABLE {SCHEMA}.jobs
    DROP COLUMN IF EXISTS schedule_slot,
    DROP COLUMN IF EXISTS schedule
"""


def upgrade() -> None:
    lock_tables("jobs")
    op.execute(ADD_COLUMNS)
    op.create_table(
        "schedules",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("cron", sa.Text(), nullable=False),
        sa.Column("timezone", sa.Text(), server_default=sa.text("'UTC'"), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("payload", postgresql.JSONB(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=True),
        sa.Column("priority", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=True),
        sa.Column("key", sa.Text(), nullable=True),
        sa.Column("catch_up", sa.Text(), server_default=sa.text("'once'"), nullable=False),
        sa.Column("paused", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("next_run_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_run_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_job_id", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint("catch_up IN ('skip', 'once', 'all')", name="catch_up_known"),
        sa.PrimaryKeyConstraint("name", name="pk_schedules"),
        schema=SCHEMA,
    )
    op.create_index(
        "ix_schedules_due",
        "schedules",
        ["next_run_at"],
        schema=SCHEMA,
        postgresql_where=sa.text("NOT paused"),
    )
    op.create_table(
        "leaders",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("holder", sa.Text(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_leaders"),
        schema=SCHEMA,
    )
    # Commits the part above (releasing its lock), then builds the index outside any transaction.
    with op.get_context().autocommit_block():
        build_index(
            "uq_jobs_schedule_slot", "(schedule, schedule_slot) WHERE schedule_slot IS NOT NULL", unique=True
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {SCHEMA}.uq_jobs_schedule_slot")
    lock_tables("jobs")
    op.execute(DROP_COLUMNS)
    op.drop_table("leaders", schema=SCHEMA)
    op.drop_index("ix_schedules_due", table_name="schedules", schema=SCHEMA)
    op.drop_table("schedules", schema=SCHEMA)
