"""Jobs keep a `result` (what the worker's ack sent) and a `progress` (what its last extend sent)

Expand only: two nullable jsonb columns without a default, which PostgreSQL adds to the catalog alone
(no rewrite, no scan), so the step's exclusive lock on jobs lasts a moment. Code of revision 0002 runs
on this schema unchanged: it never reads or writes the columns, and its rows leave them NULL.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-19
"""

from alembic import op

from app.db.migrations import lock_tables

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# The oldest code revision that runs on this schema (expand only: 0004's floor).
compatible_from = "0002"

SCHEMA = "jobq"

# IF NOT EXISTS: a step that gave up on its lock and runs again finds nothing half done, but the same
# statement must still be safe to repeat.
ADD_COLUMNS = f"""
ALTER TABLE {SCHEMA}.jobs
    ADD COLUMN IF NOT EXISTS result jsonb,
    ADD COLUMN IF NOT EXISTS progress jsonb
"""
DROP_COLUMNS = f"""
ALTER TABLE {SCHEMA}.jobs
    DROP COLUMN IF EXISTS progress,
    DROP COLUMN IF EXISTS result
"""


def upgrade() -> None:
    lock_tables("jobs")
    op.execute(ADD_COLUMNS)


def downgrade() -> None:
    lock_tables("jobs")
    op.execute(DROP_COLUMNS)
