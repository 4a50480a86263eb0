"""Workers: lease jobs, then ack, nack or extend them under the lease token.

Only the lease names a queue, and checks it against the caller's queues (app/core/access.py). The calls after
it name a job and its lease token, which only that lease handed out: the token fences them, so a token
limited to some queues can ack, nack, extend or release only jobs it leased from them."""

from __future__ import annotations

from fastapi import APIRouter, Request

from app import service
from app.http.auth import Caller, Worker
from app.http.deps import DB, RuntimeDep, answers
from app.http.fastpath.route import JobqRoute
from app.http.middleware.access_log import note
from app.http.openapi import operation_id
from app.http.schemas import (
    AckBatchRequest,
    AckRequest,
    AckResponse,
    BatchResults,
    ExtendRequest,
    ExtendResponse,
    LeaseRequest,
    LeaseResponse,
    NackBatchRequest,
    NackBatchResults,
    NackRequest,
    NackResponse,
    ReleaseRequest,
)
from app.http.web import JSONBody, disconnected

router = APIRouter(
    tags=["workers"],
    dependencies=[Worker],
    route_class=JobqRoute,
    default_response_class=JSONBody,
    generate_unique_id_function=operation_id,
)


@router.post("/lease", response_model=None, responses=answers(LeaseResponse))
async def lease(body: LeaseRequest, runtime: RuntimeDep, request: Request, caller: Caller) -> JSONBody:
    """Claim up to max_jobs ready jobs; with `wait`, long-poll until one is ready or `wait` runs out."""
    caller.admit(body.queue)
    leased = await service.lease(
        runtime,
        queue=body.queue,
        max_jobs=body.max_jobs,
        visibility_timeout=body.visibility_timeout,
        wait=body.wait,
        worker_id=body.worker_id,
        disconnected=disconnected(request),
        per_key=body.per_key,
    )
    note(jobs=len(leased))
    return JSONBody({"jobs": leased})


@router.post("/ack", response_model=None, responses=answers(AckResponse, 404, 409, 413))
async def ack(body: AckRequest, runtime: RuntimeDep) -> JSONBody:
    """Complete the job, keeping `result` with it. A result over the limit is 413 and changes nothing:
    the job stays running under the lease, for an ack without it (or with a smaller one)."""
    service.single(await service.ack(runtime, body))
    return JSONBody({"id": body.id, "status": "completed"})


@router.post("/ack/batch", response_model=None, responses=answers(BatchResults))
async def ack_batch(body: AckBatchRequest, runtime: RuntimeDep) -> JSONBody:
    """Ack each item as /ack would, each answered on its own: an item whose result is over the limit
    gets `payload_too_large` and stays running; the others complete."""
    return JSONBody({"results": await service.ack_batch(runtime, body.items)})


@router.post("/nack", response_model=None, responses=answers(NackResponse, 404, 409))
async def nack(body: NackRequest, runtime: RuntimeDep) -> JSONBody:
    """Fail the attempt: the job is pending again after `retry_after` (else the queue's backoff), or dead
    with `dead` true or its attempts used up. The lease ends; a stale token is 409 lease_lost."""
    result = service.single(await service.nack(runtime, body))
    return JSONBody({"id": body.id, "status": result["status"], "run_at": result["run_at"]})


@router.post("/nack/batch", response_model=None, responses=answers(NackBatchResults))
async def nack_batch(body: NackBatchRequest, runtime: RuntimeDep) -> JSONBody:
    """Nack each item as /nack would, each answered on its own (`ok`, or a `code` such as lease_lost)."""
    return JSONBody({"results": await service.nack_batch(runtime, body.items)})


@router.post("/release", response_model=None, responses=answers(BatchResults))
async def release(body: ReleaseRequest, runtime: RuntimeDep) -> JSONBody:
    """Give leased jobs back without counting the attempt: pending again at once, for another worker, or
    after an item's `delay` (a durable sleep: no worker is held while the job sleeps).

    For jobs a worker leased but will not start (it took too many, or it is stopping), and for a handler
    that sleeps. Fenced like ack: only the current lease token releases a running job; others get
    `lease_lost` in their result."""
    return JSONBody({"results": await service.release_to_sleep(runtime, body.items)})


@router.post("/extend", response_model=None, responses=answers(ExtendResponse, 404, 409, 413))
async def extend(body: ExtendRequest, db: DB) -> JSONBody:
    """Set the lease's deadline to now + visibility_timeout (at most 12 h per call), and the job's
    `progress` when given (to report progress alone, give the lease's visibility_timeout again)."""
    return JSONBody(
        await service.extend(db, body.id, body.lease_token, body.visibility_timeout, body.progress)
    )
