"""The reference for single enqueue: a bare FastAPI endpoint of the same shape as `POST /jobs` (a JSON
body validated by pydantic, one INSERT through an asyncpg pool, acquired once, no reset query on
release, a JSON answer), served by uvicorn like jobq. Run: JOBQ_DATABASE_URL=... uvicorn bench.bare_app:app
"""

from __future__ import annotations

import os
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
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


app = FastAPI(lifespan=lifespan)


@app.post("/jobs", status_code=201)
async def enqueue(job: Job) -> dict:
    import json

    async with app.state.pool.acquire() as conn:
        row = await conn.fetchrow(INSERT, job.queue, json.dumps(job.payload))
    return {"id": row["id"], "queue": job.queue, "status": row["status"], "created_at": row["created_at"]}
