"""Unique indexes that name the queue, as a jobs table distributed by queue needs (README: Scaling out):
jobs (queue, id) unique, and a schedule slot's job unique per (queue, schedule, slot)

Expand only, both indexes built CONCURRENTLY outside any transaction:
- uq_jobs_queue_id replaces ix_jobs_queue_id, the same columns, now unique (ids are unique already, so
  the build cannot fail on existing rows); GET /jobs?queue= reads it as it read the old one.
- uq_jobs_queue_schedule_slot beside uq_jobs_schedule_slot. The scheduler's insert names no arbiter
  (ON CONFLICT DO NOTHING), so it runs on either; code before this revision names the old index as its
  arbiter, so that one stays until a contract revision, once no such code runs.
Code of revision 0002 runs on this schema unchanged.

Revision ID: 0014
Revises: 0013
Create Date: 2027-02-13
"""

from alembic import op

from app.db.migrations import build_index

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

# The oldest code revision that runs on this schema (expand only: 0013's floor).
compatible_from = "0002"

SCHEMA = "jobq"


def upgrade() -> None:
    with op.get_context().autocommit_block():
        build_index("uq_jobs_queue_id", "(queue, id)", unique=True)
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {SCHEMA}.ix_jobs_queue_id")
        build_index(
            "uq_jobs_queue_schedule_slot",
            "(queue, schedule, schedule_slot) WHERE schedule_slot IS NOT NULL",
            unique=True,
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {SCHEMA}.uq_jobs_queue_schedule_slot")
        build_index("ix_jobs_queue_id", "(queue, id)")
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {SCHEMA}.uq_jobs_queue_id")
