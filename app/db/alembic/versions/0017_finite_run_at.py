"""A job's run_at is a finite time: CHECK (isfinite(run_at)) on jobs

PostgreSQL's -infinity and infinity have no place in Python's datetime: asyncpg reads them as naive
datetimes (an answer without its offset), the queue statistics cannot subtract them (GET /queues failed),
and the wake-up NOTIFY carries "-Infinity". The HTTP API refuses a run_at before 1970 or more than ten
years ahead; this constraint keeps the rest out, a jobq.enqueue(run_at => 'infinity') from SQL included.

Expand only: the CHECK is added NOT VALID under the step's lock, so only new and updated rows are
checked, and validated once the lock is gone. Rows written before with an infinite run_at are moved to
finite ends in between (-infinity to 1970-01-01, the first of all as it was; infinity to 9999-12-31,
never in practice), once before the lock so that the step holds it only briefly, and once after it for
any that came in meanwhile. Finished jobs in jobs_history keep theirs. Code of revision 0002 runs on this
schema unchanged: it writes run_at from now() or from a request's time, both finite.

Revision ID: 0017
Revises: 0016
Create Date: 2027-03-06
"""

from alembic import op

from app.db.migrations import lock_tables

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

# The oldest code revision that runs on this schema (expand only: 0016's floor).
compatible_from = "0002"

SCHEMA = "jobq"

MAKE_FINITE = f"""
UPDATE {SCHEMA}.jobs
SET run_at = CASE WHEN run_at < 'epoch' THEN timestamptz '1970-01-01Z' ELSE timestamptz '9999-12-31Z' END
WHERE NOT isfinite(run_at)
"""
# Idempotent: the step runs again from the start when it times out on its lock.
ADD_CHECK = f"""
ALTER TABLE {SCHEMA}.jobs
    DROP CONSTRAINT IF EXISTS ck_jobs_run_at_finite,
    ADD CONSTRAINT ck_jobs_run_at_finite CHECK (isfinite(run_at)) NOT VALID
"""
VALIDATE_CHECK = f"ALTER TABLE {SCHEMA}.jobs VALIDATE CONSTRAINT ck_jobs_run_at_finite"


def upgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute(MAKE_FINITE)
    lock_tables("jobs")
    op.execute(ADD_CHECK)
    # Commits the part above (releasing its lock), then goes on outside any transaction.
    with op.get_context().autocommit_block():
        op.execute(MAKE_FINITE)
        op.execute(VALIDATE_CHECK)


def downgrade() -> None:
    lock_tables("jobs")
    op.execute(f"ALTER TABLE {SCHEMA}.jobs DROP CONSTRAINT IF EXISTS ck_jobs_run_at_finite")
