"""app/db/functions.sql says what the migrations leave: every SQL function and trigger of jobq's schema at the
head revision, each as the database defines it, and no other.

One database is migrated to head (the tests' template); another, a copy of it with every function and
trigger of jobq's schema dropped, runs functions.sql, which also shows its order creates them. Their
definitions (pg_get_functiondef, pg_get_triggerdef) must be the same."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest

from app.db import migrations

pytestmark = pytest.mark.anyio

FUNCTIONS_SQL = Path(__file__).resolve().parents[2] / "app" / "db" / "functions.sql"

FUNCTIONS = """
    SELECT p.oid::regprocedure::text AS name, pg_get_functiondef(p.oid) AS definition
    FROM pg_proc p WHERE p.pronamespace = 'jobq'::regnamespace
"""
TRIGGERS = """
    SELECT t.tgrelid::regclass::text AS relation, quote_ident(t.tgname) AS trigger,
           pg_get_triggerdef(t.oid) AS definition
    FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
    WHERE c.relnamespace = 'jobq'::regnamespace AND NOT t.tgisinternal
"""


async def definitions(conn: asyncpg.Connection) -> dict[str, str]:
    """Each function by its signature, each trigger by its table and name: its definition."""
    functions = {row["name"]: row["definition"] for row in await conn.fetch(FUNCTIONS)}
    triggers = {
        f"{row['trigger']} ON {row['relation']}": row["definition"] for row in await conn.fetch(TRIGGERS)
    }
    return functions | triggers


async def from_functions_sql(dsn: str) -> dict[str, str]:
    """The definitions in a database whose functions and triggers are functions.sql's alone."""
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            for row in await conn.fetch(TRIGGERS):
                await conn.execute(f"DROP TRIGGER {row['trigger']} ON {row['relation']}")
            for row in await conn.fetch(FUNCTIONS):
                await conn.execute(f"DROP FUNCTION {row['name']}")
            assert await definitions(conn) == {}
            await conn.execute(FUNCTIONS_SQL.read_text())
        return await definitions(conn)
    finally:
        await conn.close()


@pytest.fixture
def another_database(fresh_database) -> str:
    return fresh_database()


async def test_functions_sql_is_what_the_migrations_leave(db, another_database):
    assert await db.fetchval("SELECT version_num FROM jobq.alembic_version") == migrations.head_revision()
    migrated = await definitions(db)
    assert (
        "jobq.enqueue(text,jsonb,integer,timestamp with time zone,integer,text,text,text,text,text,"
        "bigint[],text)" in migrated
    )
    written = await from_functions_sql(another_database)
    assert sorted(written) == sorted(migrated), "a function or trigger is in one and not the other"
    for name, definition in migrated.items():
        assert written[name] == definition, f"{name}: app/db/functions.sql and the migrations differ"
