"""The queues' pages (the queues, a queue, its keys) and their buttons: pause, resume, retry a queue's
dead jobs, save a queue's settings.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import Query, Request, Response
from pydantic import ValidationError

from app import service
from app.core.access import Role
from app.core.errors import NotFound
from app.http.auth import Caller
from app.http.deps import DB, RuntimeDep
from app.http.problems import status_of
from app.http.schemas import QueueSettingsPatch
from app.service import flow
from app.ui import pages
from app.ui.routes.common import Flash, Next, QueuePath, back, button_router, html, page_router, read_form

viewed = page_router()


@viewed.get("", response_model=None)
async def queues_page(db: DB, request: Request, caller: Caller, flash: Flash = None) -> Response:
    metrics = request.app.state.metrics
    # The metrics' query, not GET /queues': it reads only waiting, running and dead jobs, so a page
    # that refreshes itself every few seconds stays cheap however many completed jobs are kept.
    rows = [row for row in await service.queue_gauges(db) if caller.admits(row["queue"])]
    completed = await service.completed_lately(db, caller.like)
    return html(
        request,
        pages.queues_page(
            rows,
            metrics.throughput(),
            metrics.gauges,
            completed=completed,
            flash=flash,
            actions=caller.has(Role.ADMIN),
        ),
    )


@viewed.get("/queues/{queue}", response_model=None)
async def queue_page(
    queue: QueuePath,
    db: DB,
    request: Request,
    caller: Caller,
    span: Annotated[str, Query(pattern="^(1h|1d|7d)$")] = "1h",
    flash: Flash = None,
) -> Response:
    caller.admit(queue)
    try:
        row = await service.queue(db, queue)
    except NotFound as exc:
        return html(request, pages.not_found_page(exc.detail), status=status_of(exc))
    row["cancelled"] = await service.queue_cancelled(db, queue)
    charts = pages.queue_charts(queue, await service.rollup_series(db, queue, span), span, datetime.now(UTC))
    return html(request, pages.queue_page(row, charts=charts, flash=flash, actions=caller.has(Role.ADMIN)))


@viewed.get("/queues/{queue}/keys", response_model=None)
async def keys_page(queue: QueuePath, db: DB, request: Request, caller: Caller) -> Response:
    caller.admit(queue)
    row = next((r for r in await service.queue_gauges(db) if r["queue"] == queue), None)
    keys = await flow.list_keys(db, queue, pages.KEYS_SHOWN)
    return html(request, pages.keys_page(queue, pages.limits_text(row) if row else "", keys))


buttons = button_router()


@buttons.post("/queues/{queue}/pause", response_model=None)
async def pause(queue: QueuePath, db: DB, caller: Caller, next: Next = "/ui") -> Response:
    caller.admit(queue)
    await service.set_paused(db, queue, True)
    return back(next, f"Paused {queue}: it leases nothing until resumed.")


@buttons.post("/queues/{queue}/resume", response_model=None)
async def resume(queue: QueuePath, db: DB, caller: Caller, next: Next = "/ui") -> Response:
    caller.admit(queue)
    await service.set_paused(db, queue, False)
    return back(next, f"Resumed {queue}.")


@buttons.post("/queues/{queue}/retry-dead", response_model=None)
async def retry_queue(queue: QueuePath, db: DB, caller: Caller, next: Next = "/ui") -> Response:
    caller.admit(queue)
    result = await service.retry_dead(db, None, queue)
    kept = len(result["skipped"])
    skipped = f"; {kept} kept dead (dedup_key held by an active job)" if kept else ""
    return back(next, f"Retried {result['retried']} dead jobs of {queue}{skipped}.")


def _rate(fields: dict[str, str], name: str) -> dict[str, float] | None:
    """A rate from the settings form's two fields (`{name}_limit` per `{name}_period` seconds); None
    when the limit is left empty. ValueError for text that is not a number."""
    limit = fields.get(f"{name}_limit", "").strip()
    if not limit:
        return None
    return {"limit": int(limit), "period": float(fields.get(f"{name}_period", "").strip())}


@buttons.post("/queues/{queue}/settings", response_model=None)
async def configure_queue(
    queue: QueuePath, request: Request, runtime: RuntimeDep, caller: Caller, next: Next = "/ui"
) -> Response:
    """The queue page's settings form: a field left empty keeps its setting (Jobs per key at once: no
    limit); a number the API would refuse is refused with its reason."""
    caller.admit(queue)
    fields = dict(await read_form(request))
    try:
        current = (await service.queue(runtime.db, queue))["settings"]
    except NotFound:  # saving creates it, as PATCH /queues/{queue} does
        current = {}
    patch: dict[str, object] = {}
    try:
        for name, _, _ in pages.SETTINGS:
            text = fields.get(name, "").strip()
            if text:
                patch[name] = int(text) if name == "max_attempts" else float(text)
        concurrency_text = fields.get("key_concurrency", "").strip()
        concurrency = int(concurrency_text) if concurrency_text else None
        rates = {name: _rate(fields, name) for name in ("rate", "key_rate")}
    except ValueError:
        return back(next, "Settings not saved: each must be a number (attempts, per key and leases: whole).")
    if concurrency != current.get("key_concurrency"):
        patch["key_concurrency"] = concurrency
    for name, rate in rates.items():
        if rate != current.get(name):
            patch[name] = rate
    fair = fields.get("fair") == "on"
    if fair != bool(current.get("fair")):
        patch["fair"] = fair
    try:
        settings = QueueSettingsPatch.model_validate(patch)
    except ValidationError as exc:
        reasons = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        return back(next, f"Settings not saved: {reasons}.")
    await service.configure_queue(runtime, queue, settings)
    return back(next, f"Saved the settings of {queue}.")
