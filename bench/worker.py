"""Throughput of the Python worker runner (jobq/worker.py) on no-op handlers, through a real service.

    .venv/bin/python bench/worker.py [--jobs 4000]

For plain and async handlers at concurrency 1 and 16: jobs completed per second, from the worker's
start to the last ack, on a queue filled beforehand with `enqueue_many`. Each case runs on a fresh
database with a fresh `jobq serve`, so nothing carries over. What it measures is the runner's own cost
(lease, ack, a thread per plain handler), since the handlers do nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import time
from collections.abc import Callable
from typing import Any

from common import Service, fresh_database, write_results

from jobq import AsyncClient, Worker


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plain(job: object) -> None:
    pass


async def coroutine(job: object) -> None:
    pass


def sleeping(seconds: float, asynchronous: bool) -> Callable[[Any], Any]:
    """A handler that takes `seconds` per job: `asyncio.sleep` or, plain, `time.sleep` (on its thread)."""
    if asynchronous:

        async def wait(job: object) -> None:
            await asyncio.sleep(seconds)

        return wait

    def block(job: object) -> None:
        time.sleep(seconds)

    return block


async def drain(url: str, queue: str, handler: Callable[[Any], Any], concurrency: int, total: int) -> float:
    """Jobs per second of one `Worker` draining `total` jobs already in `queue`, from its start to the last
    ack (bench/run.py's `runner` scenario compares it with a plain HTTP batch drain of the same run)."""
    async with AsyncClient(url) as client:
        worker = Worker(handler, queue, client=client, concurrency=concurrency, wait=1)
        started = time.perf_counter()
        run = asyncio.create_task(worker.run())
        while worker.stats.done < total:
            if run.done():  # it failed: say why rather than wait forever
                run.result()
            await asyncio.sleep(0.005)
        took = time.perf_counter() - started
        worker.stop()
        await run
    return total / took


async def case(handler, concurrency: int, jobs: int) -> dict[str, float]:
    async with (
        fresh_database() as dsn,
        Service(dsn, port=free_port()) as service,  # not the default port: other benchmarks may run
        AsyncClient(service.url) as client,
    ):
        for start in range(0, jobs, 1000):
            await client.enqueue_many([{"queue": "bench", "payload": n} for n in range(start, start + 1000)])
        worker = Worker(handler, "bench", client=client, concurrency=concurrency, wait=1)
        started = time.perf_counter()
        run = asyncio.create_task(worker.run())
        while worker.stats.done < jobs:
            await asyncio.sleep(0.005)
        took = time.perf_counter() - started
        worker.stop()
        await run
    return {"jobs_per_second": round(jobs / took), "jobs": jobs}


async def main(jobs: int) -> None:
    results = {}
    for name, handler in (("plain", plain), ("async", coroutine)):
        for concurrency in (1, 16):
            key = f"{name}_concurrency_{concurrency}"
            results[key] = await case(handler, concurrency, jobs)
            print(f"{key:22} {results[key]['jobs_per_second']:6} jobs/s")
    print(write_results("worker", results))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=4000)
    asyncio.run(main(parser.parse_args().jobs))
