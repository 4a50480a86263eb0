"""SQS FIFO queues: a table of receive attempts (ReceiveRequestAttemptId), so a retried receive gets the
same messages back, on any replica

Expand only: a new table that nothing else references. FIFO queues' other state lives where jobq keeps it
already: their attributes in `queues.sqs_attributes`, their ordering in the queue's `key_concurrency`, their
deduplication ids in `idempotency_keys`. Code of revision 0002 runs on this schema unchanged.

Revision ID: 0010
Revises: 0009
Create Date: 2027-01-23
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

# The oldest code revision that runs on this schema (expand only: 0009's floor).
compatible_from = "0002"

SCHEMA = "jobq"


def upgrade() -> None:
    op.create_table(
        "sqs_receive_attempts",
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("attempt_id", sa.Text(), nullable=False),
        sa.Column("ids", postgresql.ARRAY(sa.BigInteger()), nullable=False),
        sa.Column("lease_tokens", postgresql.ARRAY(postgresql.UUID(as_uuid=True)), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("queue", "attempt_id", name="pk_sqs_receive_attempts"),
        schema=SCHEMA,
    )
    op.create_index(
        "ix_sqs_receive_attempts_expires_at", "sqs_receive_attempts", ["expires_at"], schema=SCHEMA
    )


def downgrade() -> None:
    op.drop_index("ix_sqs_receive_attempts_expires_at", table_name="sqs_receive_attempts", schema=SCHEMA)
    op.drop_table("sqs_receive_attempts", schema=SCHEMA)
