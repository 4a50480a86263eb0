"""Alembic environment: runs the chain on asyncpg, one process at a time.

The database comes from the `sqlalchemy.url` main option when the caller set one (``app.migrations``
does), else from JOBQ_DATABASE_URL / DATABASE_URL, so plain ``alembic upgrade head`` works too.
"""

import asyncio

from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from alembic import context
from app.models import SCHEMA, metadata
from app.settings import Settings, sqlalchemy_url

config = context.config

# Two replicas starting at once must not both run the chain: the second waits here, then finds the
# schema at head and does nothing.
MIGRATION_LOCK = "SELECT pg_advisory_lock(hashtext('jobq.migrations'))"


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
    connection.execute(text(MIGRATION_LOCK))
    connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
    connection.commit()
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table_schema=SCHEMA,
        include_schemas=True,
        include_name=lambda name, type_, parent: type_ != "schema" or name == SCHEMA,
    )
    with context.begin_transaction():
        context.run_migrations()


async def main() -> None:
    engine = create_async_engine(database_url())
    try:
        async with engine.connect() as connection:
            await connection.run_sync(run)
    finally:
        await engine.dispose()


if context.is_offline_mode():
    raise SystemExit("jobq migrations run online only")
asyncio.run(main())
