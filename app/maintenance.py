"""Keeping the jobs table small when autovacuum does not.

Every job row is updated two or three times and then deleted, so the table produces dead tuples as fast
as it does work. PostgreSQL's autovacuum reclaims them (the migration tunes it for this table), but it
may be switched off on a server, or fall behind. Every `vacuum_interval` seconds one service process
(an advisory lock picks it) looks at the table's statistics and runs VACUUM itself when dead rows
outnumber a fifth of the live ones (and at least 1,000) while autovacuum is off or has not run for
a minute. VACUUM takes no lock that blocks leases, acks or enqueues. The lock and the VACUUM need a
session: through a pooler in transaction mode they run on a connection of their own to PostgreSQL
itself (JOBQ_LISTEN_URL), made for the check.
"""

from __future__ import annotations

import logging

from app.db import Database
from app.queries import Query

log = logging.getLogger("jobq.maintenance")

# The table's dead and live rows, whether autovacuum is on, and seconds since any vacuum of it.
TABLE_HEALTH = Query.define(
    "table_health",
    """
    SELECT n_live_tup AS live, n_dead_tup AS dead, current_setting('autovacuum')::bool AS autovacuum,
           extract(epoch FROM now() - greatest(last_vacuum, last_autovacuum))::float8 AS since_vacuum
    FROM pg_stat_user_tables WHERE relid = 'jobq.jobs'::regclass
    """,
)
MAINTENANCE_LOCK = Query.define(
    "maintenance_lock", "SELECT pg_try_advisory_lock(hashtext('jobq.maintenance'))"
)
MAINTENANCE_UNLOCK = Query.define(
    "maintenance_unlock", "SELECT pg_advisory_unlock(hashtext('jobq.maintenance'))"
)
VACUUM_JOBS = Query.define("vacuum_jobs", "VACUUM (ANALYZE) jobq.jobs")


def needs_vacuum(live: int, dead: int, autovacuum: bool, since_vacuum: float | None) -> bool:
    if dead < max(1000, live // 5):
        return False
    return not autovacuum or since_vacuum is None or since_vacuum > 60


async def vacuum_if_needed(db: Database) -> bool:
    """Vacuum the jobs table if it needs it and no other process is already at it; whether it ran."""
    async with db.session("jobq maintenance") as conn:
        if not await conn.fetchval(MAINTENANCE_LOCK.text):
            return False
        try:
            health = await conn.fetchrow(TABLE_HEALTH.text)
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
