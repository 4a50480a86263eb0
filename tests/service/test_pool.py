"""The pool (app/db/pool.py): a connection that failed its block on connection trouble is closed, not
handed to the next request, and the error the block raised is the one that comes out."""

import pytest

from app.core.errors import CONNECTION_TROUBLE
from app.db.pool import Database, create_pool
from app.settings import Settings
from tests.waiting import until

pytestmark = pytest.mark.anyio


async def test_a_connection_lost_under_a_block_gives_its_own_error_and_the_pool_goes_on(database_url, db):
    # Straight to the server, even when the tests' services go through PgBouncer: the connection here must
    # be one backend, which the test terminates.
    settings = Settings(database_url=database_url, pool_min_size=1, pool_max_size=1)
    pool = await create_pool(database_url, settings)
    database = Database(pool, settings, session_url=settings.session_url(database_url))
    try:
        # Which error the lost connection gives depends on how far asyncpg got with the server's goodbye
        # (connection closed, or its protocol left mid-operation): any of the pool's connection trouble.
        with pytest.raises(CONNECTION_TROUBLE) as raised:
            async with database.acquire() as conn:
                pid = conn.get_server_pid()
                assert await db.fetchval("SELECT pg_terminate_backend($1)", pid)
                await until(
                    lambda: db.fetchval("SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $1", pid)
                )
                await conn.execute("SELECT 1")
        # asyncpg releases a connection it saw lost at once, and its proxy then refuses every call: the
        # block's own error, not one of closing what was closed already.
        assert "terminate()" not in str(raised.value), raised.value
        async with database.acquire() as conn:
            assert await conn.fetchval("SELECT 1") == 1
            assert conn.get_server_pid() != pid
    finally:
        await pool.close()
