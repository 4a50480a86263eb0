"""Job lists by queue: an index on jobs (queue, id), so GET /jobs?queue= reads a queue's jobs newest first
without walking every other queue's

Expand only: one index, built CONCURRENTLY outside any transaction (enqueues and claims go on while it
scans). Code of revision 0002 runs on this schema unchanged.

Revision ID: 0011
Revises: 0010
Create Date: 2027-01-30
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

# The oldest code revision that runs on this schema (expand only: 0010's floor).
compatible_from = "0002"

SCHEMA = "jobq"
NAME = "ix_jobs_queue_id"
# A build that failed leaves an INVALID index behind, which IF NOT EXISTS would take for done.
DROP_INVALID_INDEX = f"""
DO $$ BEGIN
    IF EXISTS (SELECT FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
               JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE n.nspname = '{SCHEMA}' AND c.relname = '{NAME}' AND NOT i.indisvalid) THEN
        DROP INDEX {SCHEMA}.{NAME};
    END IF;
END $$
"""


def upgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute(DROP_INVALID_INDEX)
        op.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {NAME} ON {SCHEMA}.jobs (queue, id)")


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {SCHEMA}.{NAME}")
