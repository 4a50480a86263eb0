"""Workflows (API part 6): jobs made together, all or nothing, each named by a `ref` that its siblings give
as parents; read with their status, waited for, listed, cancelled and resumed.

A workflow's status is its jobs' (app/core/states.py, workflow_status): nothing counts them as they end,
so no ack waits for another on a workflow's row. Whoever reads a workflow works its status out and keeps
it on the row when it changed (SET_WORKFLOW_STATUS, which one replica wins: that one counts it in the
metrics); the background loop does the same for running workflows nobody reads (refresh_running), so
lists and their filters catch up within its interval. A waiter (`?wait`) is woken by the end of any of
the workflow's jobs (jobq.job_ending() notifies `w<id>` on DONE_CHANNEL) and reads it again.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime

import asyncpg
import orjson

from app.core.access import Grant
from app.core.errors import Conflict, Invalid, NotFound
from app.core.jsontext import WRITE_OPTIONS, JSONText
from app.core.states import WorkflowStatus, workflow_status
from app.db import sql as q
from app.db.pool import Database
from app.service.arguments import NewJob, WorkflowJobLike
from app.service.idempotency import Once, claim, keep
from app.service.inserts import encode_payloads, insert_waiting, linked
from app.service.rows import Row, Scope
from app.service.runtime import Runtime
from app.service.upkeep import prune_in_batches

FINISHED = frozenset({WorkflowStatus.COMPLETED, WorkflowStatus.FAILED, WorkflowStatus.CANCELLED})


# --- making one -------------------------------------------------------------------------------------


def check_graph(jobs: Sequence[WorkflowJobLike]) -> None:
    """Invalid, naming them, for a ref used twice, a parent ref that is no job's, or a cycle."""
    seen: dict[str, int] = {}
    for i, job in enumerate(jobs):
        if job.ref in seen:
            first = seen[job.ref]
            raise Invalid(
                f"jobs[{i}].ref {job.ref!r} is used twice (also jobs[{first}]): each ref names one job"
            )
        seen[job.ref] = i
    unknown = sorted(
        {p for job in jobs for p in job.depends_on or () if isinstance(p, str) and p not in seen}
    )
    if unknown:
        raise Invalid(
            f"depends_on names refs that are no job of the workflow: {', '.join(map(repr, unknown))}"
        )
    cycle = _cycle({job.ref: [p for p in job.depends_on or () if isinstance(p, str)] for job in jobs})
    if cycle:
        raise Invalid(f"depends_on makes a cycle: {' -> '.join(map(repr, cycle))}")


def _cycle(parents: dict[str, list[str]]) -> list[str] | None:
    """A cycle among the refs (each ref's parents given), as the refs along it, first one repeated at
    the end; None when there is none. Depth first, without recursion (a chain may be 1,000 long)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in parents:
        if start in state:
            continue
        path, stack = [start], [iter(parents[start])]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(parents[nxt]))
    return None


def _digest(name: str | None, jobs: Sequence[WorkflowJobLike], payloads: list[str]) -> bytes:
    """What a request sent again under its Idempotency-Key must match: every field of every job."""
    fields = [
        "/workflows",
        name,
        [
            [
                j.ref,
                j.queue,
                p,
                j.priority,
                j.run_at,
                j.delay,
                j.max_attempts,
                j.kind,
                j.key,
                j.depends_on,
                j.run_if,
            ]
            for j, p in zip(jobs, payloads, strict=True)
        ],
    ]
    return hashlib.sha256(orjson.dumps(fields, option=orjson.OPT_PASSTHROUGH_DATETIME, default=str)).digest()


async def create_workflow(
    runtime: Runtime,
    name: str | None,
    jobs: Sequence[WorkflowJobLike],
    once: Once | None = None,
    scope: Scope = None,
) -> JSONText:
    """Make the workflow, all or nothing: its jobs inserted with ids drawn first, each job's refs turned
    into its siblings' ids, and linked to their parents (which decides at once the jobs whose parents had
    all ended). The answer as JSON text: the kept one for a request sent again under its Idempotency-Key
    (nothing made then). Parents named by id must be in `scope`, the queues of the caller's token."""
    check_graph(jobs)
    payloads = encode_payloads(jobs, runtime.settings.max_payload_bytes)
    digest = _digest(name, jobs, payloads) if once is not None else b""

    async def make(conn: asyncpg.Connection) -> tuple[bytes, bool]:
        if once is not None:
            kept = await claim(conn, once, digest, runtime.settings.idempotency_ttl)
            if kept is not None:
                return kept, True
        workflow_id, answer = await _make(conn, name, jobs, payloads, scope)
        if once is not None:
            await keep(conn, once, answer.decode(), [workflow_id])
        return answer, False

    answer, replayed = await linked(runtime.db, make)
    if not replayed:
        runtime.metrics.workflows_started.inc()
    return JSONText(answer)


async def _make(
    conn: asyncpg.Connection,
    name: str | None,
    jobs: Sequence[WorkflowJobLike],
    payloads: list[str],
    scope: Scope,
) -> tuple[int, bytes]:
    """Insert the workflow and its jobs; its id, and the answer as JSON."""
    ids = [row["id"] for row in await conn.fetch(q.DRAW_JOB_IDS.text, *q.DRAW_JOB_IDS.args(n=len(jobs)))]
    by_ref = {job.ref: job_id for job, job_id in zip(jobs, ids, strict=True)}
    made = await conn.fetchrow(
        q.NEW_WORKFLOW.text,
        *q.NEW_WORKFLOW.args(name=name, refs=[job.ref for job in jobs], job_ids=ids),
    )
    requests = [
        NewJob(
            queue=job.queue,
            payload=job.payload,
            priority=job.priority,
            run_at=job.run_at,
            delay=job.delay,
            max_attempts=job.max_attempts,
            kind=job.kind,
            key=job.key,
            traceparent=job.traceparent,
            tracestate=job.tracestate,
            depends_on=None
            if not job.depends_on
            else [p if isinstance(p, int) else by_ref[p] for p in job.depends_on],
            run_if=job.run_if,
        )
        for job in jobs
    ]
    rows = await insert_waiting(conn, requests, payloads, workflow_id=made["id"], ids=ids, scope=scope)
    status = workflow_status(row["status"] for row in rows)
    return made["id"], orjson.dumps(
        {
            "id": made["id"],
            "name": made["name"],
            "status": status,
            "created_at": made["created_at"],
            "jobs": [
                {"ref": job.ref, "id": row["id"], "status": row["status"]}
                for job, row in zip(jobs, rows, strict=True)
            ],
        },
        option=WRITE_OPTIONS,
    )


# --- reading ---------------------------------------------------------------------------------------


async def get_workflow(runtime: Runtime, workflow_id: int) -> Row:
    """The workflow with its jobs as they are now, its status worked out from them (and kept on its row
    when it changed); NotFound when there is no such workflow."""
    async with runtime.db.acquire() as conn:
        read = await _read(runtime, conn, workflow_id)
    if read is None:
        raise NotFound(f"workflow {workflow_id} does not exist")
    workflow, jobs, status, finished_at = read
    ref_of = dict(zip(workflow["job_ids"], workflow["refs"], strict=True))
    counts: dict[str, int] = {}
    for job in jobs:
        counts[job["status"]] = counts.get(job["status"], 0) + 1
    by_id = {job["id"]: job for job in jobs}
    return {
        "id": workflow["id"],
        "name": workflow["name"],
        "status": status,
        "created_at": workflow["created_at"],
        "finished_at": finished_at,
        "counts": counts,
        "jobs": [
            {
                "ref": ref_of[job_id],
                "id": job_id,
                "queue": by_id[job_id]["queue"],
                "kind": by_id[job_id]["kind"],
                "status": by_id[job_id]["status"],
                "depends_on": [ref_of.get(p, p) for p in by_id[job_id]["depends_on"] or ()],
            }
            for job_id in workflow["job_ids"]
            if job_id in by_id  # a job pruned by its queue's retention is gone
        ],
    }


async def visible_workflow(runtime: Runtime, workflow_id: int, caller: Grant) -> Row:
    """get_workflow for a caller: NotFound, as for none, when a job of it is outside the caller's queues.
    A workflow is seen whole or not at all, as GET /workflows lists it."""
    workflow = await get_workflow(runtime, workflow_id)
    if caller.queues is not None and not all(caller.admits(job["queue"]) for job in workflow["jobs"]):
        raise NotFound(f"workflow {workflow_id} does not exist")
    return workflow


async def _read(
    runtime: Runtime, conn: asyncpg.Connection, workflow_id: int
) -> tuple[asyncpg.Record, list[asyncpg.Record], str, datetime | None] | None:
    """The workflow's row, its jobs, and its status and finish worked out from them (_settle); None when
    there is no such workflow."""
    workflow = await conn.fetchrow(q.GET_WORKFLOW.text, *q.GET_WORKFLOW.args(id=workflow_id))
    if workflow is None:
        return None
    jobs = await conn.fetch(q.WORKFLOW_JOBS.text, *q.WORKFLOW_JOBS.args(id=workflow_id))
    status, finished_at = await _settle(runtime, conn, workflow, jobs)
    return workflow, jobs, status, finished_at


async def _settle(
    runtime: Runtime, conn: asyncpg.Connection, workflow: asyncpg.Record, jobs: Sequence[asyncpg.Record]
) -> tuple[str, datetime | None]:
    """The workflow's status from its jobs, kept on its row when it changed; counted in the metrics by
    the reader whose write changed it to a final status."""
    stored = workflow["status"]
    status = workflow_status((job["status"] for job in jobs), cancelled=stored == WorkflowStatus.CANCELLED)
    if status == stored:
        return status, workflow["finished_at"]
    finished_at = max((job["ended_at"] for job in jobs), default=None) if status in FINISHED else None
    changed = await conn.fetchrow(
        q.SET_WORKFLOW_STATUS.text,
        *q.SET_WORKFLOW_STATUS.args(id=workflow["id"], status=status, finished_at=finished_at),
    )
    if changed is not None and status in FINISHED:
        runtime.metrics.workflows_finished.labels(status).inc()
    return status, finished_at


async def wait_for_workflow(
    runtime: Runtime,
    workflow_id: int,
    wait: float,
    disconnected: Callable[[], Awaitable[object]] | None = None,
) -> Row:
    """The workflow once it has finished, or as it is when `wait` seconds pass (or its client goes):
    woken by the end of any of its jobs, on whichever replica, never by polling."""
    wakeups = runtime.wakeups
    deadline = time.monotonic() + wait
    with wakeups.long_poll():
        gone = asyncio.ensure_future(disconnected()) if disconnected is not None else None
        try:
            while True:
                with wakeups.watching(f"w{workflow_id}") as waiter:
                    workflow = await get_workflow(runtime, workflow_id)
                    remaining = deadline - time.monotonic()
                    if workflow["status"] in FINISHED or remaining <= 0 or wakeups.closing:
                        return workflow
                    await waiter.wait(remaining, gone)
                    if gone is not None and gone.done():
                        return workflow
        finally:
            if gone is not None:
                gone.cancel()


async def list_workflows(
    db: Database, status: str | None, name: str | None, limit: int, before_id: int, scope: Scope = None
) -> Row:
    """A page of workflows newest first, by their kept status (brought up to date by readers and the
    background loop), and the before_id of the next page; with `scope`, those whose jobs are all in it."""
    async with db.acquire() as conn:
        args = q.LIST_WORKFLOWS.args(
            status=status, name=name, limit=limit + 1, before_id=before_id, scope=scope
        )
        rows = await conn.fetch(q.LIST_WORKFLOWS.text, *args)
    page = [dict(row) for row in rows[:limit]]
    return {"workflows": page, "next_before_id": page[-1]["id"] if len(rows) > limit else None}


async def prune_workflows(db: Database) -> int:
    """Forget workflows whose jobs are all gone (pruned with their queues' retention), in bounded batches;
    how many went. GET /workflows/{id} is then 404, as for its jobs."""
    return await prune_in_batches(db, q.PRUNE_WORKFLOWS)


async def refresh_running(runtime: Runtime, batch: int = 200) -> int:
    """Bring the kept status of running workflows up to date, a batch at a time; how many finished."""
    finished, after = 0, 0
    while True:
        async with runtime.db.acquire() as conn:
            ids = [
                r["id"]
                for r in await conn.fetch(
                    q.RUNNING_WORKFLOWS.text, *q.RUNNING_WORKFLOWS.args(after_id=after, limit=batch)
                )
            ]
            for workflow_id in ids:
                read = await _read(runtime, conn, workflow_id)
                finished += read is not None and read[2] in FINISHED
        if len(ids) < batch:
            return finished
        after = ids[-1]


# --- acting on one ---------------------------------------------------------------------------------


async def cancel_workflow(runtime: Runtime, workflow: Row) -> Row:
    """Cancel a running workflow (as get_workflow read it): its waiting and pending jobs cancelled
    (running ones finish; their children are among the waiting), and it is marked cancelled. Conflict for
    one that has finished, as DELETE /jobs/{id} is for a finished job: its status stays what its jobs
    made it, and a failed one can still be retried. The workflow as it is then."""
    workflow_id = workflow["id"]
    async with runtime.db.acquire() as conn:
        async with conn.transaction():
            marked = await conn.fetchval(q.MARK_CANCELLED.text, *q.MARK_CANCELLED.args(id=workflow_id))
            if marked is None:
                status = workflow["status"]
                raise Conflict(f"workflow {workflow_id} is {status}; only a running one can be cancelled")
            await conn.execute(
                q.CANCEL_WORKFLOW_JOBS.text, *q.CANCEL_WORKFLOW_JOBS.args(id=workflow_id, scope=None)
            )
    runtime.metrics.workflows_finished.labels(WorkflowStatus.CANCELLED).inc()
    return await get_workflow(runtime, workflow_id)


async def retry_workflow(runtime: Runtime, workflow: Row) -> Row:
    """Resume a failed workflow (as get_workflow read it) where it failed (jobq.retry_workflow());
    Conflict for one that is not failed. The workflow as it is then."""
    workflow_id = workflow["id"]
    if workflow["status"] != WorkflowStatus.FAILED:
        raise Conflict(
            f"workflow {workflow_id} is {workflow['status']}; only a failed workflow can be retried"
        )
    async with runtime.db.acquire() as conn:
        async with conn.transaction():
            await conn.fetchval(q.RETRY_WORKFLOW.text, *q.RETRY_WORKFLOW.args(id=workflow_id))
    return await get_workflow(runtime, workflow_id)
