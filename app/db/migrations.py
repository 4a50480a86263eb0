"""Running the Alembic chain from code (`jobq migrate`, service start-up, tests), and the rules every
revision follows, because migrations run while the service serves: a rolling upgrade has old and new
replicas on one schema, and every replica migrates on start (JOBQ_MIGRATE_ON_START).

Expand, then contract. Each release's revisions must leave a schema that the code of the previous
release still runs on, so old and new replicas serve side by side and a rollback of the code needs no
rollback of the schema:

- Expand (any release): add nullable columns or columns with a constant default (no rewrite), new
  tables, new functions, new indexes built ``CONCURRENTLY`` outside the step's transaction
  (``with op.get_context().autocommit_block():``, with ``IF NOT EXISTS``, since a retried step runs
  it again; drop an INVALID leftover of a failed build first). Backfill large tables in batches from
  code, not in a migration that holds locks.
- Contract (a later release, once no running code uses the thing): drop or rename columns and tables,
  add NOT NULL or other constraints old code could violate. A rename is an expand (new name, both
  written) and later a contract (old name dropped).

``compatible_from``: each revision module declares, at top level, the oldest code head revision that
runs correctly on the schema once this revision is applied. An expand-only revision need not raise
it (it keeps its predecessor's value, or at most names the predecessor itself); a contract raises it
past every revision whose code used what the contract removes. Each migration step records the
applied head's value in the database (a comment on jobq.alembic_version, see ``record_floor``), so
that an older build, which does not know the newer revisions, can still tell whether it may serve
(``compatibility``, ``/readyz``).

Locks. A step runs in its own transaction with a short ``lock_timeout``
(JOBQ_MIGRATION_LOCK_TIMEOUT): statements of the service queue behind a migration's waiting lock
request, so the timeout bounds how long traffic can stall behind it. A step that timed out (or lost a
deadlock) is rolled back and retried with backoff, up to JOBQ_MIGRATION_ATTEMPTS times; then the run
stops with ``MigrationBlocked``, naming the session in the way. A step that changes existing tables
calls ``lock_tables(...)`` first, which locks them in ``LOCK_ORDER``, the service's order (see there).

Functions. app/db/functions.sql holds every PL/pgSQL function's current body. A revision that changes one
changes it there first and copies the new body into its ``CREATE OR REPLACE FUNCTION``; a test holds the
migration head to the file (tests/service/test_functions_sql.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import asyncpg

from app.db.sql.gauges import SCHEMA_REVISION
from app.settings import Settings, sqlalchemy_url

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

# Alembic and SQLAlchemy are loaded only to run a migration (a third of the CPU a service takes to
# start): a service whose schema is at this build's head (`at_head`) and /readyz need neither.

# The Alembic chain ships inside the package, so that an installed wheel migrates without a checkout; the
# configuration is built here, in code (the checkout's alembic.ini only serves a plain `alembic` run).
SCRIPTS = Path(__file__).resolve().parent / "alembic"
SCHEMA = "jobq"

log = logging.getLogger("jobq.migrations")

# The order a migration step locks jobq's tables in. Rows: enqueue writes a row of `queues` (creating the
# queue) and then rows of `jobs`; every other statement locks rows of `jobs` only and merely reads
# `queues`. So queues, then jobs; the 0002 migration, which altered jobs and then queues, deadlocked with
# enqueues. Table locks, which a statement takes before it runs, in the order its plan lists the tables,
# do not all agree: enqueue takes `queues` first, but a prepared lease, nack or lease expiry takes `jobs`
# first (seen in pg_locks). No order of ACCESS EXCLUSIVE locks on both tables avoids every cycle, so
# `lock_tables` takes them in this order and bounds its waiting, so that the step gives way, never a
# statement of the service (see there). jobs_history comes after jobs: a statement that finishes jobs
# deletes them from jobs, then inserts them there.
LOCK_ORDER = ("queues", "jobs", "jobs_history")

# The lock waits in force (both in ms; lock_timeout 0 is "for ever").
LOCK_TIMEOUTS = """
    SELECT (SELECT setting::int FROM pg_settings WHERE name = 'lock_timeout') AS lock_timeout,
           (SELECT setting::int FROM pg_settings WHERE name = 'deadlock_timeout') AS deadlock_timeout
"""


class SchemaAhead(Exception):
    """The database is at a revision this build does not know: a newer release migrated it."""

    def __init__(self, revision: str, head: str) -> None:
        self.revision, self.head = revision, head
        super().__init__(
            f"the schema is at {revision}, a revision this build (at {head}) does not know: a newer "
            "release migrated it, and there is nothing for this build to upgrade. GET /readyz tells "
            "whether this build can serve on it."
        )


class MigrationBlocked(Exception):
    """A step could not take its locks in any of its attempts (or lost every one to a deadlock); it was
    rolled back, so the schema is at the last step that completed. The message names the sessions
    holding locks on jobq's tables, oldest transaction first."""


def alembic_config(dsn: str, settings: Settings | None = None) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(SCRIPTS))
    # How a caller's version_locations (several directories) are split, as in alembic.ini.
    config.set_main_option("path_separator", "os")
    # ConfigParser treats % as interpolation; a password may contain one.
    config.set_main_option("sqlalchemy.url", sqlalchemy_url(dsn).replace("%", "%%"))
    if settings is not None:
        # app/db/alembic/env.py takes the lock timeout and attempts from here (else from the environment).
        config.attributes["settings"] = settings
    return config


def upgrade(dsn: str, revision: str = "head", *, settings: Settings | None = None) -> None:
    """Bring the schema to `revision`. Blocking: call it from a thread when an event loop is running.

    Raises SchemaAhead when the database is at a revision this build does not know, and
    MigrationBlocked when a step could not take its locks (see the module's docstring)."""
    from alembic import command

    command.upgrade(alembic_config(dsn, settings), revision)


def downgrade(dsn: str, revision: str = "base", *, settings: Settings | None = None) -> None:
    from alembic import command

    command.downgrade(alembic_config(dsn, settings), revision)


# The chain is a line: each revision's id is its file's four-digit number, and its down_revision the
# number before (tests/system/test_migrations.py holds Alembic's reading of the chain to this one).
@cache
def _lineage() -> frozenset[str]:
    """This build's head and every revision before it."""
    return frozenset(path.name[:4] for path in (SCRIPTS / "versions").glob("[0-9][0-9][0-9][0-9]_*.py"))


@cache
def head_revision() -> str:
    return max(_lineage())


async def at_head(dsn: str) -> bool:
    """Whether the schema is at this build's head with the head's floor recorded: an upgrade would change
    nothing (a rolling restart, or any start after the first), and start-up skips it."""
    conn = await asyncpg.connect(dsn, server_settings={"application_name": "jobq migrate"})
    try:
        if await conn.fetchval(f"SELECT to_regclass('{SCHEMA}.alembic_version')") is None:
            return False
        row = await conn.fetchrow(SCHEMA_REVISION.text)
    finally:
        await conn.close()
    return row["revision"] == head_revision() and _floor(row["revision"], row["floor"]) is not None


# --- locks -----------------------------------------------------------------------------------------


def lock_order(tables: Iterable[str]) -> list[str]:
    """`tables` in LOCK_ORDER. A table it does not place is an error: add it where the service's
    statements take it."""
    tables = set(tables)
    unplaced = sorted(tables - set(LOCK_ORDER))
    if unplaced:
        raise ValueError(f"no place in LOCK_ORDER for {unplaced}: add each where the service takes it")
    return sorted(tables, key=LOCK_ORDER.index)


def lock_tables(*tables: str) -> None:
    """Lock jobq's `tables` ACCESS EXCLUSIVE, in LOCK_ORDER: the first statement of a revision's
    upgrade() and downgrade() that change existing tables (`lock_tables("jobs", "queues")`). The locks
    last until the step commits, so its own statements then wait for nothing the service holds.

    One table is waited for up to the run's lock_timeout: holding nothing else, the step can be in no
    deadlock. With several, the step holds the first while it waits for the next, which a statement of
    the service queued behind it may hold (LOCK_ORDER): a cycle. PostgreSQL breaks a cycle by cancelling
    the session that looks for one first, deadlock_timeout (1 s by default) after it began to wait, and
    every session that waits for the step began to wait after the step asked for its first lock. So the
    step waits for all its locks together at most 80 % of deadlock_timeout (and at most lock_timeout),
    in one statement: it gives up, to be retried, before any such session looks, and the service's
    statement is never the one cancelled."""
    from alembic import op
    from sqlalchemy import text

    bind = op.get_bind()
    lock_ms, deadlock_ms = bind.execute(text(LOCK_TIMEOUTS)).one()
    ordered = lock_order(tables)
    budget_ms = lock_ms
    if len(ordered) > 1:
        budget_ms = deadlock_ms * 4 // 5 if lock_ms == 0 else min(lock_ms, deadlock_ms * 4 // 5)
    steps = []
    for n, table in enumerate(ordered):
        if n:
            # What is left of the budget (at least 1 ms: 0 would mean "for ever").
            steps.append(
                "PERFORM set_config('lock_timeout', greatest(1, ceil(extract(epoch FROM deadline"
                " - clock_timestamp()) * 1000))::int || 'ms', true);"
            )
        steps.append(f"LOCK TABLE {SCHEMA}.{table} IN ACCESS EXCLUSIVE MODE;")
    # Values are this module's integers and table names from LOCK_ORDER (a DO block takes no parameters).
    bind.exec_driver_sql(
        f"""
        DO $lock$
        DECLARE
            deadline timestamptz := clock_timestamp() + make_interval(secs => {budget_ms} / 1000.0);
        BEGIN
            PERFORM set_config('lock_timeout', '{budget_ms}ms', true);
            {" ".join(steps)}
            PERFORM set_config('lock_timeout', '{lock_ms}ms', true);
        END
        $lock$
        """
    )


# The sessions holding locks on jobq's tables, oldest transaction first: who kept a step from its locks.
BLOCKERS = """
    SELECT a.pid, a.application_name, coalesce(host(a.client_addr), 'local socket') AS client,
           a.state || CASE WHEN a.wait_event_type = 'Lock' THEN ', waiting for a lock' ELSE '' END AS state,
           extract(epoch FROM clock_timestamp() - a.xact_start)::float8 AS transaction_seconds,
           left(regexp_replace(a.query, '\\s+', ' ', 'g'), 160) AS query,
           string_agg(DISTINCT c.relname || ' ' || l.mode, ', ') AS locks
    FROM pg_locks l
    JOIN pg_class c ON c.oid = l.relation
    JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.granted AND l.pid <> pg_backend_pid() AND c.relnamespace = 'jobq'::regnamespace
      AND c.relkind IN ('r', 'p')
    GROUP BY a.pid, a.application_name, a.client_addr, a.state, a.wait_event_type, a.xact_start, a.query
    ORDER BY a.xact_start NULLS LAST
    LIMIT 3
"""


# A CREATE INDEX CONCURRENTLY that failed leaves an INVALID index behind, which IF NOT EXISTS would take
# for done: dropped first.
_DROP_INVALID_INDEX = """
DO $$ BEGIN
    IF EXISTS (SELECT FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
               JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE n.nspname = '{schema}' AND c.relname = '{name}' AND NOT i.indisvalid) THEN
        DROP INDEX {schema}.{name};
    END IF;
END $$
"""


def revision_module(revision: str) -> ModuleType:
    """An earlier revision's module, as Alembic loaded it: a downgrade puts back the function bodies it
    defined rather than copying them again."""
    from alembic import op

    return op.get_context().script.get_revision(revision).module


def build_index(name: str, definition: str, *, unique: bool = False, table: str = "jobs") -> None:
    """Build an index on jobq.`table` without blocking writes (CREATE INDEX CONCURRENTLY `definition`, e.g.
    "(queue, id)"), again after a build that failed. Call it inside `op.get_context().autocommit_block()`:
    a concurrent build cannot run in a transaction."""
    from alembic import op

    op.execute(_DROP_INVALID_INDEX.format(schema=SCHEMA, name=name))
    kind = "UNIQUE INDEX" if unique else "INDEX"
    op.execute(f"CREATE {kind} CONCURRENTLY IF NOT EXISTS {name} ON {SCHEMA}.{table} {definition}")


# The partitions of {table} without an index attached to its partitioned index {name}.
_PARTITIONS_WITHOUT = """
SELECT c.relname FROM pg_inherits p JOIN pg_class c ON c.oid = p.inhrelid
WHERE p.inhparent = '{schema}.{table}'::regclass
  AND NOT EXISTS (SELECT FROM pg_inherits pi JOIN pg_index x ON x.indexrelid = pi.inhrelid
                  WHERE pi.inhparent = '{schema}.{name}'::regclass AND x.indrelid = c.oid)
ORDER BY c.relname
"""


def build_partitioned_index(table: str, name: str, definition: str, *, unique: bool = False) -> None:
    """Build index `name` on the partitioned table jobq.`table` without blocking writes: the parent's index
    alone first (`ON ONLY`, invalid until every partition has one attached), then each partition's
    CONCURRENTLY, attached as soon as it is built (`<partition>_<name>`); PostgreSQL marks the parent's
    valid once the last is attached, and builds a partition's own when a partition is attached later.
    Run again after a failed build, it goes on from where it stopped. Call it inside
    `op.get_context().autocommit_block()`, holding off whatever makes or drops partitions meanwhile."""
    from alembic import op
    from sqlalchemy import text

    bind = op.get_bind()
    kind = "UNIQUE INDEX" if unique else "INDEX"
    op.execute(f"CREATE {kind} IF NOT EXISTS {name} ON ONLY {SCHEMA}.{table} {definition}")
    missing = _PARTITIONS_WITHOUT.format(schema=SCHEMA, table=table, name=name)
    for (partition,) in bind.execute(text(missing)).all():
        own = f"{partition}_{name}"[:63]
        build_index(own, definition, unique=unique, table=partition)
        op.execute(f"ALTER INDEX {SCHEMA}.{name} ATTACH PARTITION {SCHEMA}.{own}")


def describe_blockers(rows: list) -> str:
    if not rows:
        return "no session holds locks on jobq's tables now"
    first = rows[0]
    held = (
        f"held by pid {first.pid} (application {first.application_name!r}, {first.client}, {first.state}"
        f", transaction open {first.transaction_seconds or 0:.1f} s, locks {first.locks}"
        f", last query: {first.query})"
    )
    if len(rows) > 1:
        held += f", and by pid{'s' if len(rows) > 2 else ''} {', '.join(str(r.pid) for r in rows[1:])}"
    return held


# --- compatibility ----------------------------------------------------------------------------------


def floor_comment(script: ScriptDirectory, heads: Iterable[str]) -> str | None:
    """What a migration records for the applied `heads`: JSON naming the head and its compatible_from,
    read back by `compatibility`; None at base."""
    heads = sorted(heads)
    if not heads:
        return None
    if len(heads) > 1:
        raise RuntimeError(f"jobq's chain has one head, not {heads}")
    rev = script.get_revision(heads[0])
    floor = getattr(rev.module, "compatible_from", None)
    if floor is None:
        raise RuntimeError(f"{rev.path} declares no compatible_from (see app/db/migrations.py)")
    return json.dumps({"revision": rev.revision, "compatible_from": floor})


def record_floor(connection, script: ScriptDirectory, heads: Iterable[str]) -> None:
    """Write the applied head's compatible_from where an older build can read it without knowing that
    revision: the comment of jobq.alembic_version (no table of its own, so the schema the models
    describe stays jobq's tables). Run in the step's transaction, so it changes with the revision."""
    comment = floor_comment(script, heads)
    literal = "NULL" if comment is None else "'" + comment.replace("'", "''") + "'"
    connection.exec_driver_sql(f"COMMENT ON TABLE {SCHEMA}.alembic_version IS {literal}")


@dataclass(frozen=True)
class Compatibility:
    ready: bool  # this build can serve on the schema as it is
    compatible_from: str | None  # the oldest code revision the schema runs, as it recorded
    detail: str  # why not ready, and what to do ("" when ready)


def _floor(revision: str | None, recorded: str | None) -> str | None:
    """The compatible_from that the migration to `revision` recorded (see record_floor), or None when the
    comment is missing, unreadable or written for another revision."""
    try:
        noted = json.loads(recorded or "null")
    except ValueError:
        return None
    if isinstance(noted, dict) and noted.get("revision") == revision:
        return noted.get("compatible_from")
    return None


def compatibility(revision: str | None, recorded: str | None) -> Compatibility:
    """Can this build serve on a schema at `revision` that recorded `recorded` (see record_floor)?

    At this build's head: yes. Behind it: no, run `jobq migrate`. Ahead of it, at a revision this build
    does not know: yes when the recorded floor is this build's head or before it, else no."""
    head = head_revision()
    floor = _floor(revision, recorded)
    if revision is None:
        return Compatibility(False, None, f"no schema yet (expected {head}): run `jobq migrate`")
    if revision == head:
        return Compatibility(True, floor, "")
    if revision in _lineage():
        return Compatibility(
            False, floor, f"schema at {revision} is behind this build's {head}: run `jobq migrate`"
        )
    if floor is None:
        return Compatibility(
            False,
            None,
            f"schema at {revision}, which this build (at {head}) does not know, records no compatible "
            f"code revision: run a release that knows {revision}",
        )
    if floor in _lineage():
        return Compatibility(True, floor, "")
    return Compatibility(
        False,
        floor,
        f"schema at {revision} runs code from {floor} on, and this build is at {head}: upgrade this "
        f"replica to a release at {floor} or later (or, to roll back, migrate the schema down with the "
        f"newer release's `jobq migrate --down <revision>`)",
    )
