"""Keeping the hot jobs table small.

Every job row is written two or three times in jobq.jobs and then deleted (its finished state moves to
jobq.jobs_history), so the table makes dead rows as fast as it does work: 2,000 a second at 1,000 jobs
a second. PostgreSQL's autovacuum reclaims them (the migration tunes it for this table), but it visits
a database at most once per `autovacuum_naptime` (a minute by default), and a minute of dead rows at
that pace makes the table 2.8 times the size of its live rows (a queue holding 100,000 waiting jobs,
measured with `bench/soak.py --backlog 100000`); it may also be off on a server, or fall behind. So
every `vacuum_interval` seconds one service process (an advisory lock picks it) reads the table's
statistics and runs VACUUM itself when dead rows outnumber a fifth of the live ones (and at least
1,000), whatever autovacuum does. The table holds only waiting, running and dead jobs, so this VACUUM
is short; it takes no lock that blocks leases, acks or enqueues. The lock and the VACUUM need a
session: through a pooler in transaction mode they run on a connection of their own to PostgreSQL
itself (JOBQ_LISTEN_URL), made for the check.
"""

from __future__ import annotations

import logging

from app.db.pool import Database
from app.db.sql import MAINTENANCE_LOCK, MAINTENANCE_UNLOCK, VACUUM_HEALTH, VACUUM_JOBS

log = logging.getLogger("jobq.maintenance")


def needs_vacuum(live: int, dead: int) -> bool:
    return dead >= max(1000, live // 5)


async def vacuum_if_needed(db: Database) -> bool:
    """Vacuum the jobs table if it needs it and no other process is already at it; whether it ran."""
    async with db.session("jobq maintenance") as conn:
        if not await conn.fetchval(MAINTENANCE_LOCK.text):
            return False
        try:
            health = await conn.fetchrow(VACUUM_HEALTH.text)
            if health is None or not needs_vacuum(**dict(health)):
                return False
            log.info("vacuuming jobq.jobs: %d dead rows, %d live", health["dead"], health["live"])
            # The pool's statement timeout is for requests; a vacuum of a big table may take longer.
            await conn.execute("SET statement_timeout = 0")
            try:
                await conn.execute(VACUUM_JOBS.text, timeout=3600)
            finally:
                await conn.execute("RESET statement_timeout")
            return True
        finally:
            await conn.fetchval(MAINTENANCE_UNLOCK.text)
