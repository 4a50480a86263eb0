"""Alembic environment: runs the chain on asyncpg, one process at a time, beside a live service.

The database comes from the `sqlalchemy.url` main option when the caller set one (``app.db.migrations``
does), else from JOBQ_DATABASE_URL / DATABASE_URL, so plain ``alembic upgrade head`` works too.

How a run goes (the rules for writing revisions are in app/db/migrations.py):

1. Take the advisory lock: two replicas starting at once must not both run the chain; the second
   waits here (with no lock_timeout: waiting for another migrator stalls no one), then finds the
   schema at head and does nothing.
2. Refuse a database at a revision this build does not know (a newer release migrated it) with
   ``SchemaAhead``: upgrading is then nothing to do, and Alembic would only fail to locate it.
3. Set ``lock_timeout`` (JOBQ_MIGRATION_LOCK_TIMEOUT) for every statement that follows, and run each
   revision in its own transaction (``transaction_per_migration``), recording the applied head's
   ``compatible_from`` in the same transaction (``record_floor``).
4. A step whose lock did not come in time (or that lost a deadlock) is rolled back, so only it is
   retried, after a backoff (0.5 s doubling, at most 15 s, plus up to 30 % jitter), up to
   JOBQ_MIGRATION_ATTEMPTS attempts; then ``MigrationBlocked`` names the sessions in the way.
"""

import asyncio
import itertools
import logging
import random
import time

from alembic import context
from alembic.script.revision import ResolutionError
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import create_async_engine

from app.db import migrations
from app.db.tables import SCHEMA, metadata
from app.settings import Settings, sqlalchemy_url

config = context.config
log = logging.getLogger("jobq.migrations")

MIGRATION_LOCK = "SELECT pg_advisory_lock(hashtext('jobq.migrations'))"

# SQLSTATEs after which a step is rolled back and tried again: nothing it did is kept.
RETRYABLE = {"55P03": "its locks did not come within lock_timeout", "40P01": "it lost a deadlock"}


def database_url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if url:
        return url
    dsn = Settings().database_url
    if not dsn:
        raise SystemExit(
            "set JOBQ_DATABASE_URL (or DATABASE_URL), or run `jobq migrate` for the embedded server"
        )
    return sqlalchemy_url(dsn)


def run(connection) -> None:
    settings = config.attributes.get("settings") or Settings()
    script = context.script
    connection.execute(text(MIGRATION_LOCK))
    connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
    lock_timeout = f"{round(settings.migration_lock_timeout * 1000)}ms"
    connection.execute(text("SELECT set_config('lock_timeout', :value, false)"), {"value": lock_timeout})
    connection.commit()
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table_schema=SCHEMA,
        include_schemas=True,
        include_name=lambda name, type_, parent: type_ != "schema" or name == SCHEMA,
        transaction_per_migration=True,
        # Called in each step's transaction, once its revision is written.
        on_version_apply=[lambda ctx, heads, **_: migrations.record_floor(ctx.connection, script, heads)],
    )
    heads = current_heads()
    for head in heads:
        try:
            script.revision_map.get_revision(head)
        except ResolutionError:
            raise migrations.SchemaAhead(head, script.get_current_head()) from None
    for attempt in itertools.count(1):
        try:
            context.run_migrations()
            break
        except DBAPIError as error:
            reason = RETRYABLE.get(getattr(error.orig, "sqlstate", None))
            if reason is None:
                raise
            if connection.in_transaction():
                connection.rollback()
            at = ", ".join(current_heads()) or "base"
            blockers = migrations.describe_blockers(connection.execute(text(migrations.BLOCKERS)).all())
            connection.commit()
            if attempt >= settings.migration_attempts:
                raise migrations.MigrationBlocked(
                    f"the migration step after {at} could not run: {reason} "
                    f"({settings.migration_lock_timeout:g} s) in each of {attempt} attempts, so the "
                    f"schema stays at {at}. The locks it needs are {blockers}. End that transaction (or "
                    "SELECT pg_terminate_backend(<pid>)) and run `jobq migrate` again."
                ) from None
            delay = min(0.5 * 2 ** (attempt - 1), 15.0) * (1 + 0.3 * random.random())
            log.warning(
                "migration step after %s: %s (attempt %d of %d); locks %s; retrying in %.1f s",
                *(at, reason, attempt, settings.migration_attempts, blockers, delay),
            )
            time.sleep(delay)
    # A schema migrated before floors were recorded gets its floor now (nothing else changes).
    heads = current_heads()
    if heads and migrations.floor_comment(script, heads) != recorded_floor():
        migrations.record_floor(connection, script, heads)
    connection.commit()


def current_heads() -> tuple[str, ...]:
    connection = context.get_context().connection
    heads = context.get_context().get_current_heads()
    connection.commit()
    return heads


def recorded_floor() -> str | None:
    query = text(f"SELECT obj_description('{SCHEMA}.alembic_version'::regclass, 'pg_class')")
    return context.get_context().connection.execute(query).scalar()


async def main() -> None:
    # Named, so that pg_stat_activity (and a blocked service's operator) can tell the migration apart.
    engine = create_async_engine(
        database_url(), connect_args={"server_settings": {"application_name": "jobq migrate"}}
    )
    try:
        async with engine.connect() as connection:
            await connection.run_sync(run)
    finally:
        await engine.dispose()


if context.is_offline_mode():
    raise SystemExit("jobq migrations run online only")
asyncio.run(main())
