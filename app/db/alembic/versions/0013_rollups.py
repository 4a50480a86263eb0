"""Rollups: per queue and minute, jobs enqueued, completed, failed and dead, and the longest lag seen,
for the dashboard's charts

Expand only: a new table that nothing else references. Each replica adds what it counted every metrics
interval (one statement per replica, not one per job). Code of revision 0002 runs on this schema
unchanged.

Revision ID: 0013
Revises: 0012
Create Date: 2027-02-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

# The oldest code revision that runs on this schema (expand only: 0012's floor).
compatible_from = "0002"

SCHEMA = "jobq"


def upgrade() -> None:
    op.create_table(
        "rollups",
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("minute", sa.DateTime(timezone=True), nullable=False),
        sa.Column("enqueued", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("completed", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("failed", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("dead", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("lag", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("queue", "minute", name="pk_rollups"),
        schema=SCHEMA,
    )
    op.create_index("ix_rollups_minute", "rollups", ["minute"], schema=SCHEMA)


def downgrade() -> None:
    op.drop_index("ix_rollups_minute", table_name="rollups", schema=SCHEMA)
    op.drop_table("rollups", schema=SCHEMA)
