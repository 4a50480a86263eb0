"""jobs_history's primary key names the queue, (queue, id, purge_after), as a table distributed by queue
needs (README: Scaling out), with a plain index on id for lookups by id; the schedule-slot index without
the queue goes

Nothing is built under a lock, and the table keeps as many indexes as before:
- ix_jobs_history_id (id) and each partition's unique (queue, id, purge_after) are built CONCURRENTLY,
  partition by partition; then, under the step's lock, the key (id, purge_after) is dropped, each
  partition's new index becomes its key, and the parent's new key takes those over (PostgreSQL attaches
  a partition's matching key instead of building one). ix_jobs_history_queue_id (queue, id) goes: the
  new key serves the same reads. The service makes and drops partitions under an advisory lock
  (app/service/history.py), which the migration holds meanwhile.
- uq_jobs_schedule_slot (schedule, slot), beside uq_jobs_queue_schedule_slot (queue, schedule, slot)
  since 0014, is dropped: a contract. Code before 0014 names it as its insert's arbiter, so the floor
  rises to 0014.

jobs keeps its primary key on id: the claims' plans rely on a unique index on id (app/db/sql/claim.py, LEASE).

Revision ID: 0019
Revises: 0018
Create Date: 2027-03-20
"""

from alembic import op
from sqlalchemy import text

from app.db.migrations import build_index, build_partitioned_index, lock_tables

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

# The oldest code revision that runs on this schema: 0014, the first that does not name
# uq_jobs_schedule_slot.
compatible_from = "0014"

SCHEMA = "jobq"

# The service's lock on making and dropping jobs_history's partitions, held here for the session. A step
# retried after a lock timeout takes it again (session locks count), so it is let go of as often as held.
HOLD_PARTITIONS = "SELECT pg_advisory_lock(hashtext('jobq.history'))"
RELEASE_PARTITIONS = """
DO $$ BEGIN
    PERFORM set_config('client_min_messages', 'error', true);  -- the last unlock finds it free: no warning
    WHILE pg_advisory_unlock(hashtext('jobq.history')) LOOP END LOOP;
END $$
"""

PARTITIONS = f"""
SELECT c.relname FROM pg_inherits p JOIN pg_class c ON c.oid = p.inhrelid
WHERE p.inhparent = '{SCHEMA}.jobs_history'::regclass ORDER BY c.relname
"""

# jobs_history's key made of `columns` instead: each partition's `<partition>_<suffix>` (a unique index
# built for it) becomes the partition's key, then the parent's key takes those over. Runs once: `gone`
# names the index it drops last, so a step run again after it committed changes nothing.
SWAP_KEY = """
DO $$
DECLARE part record;
BEGIN
    IF to_regclass('{schema}.{gone}') IS NOT NULL THEN
        ALTER TABLE {schema}.jobs_history DROP CONSTRAINT pk_jobs_history;
        FOR part IN {partitions} LOOP
            EXECUTE format('ALTER TABLE {schema}.%I ADD CONSTRAINT %I PRIMARY KEY USING INDEX %I',
                           part.relname, part.relname || '_{suffix}', part.relname || '_{suffix}');
        END LOOP;
        ALTER TABLE {schema}.jobs_history ADD CONSTRAINT pk_jobs_history PRIMARY KEY ({columns});
        DROP INDEX {schema}.{gone};
    END IF;
END $$
"""


def _swap_key(columns: str, suffix: str, index: str, index_columns: str, gone: str) -> None:
    """Build `index` (on `index_columns`) and each partition's key to be, `<partition>_<suffix>` on
    `columns`, without blocking writes; then make the key of them and drop `gone`, under a short lock."""
    with op.get_context().autocommit_block():
        op.execute(HOLD_PARTITIONS)
        build_partitioned_index("jobs_history", index, f"({index_columns})")
        for (partition,) in op.get_bind().execute(text(PARTITIONS)).all():
            build_index(f"{partition}_{suffix}", f"({columns})", unique=True, table=partition)
    lock_tables("jobs_history")
    op.execute(
        SWAP_KEY.format(schema=SCHEMA, gone=gone, partitions=PARTITIONS, suffix=suffix, columns=columns)
    )
    with op.get_context().autocommit_block():
        op.execute(RELEASE_PARTITIONS)


def upgrade() -> None:
    _swap_key(
        "queue, id, purge_after", "queue_id_key", "ix_jobs_history_id", "id", "ix_jobs_history_queue_id"
    )
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {SCHEMA}.uq_jobs_schedule_slot")


def downgrade() -> None:
    with op.get_context().autocommit_block():
        build_index(
            "uq_jobs_schedule_slot", "(schedule, schedule_slot) WHERE schedule_slot IS NOT NULL", unique=True
        )
    _swap_key("id, purge_after", "id_key", "ix_jobs_history_queue_id", "queue, id", "ix_jobs_history_id")
