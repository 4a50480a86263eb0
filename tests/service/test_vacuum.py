"""The jobs table is vacuumed by jobq itself when its dead rows pass a fifth of its live ones."""

import pytest

from app.service.loops.vacuum import needs_vacuum, vacuum_if_needed
from tests.helpers import open_database

pytestmark = pytest.mark.anyio


def test_when_a_vacuum_is_needed():
    assert not needs_vacuum(live=10_000, dead=500)  # too few dead
    assert not needs_vacuum(live=0, dead=999)
    assert needs_vacuum(live=0, dead=1000)
    assert not needs_vacuum(live=100_000, dead=15_000)  # less than a fifth
    assert needs_vacuum(live=100_000, dead=20_000)
    assert needs_vacuum(live=10_000, dead=5_000)


async def test_dead_rows_are_reclaimed(database_url, db):
    await db.execute("INSERT INTO jobq.queues (name) VALUES ('q')")
    await db.execute("INSERT INTO jobq.jobs (queue, payload) SELECT 'q', '{}' FROM generate_series(1, 5000)")
    await db.execute("DELETE FROM jobq.jobs")
    await db.execute("SELECT pg_stat_force_next_flush()")
    async with open_database(database_url) as database:
        dead_before = await db.fetchval(
            "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'jobq.jobs'::regclass"
        )
        assert dead_before >= 5000
        assert await vacuum_if_needed(database) is True
        await db.execute("SELECT pg_stat_force_next_flush()")
        dead_after = await db.fetchval(
            "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'jobq.jobs'::regclass"
        )
        assert dead_after == 0
        assert await vacuum_if_needed(database) is False  # nothing left to do
        # The pooled connection keeps the request statement timeout (through a pooler in transaction
        # mode the client keeps it: no session setting may outlive a transaction there).
        if not database.settings.pooled_transactions:
            async with database.acquire() as conn:
                assert await conn.fetchval("SHOW statement_timeout") == "30s"
