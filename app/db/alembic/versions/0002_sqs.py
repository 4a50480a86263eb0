"""What the SQS API needs beside jobq's own columns: message attributes, first receive, queue attributes

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from app.db.migrations import lock_tables

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# The oldest code revision that runs on the schema once this revision is applied (app/db/migrations.py).
compatible_from = "0001"

SCHEMA = "jobq"


def upgrade() -> None:
    # Both tables at once, in the service's order (queues, then jobs): altering jobs and then queues
    # deadlocked with enqueues, which take queues and then jobs.
    lock_tables("jobs", "queues")
    # All nullable without defaults: adding them rewrites nothing, and jobs enqueued through jobq's own
    # API simply have none.
    op.add_column("jobs", sa.Column("message_attributes", postgresql.JSONB(), nullable=True), schema=SCHEMA)
    op.add_column(
        "jobs", sa.Column("first_received_at", sa.DateTime(timezone=True), nullable=True), schema=SCHEMA
    )
    op.add_column("queues", sa.Column("sqs_attributes", postgresql.JSONB(), nullable=True), schema=SCHEMA)


def downgrade() -> None:
    lock_tables("jobs", "queues")
    op.drop_column("queues", "sqs_attributes", schema=SCHEMA)
    op.drop_column("jobs", "first_received_at", schema=SCHEMA)
    op.drop_column("jobs", "message_attributes", schema=SCHEMA)
