"""GET /jobs: a page of jobs, newest first, from a bounded window of an index (app/service/operators.py
list_jobs).
"""

from __future__ import annotations

from app.core.states import JobStatus
from app.db.sql.fragments import JOB
from app.db.sql.query import Query

# GET /jobs: one page of jobs, newest first, from a window below :before_id of at most :scan jobs, and for
# a search of at most :units units of text (BYTE_UNIT bytes each). The window is what an index answers,
# read lazily newest first: the primary key (every queue), or (queue, id) queue by queue (`queues`: a
# queue named, or the queues of a token's scope, each with a window of its own), and a status's own table.
# Kind, key and the search (:pattern, an ILIKE pattern over the dedup_key, the last error and the
# payload's text) are checked within the window only, so no page reads more than :scan rows however rare
# its matches among millions of finished jobs, and a scope never reads another queue's rows: a filter on
# the queue inside a walk of the primary key would read every foreign job newer than the scope's to fill
# the window.
# A search's bound is the text it reads, not what the rows take on disk (a payload of 100 KB of JSON may
# be stored in 14 KB, and searching it costs its 100 KB). A job weighs a unit and one more per BYTE_UNIT
# bytes of its text; the window stops at the job that reaches :units: each job is a row per unit, counted
# by a count(*) OVER that PostgreSQL stops at :units (a run condition: it reads no further job), so no job
# past the bound has its payload turned into text (but the one after a job that ends on the bound
# exactly). A page without a search has no bytes to count (the LIST_WINDOW without `_search`).
# LIST_WINDOW answers a window's matches, newest first, up to :limit (a page that fills stops reading
# there), and its last row when the window ended before the jobs did (full_rows: :scan read, full_bytes:
# :units searched), which tells where the next page starts (app/service/operators.py list_jobs); LIST_PAGE
# then reads the page's jobs. A status reads only where jobs of that status are (`status`: "active" or
# "finished", the tables of LIST_SOURCES; a status a table cannot hold would walk all its rows for none):
# pending, running and dead jobs are in jobq.jobs; completed and cancelled ones in jobs_history, or in
# jobq.jobs still where an older release left them (all_jobs).
LIST_SOURCES = {None: "jobq.all_jobs", "active": "jobq.jobs", "finished": "jobq.all_jobs"}
HISTORY_STATUSES = frozenset({JobStatus.COMPLETED, JobStatus.CANCELLED})

# A search counts the text it reads in units of this many bytes (LIST_WINDOW): a job of less is one row,
# so that counting costs a search over small jobs little (each row counted costs about a microsecond).
BYTE_UNIT = 256


def list_filters(queues: bool, status: str | None, search: bool) -> tuple[bool, str | None, bool]:
    """The key of LIST_WINDOW for a page read queue by queue (or not), with this status (where it is
    held: LIST_PAGE's key) and a search (or not)."""
    held = None if status is None else "finished" if status in HISTORY_STATUSES else "active"
    return queues, held, search


def _list_window(queues: bool, status: str | None, search: bool) -> Query:
    where = ["j.id < :before_id"]
    keys = ["id"]  # the window's order, newest first
    if queues:
        # The queue as a range of one, and first in the order: only a (queue, id) index gives that order,
        # so the plan reads the queue's jobs alone. With `j.queue = s.queue`, a constant, the order would
        # be id's alone, and the planner, which knows no queue's share of the rows here (the queue is the
        # lateral's, not a parameter), could walk the primary key and filter: every newer job of every
        # other queue read.
        where.append("j.queue >= s.queue AND j.queue <= s.queue")
        keys = ["queue", "id"]
    if status:
        where.append("j.status = :status")

    def order(alias: str) -> str:
        return ", ".join(f"{alias}.{key} DESC" for key in keys)

    # Without a search, no bytes to count: each job is a row, its place in the window row_number().
    window = f"""
        SELECT w.id, w.matched, w.n = :scan AS full_rows, false AS full_bytes
        FROM (
            SELECT {", ".join(f"j.{key}" for key in keys)}, row_number() OVER seen AS n,
                   (:kind::text IS NULL OR j.kind = :kind::text)
                   AND (:key::text IS NULL OR j.key = :key::text) AS matched
            FROM (
                SELECT {", ".join(f"j.{key}" for key in keys)}, j.kind, j.key
                FROM {LIST_SOURCES[status]} j
                WHERE {" AND ".join(where)}
                ORDER BY {order("j")}
                LIMIT :scan
            ) j
            WINDOW seen AS (ORDER BY {order("j")} ROWS UNBOUNDED PRECEDING)
        ) w
        WHERE w.matched OR w.n = :scan
        ORDER BY {order("w")}
        LIMIT :limit"""
    if search:
        window = f"""
        SELECT w.id, w.matched, w.n = :scan AS full_rows, w.read + w.weight - 1 >= :units AS full_bytes
        FROM (
            SELECT {", ".join(f"u.{key}" for key in keys)}, u.matched, u.weight, u.first,
                   count(*) FILTER (WHERE u.first) OVER seen AS n, count(*) OVER seen AS read
            FROM (
                SELECT y.*, unnest(ARRAY[true] || array_fill(false, ARRAY[y.weight - 1])) AS first
                FROM (
                    SELECT {", ".join(f"j.{key}" for key in keys)},
                           (:kind::text IS NULL OR j.kind = :kind::text)
                           AND (:key::text IS NULL OR j.key = :key::text)
                           AND (j.dedup_key ILIKE :pattern OR j.last_error ILIKE :pattern
                                OR j.text ILIKE :pattern) AS matched,
                           1 + (octet_length(j.text) + coalesce(octet_length(j.last_error), 0)
                                + coalesce(octet_length(j.dedup_key), 0)) / {BYTE_UNIT} AS weight
                    FROM (
                        SELECT {", ".join(f"j.{key}" for key in keys)}, j.kind, j.key, j.dedup_key,
                               j.last_error, j.payload::text AS text
                        FROM {LIST_SOURCES[status]} j
                        WHERE {" AND ".join(where)}
                        ORDER BY {order("j")}
                        LIMIT :scan
                    ) j
                    ORDER BY {order("j")}
                    OFFSET 0  -- each job's match and weight once, not once per unit of it
                ) y
                ORDER BY {order("y")}
            ) u
            WINDOW seen AS (ORDER BY {order("u")} ROWS UNBOUNDED PRECEDING)
        ) w
        WHERE w.read <= :units AND w.first AND (w.matched OR w.n = :scan OR w.read + w.weight - 1 >= :units)
        ORDER BY {order("w")}
        LIMIT :limit"""
    if queues:
        window = f"SELECT p.* FROM unnest(:queues::text[]) AS s(queue) CROSS JOIN LATERAL ({window}) p"
    name = f"list_window{'_queues' * queues}{f'_{status}' if status else ''}{'_search' * search}"
    return Query.define(name, window)


def _list_page(status: str | None) -> Query:
    return Query.define(
        f"list_page{f'_{status}' if status else ''}",
        f"""
        SELECT {JOB}
        FROM {LIST_SOURCES[status]} j LEFT JOIN jobq.queues q ON q.name = j.queue
        WHERE j.id = ANY(:ids::bigint[])
        ORDER BY j.id DESC
        """,
    )


LIST_WINDOW = {
    (queues, status, search): _list_window(queues, status, search)
    for queues in (False, True)
    for status in LIST_SOURCES
    for search in (False, True)
}
LIST_PAGE = {status: _list_page(status) for status in LIST_SOURCES}

# The queues a token's scope admits, by name: those a page of GET /jobs reads one by one. Every job's
# queue has a row (an enqueue makes it, DeleteQueue takes the jobs with it).
SCOPE_QUEUES = Query.define(
    "scope_queues",
    """
    SELECT coalesce(array_agg(name ORDER BY name), '{}') FROM jobq.queues
    WHERE name LIKE ANY(:scope::text[])
    """,
)
