"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}
"""

from alembic import op
import sqlalchemy as sa
from app.db.migrations import lock_tables
${imports if imports else ""}

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}

# The oldest code revision that runs on the schema once this revision is applied: an expand keeps the
# previous revision's value, a contract raises it (the rules: app/db/migrations.py).
compatible_from = "<the previous revision's compatible_from>"

# Changing (or adding) an SQL function or trigger? Change it in app/db/functions.sql first, where every
# function's current body is, and copy its body from there into this revision's CREATE OR REPLACE
# FUNCTION: tests/service/test_functions_sql.py fails while the head and that file disagree.


def upgrade() -> None:
    # Changing existing tables? Lock them first, in the service's order: lock_tables("jobs", "queues").
    ${upgrades if upgrades else "pass"}


def downgrade() -> None:
    ${downgrades if downgrades else "pass"}
