"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter

from app import jobs
from app.deps import DB, answers
from app.errors import DATABASE_UNAVAILABLE, problem
from app.migrations import head_revision
from app.schemas import Health, Readiness
from app.web import JobqRoute, JSONBody

router = APIRouter(tags=["health"], route_class=JobqRoute, default_response_class=JSONBody)


@router.get("/healthz", response_model=None, responses=answers(Health, auth=False))
async def healthz() -> JSONBody:
    """The process is up (it does not touch the database)."""
    return JSONBody({"status": "ok"})


@router.get("/readyz", response_model=None, responses=answers(Readiness, auth=False))
async def readyz(db: DB):
    """Ready when the database answers and its schema is at the latest migration; else 503."""
    expected = head_revision()
    try:
        revision = await jobs.schema_revision(db)
    except DATABASE_UNAVAILABLE:
        return problem(
            503,
            "unavailable",
            "the database is unreachable",
            ready=False,
            database=False,
            schema_revision=None,
            expected_revision=expected,
        )
    if revision != expected:
        return problem(
            503,
            "unavailable",
            f"schema at {revision}, expected {expected}; run `jobq migrate`",
            ready=False,
            database=True,
            schema_revision=revision,
            expected_revision=expected,
        )
    return JSONBody(
        {"ready": True, "database": True, "schema_revision": revision, "expected_revision": expected}
    )
