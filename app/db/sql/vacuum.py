"""The vacuum loop's statements: whether jobq.jobs needs a VACUUM, the lock that lets one process run it,
and the VACUUM itself (app/service/loops/vacuum.py)."""

from app.db.sql.query import Query

# The jobs table's live and dead rows, all the vacuum loop (app/service/loops/vacuum.py) reads to decide.
VACUUM_HEALTH = Query.define(
    "vacuum_health",
    """
    SELECT n_live_tup AS live, n_dead_tup AS dead
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
