"""queues.fair_last_key: the key a `fair` queue's last claim served, so that the next claim, on any
replica, begins its turn with the key after it (app/db/sql/claim.py, FLOW_KEYS and LEASE_FLOW)

Kept per replica, the turn started again with the same keys on every replica, and a claim of one job
from two keys always served the first: one key's backlog held the other's jobs back whatever its place.

Expand only: a nullable column without a default (no rewrite). Code of revision 0014 runs on this schema
unchanged: it never reads or writes it.

Revision ID: 0022
Revises: 0021
Create Date: 2027-04-16
"""

from alembic import op

from app.db.migrations import lock_tables

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

# The oldest code revision that runs on this schema (expand only: 0021's floor).
compatible_from = "0014"

SCHEMA = "jobq"


def upgrade() -> None:
    lock_tables("queues")
    op.execute(f"ALTER TABLE {SCHEMA}.queues ADD COLUMN IF NOT EXISTS fair_last_key text")


def downgrade() -> None:
    lock_tables("queues")
    op.execute(f"ALTER TABLE {SCHEMA}.queues DROP COLUMN IF EXISTS fair_last_key")
