"""Soak: minutes of steady mixed load, watched over time.

    make soak            (or: .venv/bin/python bench/soak.py [--minutes 30] [--rate 1000] [--backlog 100000])

Producers enqueue `rate` jobs a second (single and batch), workers lease and ack them (5 % are "lost"
by their worker and come back after a 2 s lease), retention is 30 s so retention runs all along. A
backlog of N jobs (`--backlog`, 100,000) waits from the start and the workers lease `rate` jobs a
second, oldest first, so that about N stay waiting: a queue that holds a backlog. With `--backlog 0`
the workers take jobs as they come: the queue is drained as it fills, its few live rows are nothing
beside the churn between two vacuums, and what to watch is that the table does not grow.

Every `--every` seconds it records the service's RSS, the p50/p99 of enqueue and the p99 of lease
(claims that found jobs) and ack latency in that window, the hot table's size against its live rows',
its indexes' size, backlog, dead tuples and vacuums (jobq's and autovacuum's), and jobs_history's size.
At the end every job that got a 2xx must be completed or still pending, and none lost; and the verdict:
the hot table under 2 x its live rows and no larger than in its first five minutes, the lease p99 of
the last minute within 1.2 x the first's. Results: a table here, JSON in bench/results/soak.json.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

import asyncpg
import httpx
import served
from common import Service, fresh_database, percentile, write_results

# The hot table (jobq.jobs: pending, running and dead jobs): its size, its live rows' size (what it would
# take packed), its indexes' size, its backlog, dead tuples and vacuums; and jobs_history's size.
SIZES = """
    SELECT pg_table_size('jobq.jobs') AS t, pg_indexes_size('jobq.jobs') AS i,
           (SELECT coalesce(sum(pg_column_size(j.*)), 0)::bigint FROM jobq.jobs j) AS rows,
           (SELECT count(*) FROM jobq.jobs WHERE status IN ('pending', 'running')) AS backlog,
           s.n_dead_tup AS dead, s.autovacuum_count + s.vacuum_count AS vacuums,
           (SELECT coalesce(sum(pg_total_relation_size(i.inhrelid)), 0)::bigint FROM pg_inherits i
            WHERE i.inhparent = 'jobq.jobs_history'::regclass) AS history
    FROM pg_stat_user_tables s WHERE s.relid = 'jobq.jobs'::regclass
"""


WORKERS = 8
LEASE = 10  # jobs each worker leases a call (max_jobs)
LOST = 0.05  # the share of leased jobs a worker "loses": they come back after their lease


def verdict(samples: list[dict]) -> dict:
    """What issue-sized soaks are judged by: the hot table at the end against its live rows, and against
    its largest in the first five minutes (a queue drained as it fills has almost no live rows: its
    table is the churn between two vacuums, which must not grow); and the claim's p99 over the last
    minute against the first (medians of the samples in each)."""
    per_minute = max(1, round(60 / (samples[1]["t"] - samples[0]["t"]))) if len(samples) > 1 else 1
    first, last = samples[:per_minute], samples[-per_minute:]
    end = samples[-1]
    return {
        "hot_table_vs_live_rows": round(end["table_mb"] / max(end["rows_mb"], 0.01), 2),
        "hot_table_vs_first_5_minutes": round(
            end["table_mb"] / max(s["table_mb"] for s in samples[: 5 * per_minute]), 2
        ),
        "lease_p99_last_vs_first_minute": round(
            statistics.median(s["lease_p99_ms"] for s in last)
            / statistics.median(s["lease_p99_ms"] for s in first),
            2,
        ),
    }


async def main(minutes: float, rate: int, every: float, backlog: int) -> None:
    async with (
        fresh_database() as dsn,
        Service(dsn, JOBQ_SWEEP_INTERVAL="0.5", JOBQ_PRUNE_INTERVAL="5") as service,
    ):
        url = service.url
        enqueued: set[int] = set()
        acked: set[int] = set()
        async with httpx.AsyncClient(base_url=url) as setup:
            assert (await setup.post("/jobs", json={"queue": "soak", "payload": 0})).status_code == 201
            r = await setup.patch("/queues/soak", json={"retention": 30, "visibility_timeout": 2})
            assert r.status_code == 200
            for start in range(0, backlog, 1000):
                batch = [
                    {"queue": "soak", "payload": {"waiting": n}}
                    for n in range(start, min(start + 1000, backlog))
                ]
                r = await setup.post("/jobs/batch", json={"jobs": batch}, timeout=60)
                assert r.status_code == 201, r.text
                enqueued.update(j["id"] for j in r.json()["jobs"])
        conn = await asyncpg.connect(dsn)
        stop = asyncio.Event()
        lat = {"enqueue": [], "lease": [], "ack": []}

        async def producer(http: served.Session) -> None:
            n = 0
            interval = 10 / rate  # ten producers
            next_at = time.perf_counter()
            while not stop.is_set():
                n += 1
                started = time.perf_counter()
                if n % 10 == 0:
                    body = {"jobs": [{"queue": "soak", "payload": {"n": n, "i": i}} for i in range(10)]}
                    jobs = (await served.post(http, f"{url}/jobs/batch", body))["jobs"]
                    enqueued.update(j["id"] for j in jobs)
                    next_at += interval * 10
                else:
                    job = await served.post(http, f"{url}/jobs", {"queue": "soak", "payload": {"n": n}})
                    enqueued.add(job["id"])
                    next_at += interval
                lat["enqueue"].append(time.perf_counter() - started)
                await asyncio.sleep(max(0, next_at - time.perf_counter()))

        async def worker(http: served.Session) -> None:
            # With a backlog: paced, `rate` new jobs a second in all, and the lost ones again.
            interval = WORKERS * LEASE * (1 - LOST) / rate
            next_at = time.perf_counter()
            while not stop.is_set():
                if backlog:
                    next_at += interval
                    await asyncio.sleep(max(0, next_at - time.perf_counter()))
                started = time.perf_counter()
                jobs = (
                    await served.post(http, f"{url}/lease", {"queue": "soak", "max_jobs": LEASE, "wait": 1})
                )["jobs"]
                if jobs:  # a claim; a long-poll that found nothing waited for work, not for the claim
                    lat["lease"].append(time.perf_counter() - started)
                items = [
                    {"id": j["id"], "lease_token": j["lease_token"]} for j in jobs if random.random() >= LOST
                ]
                if items:
                    started = time.perf_counter()
                    results = (await served.post(http, f"{url}/ack/batch", {"items": items}))["results"]
                    lat["ack"].append(time.perf_counter() - started)
                    acked.update(r["id"] for r in results if r["ok"])

        samples = []
        async with served.Session() as http:
            tasks = [asyncio.create_task(producer(http)) for _ in range(10)]
            tasks += [asyncio.create_task(worker(http)) for _ in range(WORKERS)]
            started = time.perf_counter()
            print(
                f"{'t s':>5} {'RSS MB':>7} {'enq p99':>8} {'lease p99':>9} {'ack p99':>8} {'hot MB':>7}"
                f" {'rows MB':>7} {'index MB':>8} {'backlog':>7} {'dead':>7} {'vacuums':>7} {'history MB':>10}"
            )
            while time.perf_counter() - started < minutes * 60:
                await asyncio.sleep(every)
                window = {k: v[:] for k, v in lat.items()}
                for v in lat.values():
                    v.clear()
                sizes = await conn.fetchrow(SIZES)
                sample = {
                    "t": round(time.perf_counter() - started),
                    "rss_mb": round(service.rss_mb(), 1),
                    "enqueue_p50_ms": round(percentile(window["enqueue"], 50) * 1000, 1),
                    "enqueue_p99_ms": round(percentile(window["enqueue"], 99) * 1000, 1),
                    "lease_p99_ms": round(percentile(window["lease"], 99) * 1000, 1),
                    "ack_p99_ms": round(percentile(window["ack"], 99) * 1000, 1),
                    "table_mb": round(sizes["t"] / 2**20, 2),
                    "rows_mb": round(sizes["rows"] / 2**20, 2),
                    "index_mb": round(sizes["i"] / 2**20, 2),
                    "backlog": sizes["backlog"],
                    "dead_rows": sizes["dead"],
                    "vacuums": sizes["vacuums"],
                    "history_mb": round(sizes["history"] / 2**20, 1),
                }
                samples.append(sample)
                print(
                    f"{sample['t']:5} {sample['rss_mb']:7} {sample['enqueue_p99_ms']:8} {sample['lease_p99_ms']:9}"
                    f" {sample['ack_p99_ms']:8} {sample['table_mb']:7} {sample['rows_mb']:7}"
                    f" {sample['index_mb']:8} {sample['backlog']:7} {sample['dead_rows']:7}"
                    f" {sample['vacuums']:7} {sample['history_mb']:10}"
                )
            stop.set()
            await asyncio.gather(*tasks)

        # Nothing lost: every job a producer was told about is still in the table, or was acked (only
        # completed jobs are pruned, after their retention).
        rows = await conn.fetch("SELECT id, status FROM jobq.all_jobs WHERE queue = 'soak'")
        status = {r["id"]: r["status"] for r in rows}
        pruned = [i for i in enqueued if i not in status]
        lost = [i for i in pruned if i not in acked]
        wrong = [i for i in enqueued if status.get(i) in ("dead", "cancelled")]
        await conn.close()
    result = {
        "minutes": minutes,
        "rate_per_s": rate,
        "enqueued": len(enqueued),
        "pruned_after_completion": len(pruned),
        "lost": len(lost),
        "dead_or_cancelled": len(wrong),
        "samples": samples,
    } | verdict(samples)
    print(f"enqueued {len(enqueued)}, pruned after completion {len(pruned)}, lost {len(lost)}")
    print(
        f"hot table {result['hot_table_vs_live_rows']} x its live rows (< 2),"
        f" {result['hot_table_vs_first_5_minutes']} x its largest in the first 5 minutes;"
        f" lease p99 last minute {result['lease_p99_last_vs_first_minute']} x the first (<= 1.2)"
    )
    print("written to", write_results("soak", result))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--rate", type=int, default=1000, help="jobs enqueued per second")
    parser.add_argument("--every", type=float, default=15, help="seconds between samples")
    parser.add_argument("--backlog", type=int, default=100_000, help="jobs kept waiting all along (0: none)")
    args = parser.parse_args()
    asyncio.run(main(args.minutes, args.rate, args.every, args.backlog))
