"""References served over HTTP, by uvicorn like jobq (httptools, uvloop), against the same database.

- Single enqueue: a bare FastAPI endpoint of the same shape as `POST /jobs` (a JSON body validated by
  pydantic, one INSERT through an asyncpg pool, acquired once, no reset query on release, a JSON answer).
- Batch enqueue, the floor under any Python service: `POST /jobs/batch` answered by a bare ASGI callable
  with no framework and no checks. It reads the body with orjson, runs the raw reference's
  `INSERT ... unnest` (bench/raw.py; here it also returns the timestamps the answer needs) and answers
  each job with the fields jobq answers, so the answer is as large; what it costs above the raw insert
  is what HTTP, JSON and Python cost alone.

Run: JOBQ_DATABASE_URL=... uvicorn bench.bare_app:app
"""

from __future__ import annotations

import os
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import orjson
from fastapi import FastAPI
from pydantic import BaseModel

INSERT = "INSERT INTO jobq.jobs (queue, payload) VALUES ($1, $2::jsonb) RETURNING id, status, created_at"


class Job(BaseModel):
    queue: str
    payload: Any


async def no_reset(conn: asyncpg.Connection) -> None:
    pass


@asynccontextmanager
async def lifespan(app: FastAPI):
    app.state.pool = await asyncpg.create_pool(
        os.environ["JOBQ_DATABASE_URL"], min_size=10, max_size=10, reset=no_reset
    )
    yield
    await app.state.pool.close()


api = FastAPI(lifespan=lifespan)


@api.post("/jobs", status_code=201)
async def enqueue(job: Job) -> dict:
    import json

    async with api.state.pool.acquire() as conn:
        row = await conn.fetchrow(INSERT, job.queue, json.dumps(job.payload))
    return {"id": row["id"], "queue": job.queue, "status": row["status"], "created_at": row["created_at"]}


INSERT_MANY = (
    "INSERT INTO jobq.jobs (queue, payload) SELECT $1, p::jsonb FROM unnest($2::text[]) AS p"
    " RETURNING id, run_at, created_at"
)


async def enqueue_batch(receive: Any, send: Any) -> None:
    """The floor: one queue per batch assumed, nothing checked."""
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    jobs = orjson.loads(b"".join(chunks))["jobs"]
    queue = jobs[0]["queue"]
    payloads = [orjson.dumps(job["payload"]).decode() for job in jobs]
    async with api.state.pool.acquire() as conn:
        rows = await conn.fetch(INSERT_MANY, queue, payloads)
    answer = orjson.dumps(
        {
            "jobs": [
                {
                    "id": row["id"],
                    "queue": queue,
                    "kind": None,
                    "key": None,
                    "status": "pending",
                    "priority": 0,
                    "payload": orjson.Fragment(payload),
                    "attempts": 0,
                    "max_attempts": 25,
                    "run_at": row["run_at"],
                    "created_at": row["created_at"],
                    "updated_at": row["created_at"],
                    "lease_expires_at": None,
                    "worker_id": None,
                    "last_error": None,
                    "dedup_key": None,
                    "result": None,
                    "completed_at": None,
                    "traceparent": None,
                    "tracestate": None,
                    "duplicate": False,
                }
                for row, payload in zip(rows, payloads, strict=True)
            ]
        }
    )
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]
    await send({"type": "http.response.start", "status": 201, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


async def app(scope: dict, receive: Any, send: Any) -> None:
    if scope["type"] == "http" and scope["path"] == "/jobs/batch":
        return await enqueue_batch(receive, send)
    await api(scope, receive, send)
