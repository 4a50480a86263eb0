"""SQS queue tags: `queues.sqs_tags`, the tags of TagQueue, UntagQueue, ListQueueTags and CreateQueue

Expand only: a nullable column without a default (no rewrite). Code of revision 0002 runs on this schema
unchanged: it never reads or writes the column.

Revision ID: 0018
Revises: 0017
Create Date: 2027-03-13
"""

from alembic import op

from app.migrations import lock_tables

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

# The oldest code revision that runs on this schema (expand only: 0017's floor).
compatible_from = "0002"

SCHEMA = "jobq"


def upgrade() -> None:
    lock_tables("queues")
    op.execute(f"ALTER TABLE {SCHEMA}.queues ADD COLUMN IF NOT EXISTS sqs_tags jsonb")


def downgrade() -> None:
    lock_tables("queues")
    op.execute(f"ALTER TABLE {SCHEMA}.queues DROP COLUMN IF EXISTS sqs_tags")
