"""Liveness and readiness."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter

from app import service
from app.core.errors import DATABASE_UNAVAILABLE
from app.db.migrations import compatibility, head_revision
from app.http.deps import RuntimeDep, Unready, answers, problems
from app.http.fastpath.route import JobqRoute
from app.http.openapi import operation_id
from app.http.problems import problem
from app.http.schemas import Health, Readiness
from app.http.web import JSONBody
from app.telemetry.metrics import QueueGauges, holding_back

router = APIRouter(
    tags=["health"],
    route_class=JobqRoute,
    default_response_class=JSONBody,
    generate_unique_id_function=operation_id,
)


def database_health(gauges: QueueGauges) -> dict[str, Any]:
    """What the metrics' last refresh read of what holds back vacuum, and of the jobs table."""
    oldest = gauges.health.oldest
    return {
        "as_of": datetime.fromtimestamp(gauges.at, UTC).isoformat() if gauges.at else None,
        "oldest_snapshot": oldest,
        "holding_back": oldest is not None and holding_back(oldest),
        "jobs_table": gauges.health.table,
    }


@router.get("/healthz", response_model=None, responses={200: {"model": Health}})
async def healthz() -> JSONBody:
    """The process is up (it does not touch the database)."""
    return JSONBody({"status": "ok"})


@router.get(
    "/readyz", response_model=None, responses=answers(Readiness, auth=False) | problems(503, model=Unready)
)
async def readyz(runtime: RuntimeDep):
    """Ready when the database answers and this build can run on its schema: at this build's head, or
    at a newer revision whose recorded `compatible_from` is this build's head or older (a rolling
    upgrade, or a rollback of the code). Else 503, saying why and what to do. `database_health`, as of
    the last metrics refresh, names what holds back vacuum: a detail, never a reason to be unready."""
    expected = head_revision()
    try:
        revision, floor = await service.schema_revision(runtime.db)
    except DATABASE_UNAVAILABLE:
        return problem(
            503,
            "unavailable",
            "the database is unreachable",
            ready=False,
            database=False,
            schema_revision=None,
            expected_revision=expected,
            compatible=None,
            compatible_from=None,
        )
    verdict = compatibility(revision, floor)
    body = {
        "database": True,
        "schema_revision": revision,
        "expected_revision": expected,
        "compatible": verdict.ready,
        "compatible_from": verdict.compatible_from,
        "database_health": database_health(runtime.metrics.gauges),
    }
    if not verdict.ready:
        return problem(503, "unavailable", verdict.detail, ready=False, **body)
    return JSONBody({"ready": True, **body})
