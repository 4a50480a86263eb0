"""Many schedules on two replicas: is every slot fired once, and how late?

    .venv/bin/python bench/schedules.py [--schedules 10000] [--minutes 3] [--spread]

Declares `--schedules` per-minute schedules (`* * * * *`, half of them read in Europe/Berlin; with
`--spread`, `S * * * * *` with S from 0 to 59, sixty crons a second apart) straight into a fresh
database, starts two `jobq serve` replicas on it, and lets them run for `--minutes` minutes while it asks
both for /healthz every 100 ms. Then, per slot: jobs due (one per schedule), fired, fired twice, and the
lateness of their enqueue (created_at - schedule_slot: p50, p99, max). Results in
bench/results/schedules.json.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import UTC, datetime, timedelta

import asyncpg
import httpx
from common import Service, fresh_database, percentile, summary_ms, write_results


async def declare(dsn: str, count: int, spread: bool) -> datetime:
    """The schedules, all due from the next minute on (a little later with --spread); their first slot."""
    conn = await asyncpg.connect(dsn)
    try:
        first = await conn.fetchval("SELECT date_trunc('minute', now()) + interval '1 min'")
        if (first - datetime.now(UTC)).total_seconds() < 20:  # time for the replicas to start
            first += timedelta(minutes=1)
        cron = "(i % 60)::text || ' * * * * *'" if spread else "'* * * * *'"
        offset = "make_interval(secs => i % 60)" if spread else "interval '0 s'"
        await conn.execute(
            f"""
            INSERT INTO jobq.schedules (name, cron, timezone, queue, payload, catch_up, next_run_at)
            SELECT 'bench-' || lpad(i::text, 6, '0'), {cron},
                   CASE WHEN i % 2 = 0 THEN 'UTC' ELSE 'Europe/Berlin' END,
                   'bench-' || (i % 20), to_jsonb(i), 'skip', $2::timestamptz + {offset}
            FROM generate_series(1, $1) AS i
            """,
            count,
            first,
        )
        return first
    finally:
        await conn.close()


async def watch_health(urls: list[str], until: float, seconds: list[float]) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        while time.monotonic() < until:
            for url in urls:
                began = time.monotonic()
                await http.get(f"{url}/healthz")
                seconds.append(time.monotonic() - began)
            await asyncio.sleep(0.1)


async def per_slot(dsn: str, count: int, first: datetime, minutes: int) -> list[dict]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            """
            SELECT date_trunc('minute', schedule_slot) AS minute, count(*) AS fired,
                   count(*) - count(DISTINCT (schedule, schedule_slot)) AS twice,
                   array_agg(extract(epoch FROM created_at - schedule_slot)::float8) AS late
            FROM jobq.all_jobs WHERE schedule IS NOT NULL AND schedule_slot < $1
            GROUP BY 1 ORDER BY 1
            """,
            first + timedelta(minutes=minutes),
        )
        worst = await conn.fetch(
            """
            SELECT schedule_slot, count(*) AS jobs, max(created_at - schedule_slot) AS late
            FROM jobq.all_jobs WHERE schedule IS NOT NULL AND schedule_slot < $1
            GROUP BY 1 ORDER BY 3 DESC LIMIT 3
            """,
            first + timedelta(minutes=minutes),
        )
    finally:
        await conn.close()
    for row in worst:  # the latest slots: which second, how many jobs
        print("late slot", row["schedule_slot"].strftime("%H:%M:%S"), row["jobs"], row["late"])
    return [
        {
            "minute": row["minute"].strftime("%H:%M"),
            "due": count,
            "fired": row["fired"],
            "fired_twice": row["twice"],
            "late_p50_s": round(percentile(row["late"], 50), 3),
            "late_p99_s": round(percentile(row["late"], 99), 3),
            "late_max_s": round(max(row["late"]), 3),
        }
        for row in rows
    ]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--minutes", type=int, default=3)
    parser.add_argument("--spread", action="store_true", help="sixty crons, a second apart")
    args = parser.parse_args()
    async with fresh_database() as dsn:
        first = await declare(dsn, args.schedules, args.spread)
        async with Service(dsn, port=18731) as one, Service(dsn, port=18732) as two:
            end = first + timedelta(minutes=args.minutes, seconds=15)
            health: list[float] = []
            wait = (end - datetime.now(UTC)).total_seconds()
            await watch_health([one.url, two.url], time.monotonic() + wait, health)
        minutes = await per_slot(dsn, args.schedules, first, args.minutes)
    results = {
        "schedules": args.schedules,
        "spread": args.spread,
        "minutes": minutes,
        "healthz": summary_ms(health) | {"max_ms": round(max(health) * 1000, 2)},
    }
    for minute in minutes:
        print(minute)
    print("healthz", results["healthz"])
    print(write_results("schedules", results))


if __name__ == "__main__":
    asyncio.run(main())
