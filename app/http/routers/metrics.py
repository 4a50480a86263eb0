"""GET /metrics: Prometheus text format (see app/telemetry/metrics.py for what is in it). With tokens
configured, a viewer's token (or an admin's), not limited to some queues: the metrics cover every queue.
Prometheus sends it with `authorization: {credentials: ...}` in its scrape config."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from app.http.auth import Caller, Viewer
from app.http.deps import problems
from app.http.openapi import operation_id
from app.telemetry.metrics import CONTENT_TYPE_LATEST

router = APIRouter(
    tags=["health"],
    dependencies=[Viewer],
    generate_unique_id_function=operation_id,
)


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"description": "Prometheus text format", "content": {"text/plain": {}}},
        **problems(401, 403),
    },
)
async def metrics(request: Request, caller: Caller) -> Response:
    """Counters and histograms of this process; gauges from the database as of the last refresh
    (every `JOBQ_METRICS_INTERVAL` seconds, never per scrape)."""
    caller.unscoped("/metrics")
    return Response(request.app.state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
