"""Workers seen: which worker_id leased from which queue, and when last, kept by every replica for the
dashboard's workers page and GET /workers

Expand only: a new table that nothing else references. Each replica writes what it saw every few seconds
(one statement per replica, not one per lease). Code of revision 0002 runs on this schema unchanged.

Revision ID: 0012
Revises: 0011
Create Date: 2027-02-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

# The oldest code revision that runs on this schema (expand only: 0011's floor).
compatible_from = "0002"

SCHEMA = "jobq"


def upgrade() -> None:
    op.create_table(
        "workers",
        sa.Column("worker_id", sa.Text(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("leased", sa.BigInteger(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("worker_id", "queue", name="pk_workers"),
        schema=SCHEMA,
    )
    op.create_index("ix_workers_last_seen", "workers", ["last_seen"], schema=SCHEMA)


def downgrade() -> None:
    op.drop_index("ix_workers_last_seen", table_name="workers", schema=SCHEMA)
    op.drop_table("workers", schema=SCHEMA)
