"""Job lists by queue: an index on jobs (queue, id), so GET /jobs?queue= reads a queue's jobs newest first
without walking every other queue's

Expand only: one index, built CONCURRENTLY outside any transaction (enqueues and claims go on while it
scans). Code of revision 0002 runs on this schema unchanged.

Revision ID: 0011
Revises: 0010
Create Date: 2027-01-30
"""

from alembic import op

from app.db.migrations import build_index

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

# The oldest code revision that runs on this schema (expand only: 0010's floor).
compatible_from = "0002"

SCHEMA = "jobq"
NAME = "ix_jobs_queue_id"


def upgrade() -> None:
    with op.get_context().autocommit_block():
        build_index(NAME, "(queue, id)")


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {SCHEMA}.{NAME}")
