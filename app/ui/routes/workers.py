"""The workers' page: what each worker holds, and when it was last seen."""

from __future__ import annotations

from fastapi import Request, Response

from app import service
from app.http.auth import Caller
from app.http.deps import DB
from app.ui import pages
from app.ui.routes.common import html, page_router

viewed = page_router()


@viewed.get("/workers", response_model=None)
async def workers_page(db: DB, request: Request, caller: Caller) -> Response:
    return html(request, pages.workers_page(await service.list_workers(db, caller.like)))
