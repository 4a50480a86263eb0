"""Finished jobs' retention: jobq.jobs_history, range-partitioned by day of `purge_after` (UTC), made
and dropped here, by the retention round of the background loops (app/service/loops/background.py).

- Partitions are made ahead: for each retention in use, the day on which a job finished now will be
  purged, and the day after. A job no day's partition takes (a queue's retention changed a moment ago)
  goes to the default partition; making its day's partition later moves such rows into it.
- A day's partition is dropped once its day is over, since every job in it is then past its purge_after:
  no rows are deleted, so retention leaves no dead tuples and nothing for vacuum. The default partition's
  rows past their purge_after are deleted in batches (PRUNE_HISTORY_DEFAULT); it stays small.
- Finished jobs still in jobq.jobs are moved (MOVE_FINISHED).

A job is gone for the API at its purge_after (the all_jobs view leaves it out); the space it takes goes
when its day's partition is dropped, up to a day later.

Making and dropping partitions are DDL: each runs in a transaction of its own, under a transaction-level
advisory lock that one replica takes at a time (the others skip the round), and waits at most
DDL_LOCK_TIMEOUT for its locks. Dropping a partition takes an ACCESS EXCLUSIVE lock on jobs_history
(PostgreSQL locks the parent to drop a partition), so acks and cancels, which insert into it, wait for
the drop, about a tenth of a second for a partition of 2 million rows; a drop that cannot get its lock
in time gives way and is tried again next round. Making a partition locks jobs_history the same way
(see _make), for as long as it takes to move the default partition's few rows of that day. Nothing here
needs a session: it runs through a pooler in transaction mode.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import date, timedelta

import asyncpg

from app.db import sql as q
from app.db.pool import Database
from app.service.upkeep import prune_in_batches

log = logging.getLogger("jobq.history")

DDL_LOCK_TIMEOUT = "200ms"
HISTORY_LOCK = "SELECT pg_try_advisory_xact_lock(hashtext('jobq.history'))"
PREFIX = "jobs_history_p"


@dataclass
class Kept:
    """What one round did."""

    moved: int = 0  # finished jobs moved from jobq.jobs (MOVE_FINISHED counts those it deleted too)
    made: list[date] = field(default_factory=list)
    dropped: list[date] = field(default_factory=list)
    pruned: int = 0  # rows of the default partition past their purge_after


def partition_name(day: date) -> str:
    return f"{PREFIX}{day:%Y%m%d}"


def _bound(day: date) -> str:
    return f"'{day.isoformat()} 00:00:00+00'"


def _make(day: date) -> list[str]:
    """The statements that make `day`'s partition: a table of its own first, the default partition's rows
    of that day moved into it, then attached (with a default partition present, PostgreSQL checks that
    none of its rows belongs to the new range, and refuses otherwise).

    Reads and inserts of jobs_history wait for it all (ACCESS EXCLUSIVE, as a drop takes it), since
    attaching alone locks jobs_history only against other DDL:
    - an insert (an ack, a cancel) meanwhile could put a row of that day into the default partition after
      the move (the attach then refuses), or choose the default partition just before the attach commits
      and then break its new constraint (the ack fails);
    - a read could take the list of partitions before the attach commits and its snapshot after: it
      would see the moved rows gone from the default partition and not look in the new one (a finished
      job answered 404 for a moment)."""
    name, low, high = partition_name(day), _bound(day), _bound(day + timedelta(days=1))
    return [
        "LOCK TABLE jobq.jobs_history IN ACCESS EXCLUSIVE MODE",
        f"CREATE TABLE jobq.{name} (LIKE jobq.jobs_history INCLUDING DEFAULTS)",
        f"""WITH moved AS (
                DELETE FROM jobq.jobs_history_default
                WHERE purge_after >= {low} AND purge_after < {high} RETURNING *)
            INSERT INTO jobq.{name} SELECT * FROM moved""",
        f"ALTER TABLE jobq.jobs_history ATTACH PARTITION jobq.{name} FOR VALUES FROM ({low}) TO ({high})",
    ]


async def _ddl(db: Database, statements: list[str], unless: str | None = None) -> bool:
    """Run `statements` in one transaction under the history lock, unless `unless` (a query, read once
    the lock is held) finds them done; whether they ran (False: done already, another replica holds the
    lock, or a lock was not had in time: the next round tries again)."""
    try:
        async with db.acquire() as conn, conn.transaction():
            if not await conn.fetchval(HISTORY_LOCK) or (unless and await conn.fetchval(unless)):
                return False
            await conn.execute(f"SET LOCAL lock_timeout = '{DDL_LOCK_TIMEOUT}'")
            for statement in statements:
                await conn.execute(statement)
            return True
    except asyncpg.LockNotAvailableError:
        log.info("jobs_history: gave way to a lock, trying again next round: %s", statements[-1])
        return False


async def partitions(db: Database) -> list[date]:
    async with db.acquire() as conn:
        names = [r["name"] for r in await conn.fetch(q.HISTORY_PARTITIONS.text)]
    return sorted(date(int(n[-8:-4]), int(n[-4:-2]), int(n[-2:])) for n in names)


async def keep_history(db: Database) -> Kept:
    """One retention round: finished jobs moved out of jobq.jobs, the partitions needed made, those past
    their day dropped, the default partition pruned."""
    kept = Kept()
    kept.moved = await prune_in_batches(db, q.MOVE_FINISHED)
    async with db.acquire() as conn:
        needed = await conn.fetchrow(q.HISTORY_DAYS.text)
    existing = set(await partitions(db))
    for day in sorted(set(needed["days"]) - existing):
        made = f"SELECT to_regclass('jobq.{partition_name(day)}') IS NOT NULL"
        if await _ddl(db, _make(day), unless=made):
            kept.made.append(day)
    for day in sorted(d for d in existing if d < needed["today"]):
        if await _ddl(db, [f"DROP TABLE IF EXISTS jobq.{partition_name(day)}"]):
            kept.dropped.append(day)
    kept.pruned = await prune_in_batches(db, q.PRUNE_HISTORY_DEFAULT)
    return kept
