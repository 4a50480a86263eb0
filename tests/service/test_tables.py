"""The schema: one definition (models == migrations), clean up and down, the claim on its index."""

import asyncio
import json
from pathlib import Path

import asyncpg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from app.db import migrations, sql
from app.db.tables import JobHistory, metadata

ROOT = Path(__file__).resolve().parents[2]


def test_the_sql_names_every_column_of_a_job():
    """The columns the statements that finish jobs copy into jobq.jobs_history, written out in
    app/db/sql/fragments.py, are the table's (but purge_after, which they compute)."""
    columns = tuple(c.name for c in JobHistory.__table__.columns if c.name != "purge_after")
    assert sql.fragments.JOB_COLUMNS == columns


async def _fetch(dsn: str, sql: str, *args):
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetch(sql, *args)
    finally:
        await conn.close()


def test_migrations_match_models(fresh_database):
    """Alembic finds nothing to autogenerate: the migrations build exactly what the models say."""
    dsn = fresh_database()

    from sqlalchemy.ext.asyncio import create_async_engine

    from app.settings import sqlalchemy_url

    def compare(connection):
        context = MigrationContext.configure(
            connection,
            opts={
                "include_schemas": True,
                # jobs_history's partitions are the service's (app/service/history.py), not the models'.
                "include_name": lambda name, type_, parent: (
                    name == "jobq" if type_ == "schema" else not (name or "").startswith("jobs_history_")
                ),
                "version_table_schema": "jobq",
            },
        )
        return compare_metadata(context, metadata)

    async def run():
        engine = create_async_engine(sqlalchemy_url(dsn))
        try:
            async with engine.connect() as connection:
                return await connection.run_sync(compare)
        finally:
            await engine.dispose()

    diff = asyncio.run(run())
    assert diff == [], f"models and migrations disagree: {diff}"


def test_migrations_go_down_and_up(fresh_database):
    dsn = fresh_database()
    migrations.downgrade(dsn, "base")
    tables = asyncio.run(_fetch(dsn, "SELECT tablename FROM pg_tables WHERE schemaname = 'jobq'"))
    assert [t["tablename"] for t in tables] == ["alembic_version"]
    functions = asyncio.run(_fetch(dsn, "SELECT proname FROM pg_proc WHERE proname = 'enqueue'"))
    assert functions == []
    migrations.upgrade(dsn)
    tables = asyncio.run(_fetch(dsn, "SELECT tablename FROM pg_tables WHERE schemaname = 'jobq' ORDER BY 1"))
    assert [t["tablename"] for t in tables] == [
        "alembic_version", "events", "idempotency_keys", "job_edges", "job_journal", "job_waits", "jobs",
        "jobs_history",
        "jobs_history_default", "keys",
        "leaders", "push_holds", "queues", "rollups",
        "schedules", "sqs_dead_letters", "sqs_deleted_queues", "sqs_receive_attempts", "workers",
        "workflows",
    ]  # fmt: skip
    version = asyncio.run(_fetch(dsn, "SELECT version_num FROM jobq.alembic_version"))
    assert version[0]["version_num"] == migrations.head_revision()


def test_jobs_table_is_tuned_for_churn(fresh_database):
    dsn = fresh_database()
    (row,) = asyncio.run(_fetch(dsn, "SELECT reloptions FROM pg_class WHERE oid = 'jobq.jobs'::regclass"))
    options = dict(o.split("=") for o in row["reloptions"])
    assert options["fillfactor"] == "70"
    assert float(options["autovacuum_vacuum_scale_factor"]) <= 0.05


@pytest.mark.anyio
async def test_claim_uses_the_partial_index(db):
    """With many finished rows and few pending ones, the claim reads the small partial index."""
    await db.execute("INSERT INTO jobq.queues (name) VALUES ('q')")
    await db.execute(
        """INSERT INTO jobq.jobs (queue, payload, status, completed_at)
           SELECT 'q', '{}', 'completed', now() FROM generate_series(1, 20000)"""
    )
    await db.execute("INSERT INTO jobq.jobs (queue, payload) SELECT 'q', '{}' FROM generate_series(1, 50)")
    await db.execute("ANALYZE jobq.jobs")
    plan = await db.fetchval(
        "EXPLAIN (FORMAT JSON) " + sql.LEASE.text,
        *sql.LEASE.args(queue="q", visibility_timeouts=[None] * 10, worker_ids=[None] * 10),
    )
    plan_text = json.dumps(plan)
    assert "ix_jobs_claim" in plan_text, plan_text
    assert '"Seq Scan"' not in plan_text.replace('"Relation Name": "queues"', ""), plan_text
    size = await db.fetchval("SELECT pg_relation_size('jobq.ix_jobs_claim')")
    assert size < 64 * 1024  # kilobytes, whatever the number of finished jobs


@pytest.mark.anyio
async def test_dedup_index_is_partial_and_unique(db):
    await db.execute("SELECT jobq.enqueue('q', '1', dedup_key => 'k')")
    with pytest.raises(asyncpg.UniqueViolationError):
        await db.execute("INSERT INTO jobq.jobs (queue, payload, dedup_key) VALUES ('q', '2', 'k')")
    await db.execute("UPDATE jobq.jobs SET status = 'completed'")
    await db.execute("INSERT INTO jobq.jobs (queue, payload, dedup_key) VALUES ('q', '3', 'k')")
