"""Which errors a real PostgreSQL raises the coalescing Batcher (app/service/coalesce.py) takes for an item's
own refusal (answered to its caller alone), and which may follow a commit (never retried item by item)."""

from __future__ import annotations

import asyncpg
import pytest

from app.core.errors import Invalid, Unavailable
from app.service.coalesce import refused

pytestmark = pytest.mark.anyio


@pytest.fixture
async def pg(database_url: str):
    conn = await asyncpg.connect(database_url)
    yield conn
    if not conn.is_closed():
        await conn.close()


async def error_of(conn: asyncpg.Connection, sql: str, *args: object) -> BaseException:
    try:
        await conn.execute(sql, *args)
    except Exception as exc:
        return exc
    raise AssertionError(f"{sql} did not fail")


async def test_errors_caused_by_an_item_are_refusals(pg):
    await pg.execute("CREATE TEMP TABLE t (k int PRIMARY KEY, v text)")
    await pg.execute("INSERT INTO t VALUES (1, 'x')")
    assert refused(await error_of(pg, "INSERT INTO t VALUES (1, 'y')"))  # unique violation
    assert refused(await error_of(pg, "INSERT INTO t VALUES (2, $1)", "nul \x00 byte"))
    assert refused(await error_of(pg, "SELECT $1::int", "not a number"))
    assert refused(Invalid("refused by the service before sending"))
    try:
        "\udce9".encode()
    except UnicodeEncodeError as exc:
        assert refused(exc)


async def test_errors_that_may_follow_a_commit_are_not(pg, database_url):
    await pg.execute("SET statement_timeout = '10ms'")
    assert not refused(await error_of(pg, "SELECT pg_sleep(1)"))  # 57014, cancelled mid-flight
    await pg.execute("RESET statement_timeout")
    other = await asyncpg.connect(database_url)
    await other.execute("SELECT pg_terminate_backend($1)", pg.get_server_pid())
    await other.close()
    assert not refused(await error_of(pg, "SELECT 1"))  # FATAL 57P01, or the connection gone
    assert not refused(Unavailable("the database is unreachable"))
    assert not refused(ConnectionResetError())
