"""Keyed flow control: queue settings (key_concurrency, fair, rate, key_rate), a `keys` table for per-key
overrides and rate windows, and two partial indexes on keyed jobs that the flow-controlled claim walks

Expand only: nullable columns and columns with constant defaults on `queues` (catalog only, no rewrite);
a new table; two partial indexes on `jobs` that hold only jobs with a key, built CONCURRENTLY outside the
step's transaction (enqueues and claims go on while they scan). Code of revision 0002 runs on this schema
unchanged: it never sets these settings, and a queue without them is claimed as before.

Revision ID: 0009
Revises: 0008
Create Date: 2027-01-16
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from app.db.migrations import build_index, lock_tables

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# The oldest code revision that runs on this schema (expand only: 0008's floor).
compatible_from = "0002"

SCHEMA = "jobq"

ADD_COLUMNS = f"""
ALTER TABLE {SCHEMA}.queues
    ADD COLUMN IF NOT EXISTS key_concurrency integer,
    ADD COLUMN IF NOT EXISTS fair boolean NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS rate_limit integer,
    ADD COLUMN IF NOT EXISTS rate_period double precision,
    ADD COLUMN IF NOT EXISTS key_rate_limit integer,
    ADD COLUMN IF NOT EXISTS key_rate_period double precision,
    ADD COLUMN IF NOT EXISTS flow boolean NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS rate_times timestamptz[],
    ADD COLUMN IF NOT EXISTS rate_counts integer[]
"""
DROP_COLUMNS = f"""
ALTER TABLE {SCHEMA}.queues
    DROP COLUMN IF EXISTS key_concurrency, DROP COLUMN IF EXISTS fair, DROP COLUMN IF EXISTS rate_limit,
    DROP COLUMN IF EXISTS rate_period, DROP COLUMN IF EXISTS key_rate_limit,
    DROP COLUMN IF EXISTS key_rate_period, DROP COLUMN IF EXISTS flow, DROP COLUMN IF EXISTS rate_times,
    DROP COLUMN IF EXISTS rate_counts
"""

INDEXES = {
    "ix_jobs_key_ready": "(queue, key, priority, run_at, id) WHERE status = 'pending' AND key IS NOT NULL",
    "ix_jobs_key_held": (
        "(queue, key) WHERE key IS NOT NULL AND (status = 'running' OR (status = 'pending' AND attempts > 0))"
    ),
}


def upgrade() -> None:
    lock_tables("queues")
    op.execute(ADD_COLUMNS)
    op.create_table(
        "keys",
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=True),
        sa.Column("rate_limit", sa.Integer(), nullable=True),
        sa.Column("rate_period", sa.Double(), nullable=True),
        sa.Column("rate_times", postgresql.ARRAY(sa.DateTime(timezone=True)), nullable=True),
        sa.Column("rate_counts", postgresql.ARRAY(sa.Integer()), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("queue", "key", name="pk_keys"),
        schema=SCHEMA,
    )
    # Commits the part above (releasing its lock), then builds the indexes outside any transaction.
    with op.get_context().autocommit_block():
        for name, definition in INDEXES.items():
            build_index(name, definition)


def downgrade() -> None:
    with op.get_context().autocommit_block():
        for name in INDEXES:
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {SCHEMA}.{name}")
    lock_tables("queues")
    op.drop_table("keys", schema=SCHEMA)
    op.execute(DROP_COLUMNS)
