"""GET /jobs among many finished jobs of another queue, for a token limited to some queues, and a search
over large payloads: p50 and p99 per kind of page, over HTTP.

A fresh database gets `--jobs` completed jobs (2,000,000 by default) of a queue `big`, with those of `qa`
and `qa-2` spread among them (one in a thousand each, in jobs_history) and 500 pending jobs of `qa`
newest; then `blobs`, 1,000 jobs of 100 KB each, as incompressible (random hex) or compressible (JSON
of repeated keys) payloads. Each kind of page is asked `--pages` times (100), one at a time.

    .venv/bin/python bench/scoped_list.py [--root DIR]

`--root` runs the service from another checkout's tree (`git archive main | tar -x -C DIR`), to measure
the code before a change against the same data.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import httpx
from common import ROOT, fresh_database, summary_ms, write_results
from served import Session

TOKENS = {
    "t-all": "admin",
    "t-qa": {"role": "admin", "queues": ["qa"]},
    "t-qa-any": {"role": "admin", "queues": ["qa*"]},
}


async def start(dsn: str, root: Path, port: int) -> subprocess.Popen:
    env = {
        **os.environ,
        "JOBQ_DATABASE_URL": dsn,
        "JOBQ_TOKENS": json.dumps(TOKENS),
        "PYTHONPATH": str(root),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "jobq", "serve", "--port", str(port), "--log-level", "warning"],
        env=env,
        cwd=root,
    )
    deadline = time.monotonic() + 60
    async with httpx.AsyncClient() as http:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"jobq exited at start (is port {port} in use?)")
            try:
                if (await http.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200:
                    return process
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError("jobq did not start")


async def fill(conn: asyncpg.Connection, jobs: int) -> None:
    # The service makes the day partitions of jobs_history at start: fill them, not the default one.
    deadline = time.monotonic() + 60
    while (
        await conn.fetchval(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'jobq.jobs_history'::regclass"
        )
        < 2
    ):
        if time.monotonic() > deadline:
            raise RuntimeError("no partitions of jobs_history made")
        await asyncio.sleep(0.2)
    await conn.execute("INSERT INTO jobq.queues (name) VALUES ('big'), ('qa'), ('qa-2'), ('blobs')")
    await conn.execute(
        """INSERT INTO jobq.jobs_history (id, queue, status, payload, priority, run_at, attempts, created_at,
                                          updated_at, completed_at, awaited, purge_after, kind)
           SELECT nextval('jobq.jobs_id_seq'),
                  CASE g % 1000 WHEN 0 THEN 'qa' WHEN 500 THEN 'qa-2' ELSE 'big' END, 'completed',
                  jsonb_build_object('to', 'user' || g || '@example.com', 'template', 'welcome', 'n', g),
                  0, now(), 1, now(), now(), now(), false, now() + interval '1 day', 'send'
           FROM generate_series(1, $1) g""",
        jobs,
    )
    await conn.execute(
        """INSERT INTO jobq.jobs (queue, status, payload, priority, run_at, attempts, created_at, updated_at,
                                  awaited)
           SELECT 'qa', 'pending', jsonb_build_object('n', g), 0, now(), 0, now(), now(), false
           FROM generate_series(1, 500) g"""
    )
    await conn.execute("VACUUM ANALYZE jobq.jobs_history")
    await conn.execute("VACUUM ANALYZE jobq.jobs")


async def blobs(conn: asyncpg.Connection, compressible: bool) -> None:
    """`blobs` holds 1,000 finished jobs of about 100 KB of JSON text each (and nothing else)."""
    await conn.execute("DELETE FROM jobq.jobs_history WHERE queue = 'blobs'")
    payload = (
        "(SELECT jsonb_agg(jsonb_build_object('sku', 'item-' || i, 'quantity', i, 'note', 'left at the door'))"
        " FROM generate_series(1, 1900) i)"
        if compressible
        else "jsonb_build_object('blob', (SELECT string_agg(md5(random()::text || i), '') FROM generate_series(1, 3200) i))"
    )
    await conn.execute(
        f"""INSERT INTO jobq.jobs_history (id, queue, status, payload, priority, run_at, attempts, created_at,
                                           updated_at, completed_at, awaited, purge_after)
            SELECT nextval('jobq.jobs_id_seq'), 'blobs', 'completed', {payload}, 0, now(), 1, now(), now(),
                   now(), false, now() + interval '1 day'
            FROM generate_series(1, 1000) g"""
    )
    await conn.execute("VACUUM ANALYZE jobq.jobs_history")


async def pages(url: str, token: str, query: str, count: int, follow: bool = False) -> dict:
    """`count` pages of GET /jobs?`query` (following next_before_id with `follow`, from the top again at the
    end), one at a time."""
    headers = {"Authorization": f"Bearer {token}"}
    latencies, before, shown, stopped = [], None, 0, set()
    async with Session() as http:
        for _ in range(count):
            target = f"{url}/jobs?{query}" + (f"&before_id={before}" if before else "")
            started = time.perf_counter()
            status, body = await http.request("GET", target, b"", headers)
            latencies.append(time.perf_counter() - started)
            assert status == 200, (status, body[:200])
            page = json.loads(body)
            shown += len(page["jobs"])
            stopped.add(page.get("stopped_by"))
            before = page["next_before_id"] if follow else None
    return summary_ms(latencies) | {"jobs_shown": shown, "stopped_by": sorted(map(str, stopped))}


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=2_000_000)
    parser.add_argument("--pages", type=int, default=100)
    parser.add_argument("--root", type=Path, default=ROOT, help="the tree to run the service from")
    parser.add_argument("--port", type=int, default=8931)
    args = parser.parse_args()
    results: dict[str, dict] = {}
    async with fresh_database() as dsn:
        service = await start(dsn, args.root.resolve(), args.port)
        url = f"http://127.0.0.1:{args.port}"
        try:
            conn = await asyncpg.connect(dsn)
            try:
                started = time.monotonic()
                await fill(conn, args.jobs)
                print(f"filled {args.jobs:,} finished jobs in {time.monotonic() - started:.0f} s")
                kinds = {
                    "unscoped, first page": ("t-all", "", False),
                    "unscoped ?queue=qa, first page": ("t-all", "queue=qa", False),
                    "scoped qa, first page": ("t-qa", "", False),
                    "scoped qa, paging through": ("t-qa", "", True),
                    "scoped qa, status=completed paging": ("t-qa", "status=completed", True),
                    "scoped qa, kind (no match)": ("t-qa", "kind=nothing", False),
                    "scoped qa, search (no match)": ("t-qa", "q=needle", False),
                    "scoped qa* (2 queues), paging through": ("t-qa-any", "", True),
                    "scoped qa* (2 queues), search (no match)": ("t-qa-any", "q=needle", False),
                }
                for name, (token, query, follow) in kinds.items():
                    results[name] = await pages(url, token, query, args.pages, follow)
                    row = results[name]
                    print(f"  {name:44} p50 {row['p50_ms']:8.2f}  p99 {row['p99_ms']:8.2f} ms")
                for compressible in (False, True):
                    await blobs(conn, compressible)
                    stored = await conn.fetchval(
                        "SELECT avg(pg_column_size(payload))::int FROM jobq.jobs_history WHERE queue = 'blobs'"
                    )
                    text = await conn.fetchval(
                        "SELECT avg(octet_length(payload::text))::int FROM jobq.jobs_history WHERE queue = 'blobs'"
                    )
                    name = f"search over 1,000 jobs of {text // 1000} KB ({stored // 1000} KB stored)"
                    results[name] = await pages(
                        url, "t-all", "queue=blobs&q=needle", max(5, args.pages // 10)
                    )
                    row = results[name]
                    print(
                        f"  {name:44} p50 {row['p50_ms']:8.2f}  p99 {row['p99_ms']:8.2f} ms  {row['stopped_by']}"
                    )
            finally:
                await conn.close()
        finally:
            service.terminate()
            service.wait(timeout=20)
    tree = "this tree" if args.root.resolve() == ROOT else str(args.root)
    print(write_results("scoped_list", {"service_from": tree, "finished_jobs": args.jobs, "pages": results}))


if __name__ == "__main__":
    asyncio.run(main())
