"""The service's operations called as the routers call them, for the service-layer tests: on a Runtime
opened on the test's database (tests.helpers.open_runtime), without HTTP or a running service."""

from __future__ import annotations

from typing import Any

import asyncpg

from app import service
from app.service.runtime import Runtime


async def enqueue(runtime: Runtime, queue: str = "q", payload: Any = None, **fields: Any) -> service.Row:
    return await service.enqueue(runtime, service.NewJob(queue, payload, **fields))


async def lease(
    runtime: Runtime, queue: str = "q", max_jobs: int = 1, visibility_timeout: float | None = None
) -> list[service.Row]:
    """A lease that does not wait (`wait` 0). The runtime's Wakeups are never started: a lease that does
    not wait only asks them whether the service is closing."""
    return await service.lease(
        runtime,
        queue=queue,
        max_jobs=max_jobs,
        visibility_timeout=visibility_timeout,
        wait=0,
        worker_id="w1",
    )


async def lease_one(
    runtime: Runtime, queue: str = "q", visibility_timeout: float | None = None
) -> service.Row:
    (leased,) = await lease(runtime, queue, visibility_timeout=visibility_timeout)
    return leased


def held(job: service.Row) -> service.JobLease:
    return service.JobLease(job["id"], job["lease_token"])


async def ack(runtime: Runtime, item: service.JobLease) -> service.Row:
    return service.single(await service.ack(runtime, item))


async def nack(runtime: Runtime, job: service.Row, **fields: Any) -> service.Row:
    """Nack the lease `job` was leased under (a job as leased, or any {id, lease_token})."""
    return service.single(await service.nack(runtime, service.Nack(job["id"], job["lease_token"], **fields)))


async def make_dead(runtime: Runtime, queue: str = "q", **fields: Any) -> int:
    """A dead job (enqueued with max_attempts=1, leased, nacked); its id. The queue must have no other
    ready job."""
    job = await enqueue(runtime, queue, max_attempts=1, **fields)
    leased = await lease_one(runtime, queue)
    assert leased["id"] == job["id"]
    assert (await nack(runtime, leased, error="boom"))["status"] == "dead"
    return job["id"]


async def expire(db: asyncpg.Connection, job_id: int) -> None:
    """The lease's deadline passes (moved into the past, not waited for)."""
    await db.execute("UPDATE jobq.jobs SET lease_expires_at = now() - interval '1 s' WHERE id = $1", job_id)
