"""Soak: minutes of steady mixed load at about half the measured maximum, watched over time.

    .venv/bin/python bench/soak.py [--minutes 5] [--rate 300]

Producers enqueue `rate` jobs a second (single and batch), workers lease and ack them (5 % are "lost"
by their worker and come back after a 2 s lease), retention is 30 s so pruning runs all along. Every
`--every` seconds it records the service's RSS, the p50/p99 of enqueue and the p99 of ack latency in that window,
the jobs table's and indexes' size, and the backlog. At the end every job that got a 2xx must be
completed or still pending, and none lost. Results: a table here, JSON in bench/results/soak.json.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

import asyncpg
import httpx
import served
from common import Service, fresh_database, percentile, write_results


async def main(minutes: float, rate: int, every: float) -> None:
    async with (
        fresh_database() as dsn,
        Service(dsn, JOBQ_SWEEP_INTERVAL="0.5", JOBQ_PRUNE_INTERVAL="5") as service,
    ):
        url = service.url
        async with httpx.AsyncClient(base_url=url) as setup:
            assert (await setup.post("/jobs", json={"queue": "soak", "payload": 0})).status_code == 201
            r = await setup.patch("/queues/soak", json={"retention": 30, "visibility_timeout": 2})
            assert r.status_code == 200
        conn = await asyncpg.connect(dsn)
        stop = asyncio.Event()
        enqueued: set[int] = set()
        acked: set[int] = set()
        lat = {"enqueue": [], "ack": []}

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
            while not stop.is_set():
                jobs = (
                    await served.post(http, f"{url}/lease", {"queue": "soak", "max_jobs": 10, "wait": 1})
                )["jobs"]
                items = [
                    {"id": j["id"], "lease_token": j["lease_token"]} for j in jobs if random.random() > 0.05
                ]
                if items:
                    started = time.perf_counter()
                    results = (await served.post(http, f"{url}/ack/batch", {"items": items}))["results"]
                    lat["ack"].append(time.perf_counter() - started)
                    acked.update(r["id"] for r in results if r["ok"])

        samples = []
        async with served.Session() as http:
            tasks = [asyncio.create_task(producer(http)) for _ in range(10)]
            tasks += [asyncio.create_task(worker(http)) for _ in range(8)]
            started = time.perf_counter()
            print(
                f"{'t s':>5} {'RSS MB':>7} {'enq p99 ms':>10} {'ack p99 ms':>12} {'table MB':>9} {'index MB':>9} {'backlog':>8} {'live':>7} {'dead':>7} {'vacuums':>7}"
            )
            while time.perf_counter() - started < minutes * 60:
                await asyncio.sleep(every)
                window = {k: v[:] for k, v in lat.items()}
                for v in lat.values():
                    v.clear()
                sizes = await conn.fetchrow(
                    "SELECT pg_table_size('jobq.jobs') AS t, pg_indexes_size('jobq.jobs') AS i,"
                    " (SELECT count(*) FROM jobq.jobs WHERE status IN ('pending', 'running')) AS backlog,"
                    " s.n_live_tup AS live, s.n_dead_tup AS dead, s.autovacuum_count AS vacuums"
                    " FROM pg_stat_user_tables s WHERE s.relid = 'jobq.jobs'::regclass"
                )
                sample = {
                    "t": round(time.perf_counter() - started),
                    "rss_mb": round(service.rss_mb(), 1),
                    "enqueue_p50_ms": round(percentile(window["enqueue"], 50) * 1000, 1),
                    "enqueue_p99_ms": round(percentile(window["enqueue"], 99) * 1000, 1),
                    "ack_p99_ms": round(percentile(window["ack"], 99) * 1000, 1),
                    "table_mb": round(sizes["t"] / 2**20, 1),
                    "index_mb": round(sizes["i"] / 2**20, 1),
                    "backlog": sizes["backlog"],
                    "live_rows": sizes["live"],
                    "dead_rows": sizes["dead"],
                    "autovacuums": sizes["vacuums"],
                }
                samples.append(sample)
                print(
                    f"{sample['t']:5} {sample['rss_mb']:7} {sample['enqueue_p99_ms']:10} {sample['ack_p99_ms']:12}"
                    f" {sample['table_mb']:9} {sample['index_mb']:9} {sample['backlog']:8}"
                    f" {sample['live_rows']:7} {sample['dead_rows']:7} {sample['autovacuums']:7}"
                )
            stop.set()
            await asyncio.gather(*tasks)

        # Nothing lost: every job a producer was told about is still in the table, or was acked (only
        # completed jobs are pruned, after their retention).
        rows = await conn.fetch("SELECT id, status FROM jobq.jobs WHERE queue = 'soak'")
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
    }
    print(f"enqueued {len(enqueued)}, pruned after completion {len(pruned)}, lost {len(lost)}")
    print("written to", write_results("soak", result))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=5)
    parser.add_argument("--rate", type=int, default=300, help="jobs enqueued per second")
    parser.add_argument("--every", type=float, default=15, help="seconds between samples")
    args = parser.parse_args()
    asyncio.run(main(args.minutes, args.rate, args.every))
