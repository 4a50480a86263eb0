"""What the SQS API keeps of a queue beyond its attributes: its tags (`queues.sqs_tags`), its last purge
(`queues.sqs_purged_at`: one PurgeQueue a minute), the names of queues deleted in the last minute
(`sqs_deleted_queues`: a name is not created again within 60 s of its deletion), as SQS keeps them, and
the messages moved into a dead-letter queue with the queue each came from (`sqs_dead_letters`)

Expand only: nullable columns without a default (no rewrite) and new tables. Code of revision 0002 runs
on this schema unchanged: it never reads or writes them.

Revision ID: 0018
Revises: 0017
Create Date: 2027-03-13
"""

from alembic import op

from app.db.migrations import lock_tables

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

# The oldest code revision that runs on this schema (expand only: 0017's floor).
compatible_from = "0002"

SCHEMA = "jobq"


def upgrade() -> None:
    lock_tables("queues")
    op.execute(
        f"ALTER TABLE {SCHEMA}.queues ADD COLUMN IF NOT EXISTS sqs_tags jsonb,"
        " ADD COLUMN IF NOT EXISTS sqs_purged_at timestamptz"
    )
    op.execute(
        f"CREATE TABLE IF NOT EXISTS {SCHEMA}.sqs_deleted_queues"
        " (name text PRIMARY KEY, deleted_at timestamptz NOT NULL DEFAULT now())"
    )
    op.execute(
        f"CREATE TABLE IF NOT EXISTS {SCHEMA}.sqs_dead_letters"
        " (job_id bigint PRIMARY KEY, source text NOT NULL)"
    )


def downgrade() -> None:
    lock_tables("queues")
    op.execute(f"DROP TABLE IF EXISTS {SCHEMA}.sqs_deleted_queues, {SCHEMA}.sqs_dead_letters")
    op.execute(
        f"ALTER TABLE {SCHEMA}.queues DROP COLUMN IF EXISTS sqs_tags, DROP COLUMN IF EXISTS sqs_purged_at"
    )
