"""Jobs carry `awaited`: someone waits for the job to finish (`GET /jobs/{id}?wait=N`)

A waiter sets it; the statements that finish a job (ack, cancel, a nack or lease expiry into dead) send
a notification for the jobs that have it, and only for those, so a queue nobody waits on pays nothing.

Expand only: a boolean column with a constant default, which PostgreSQL 11 and later keep in the
catalog (no rewrite, no scan), so the step's exclusive lock on jobs lasts a moment. Code of revision 0002
runs on this schema unchanged: it never reads the column, and its rows take the default.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-26
"""

from alembic import op

from app.db.migrations import lock_tables

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# The oldest code revision that runs on this schema (expand only: 0005's floor).
compatible_from = "0002"

SCHEMA = "jobq"

# IF NOT EXISTS: a step that gave up on its lock and runs again finds nothing half done.
ADD_COLUMN = f"ALTER TABLE {SCHEMA}.jobs ADD COLUMN IF NOT EXISTS awaited boolean NOT NULL DEFAULT false"
DROP_COLUMN = f"ALTER TABLE {SCHEMA}.jobs DROP COLUMN IF EXISTS awaited"


def upgrade() -> None:
    lock_tables("jobs")
    op.execute(ADD_COLUMN)


def downgrade() -> None:
    lock_tables("jobs")
    op.execute(DROP_COLUMN)
