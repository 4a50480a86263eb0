"""The workflows' pages (the list, a workflow with its graph) and their buttons: cancel a running workflow,
retry a failed one (app/service/workflows.py, as DELETE /workflows/{id} and POST /workflows/{id}/retry).

As in the API (app/http/routers/workflows.py), a token limited to some queues sees and acts on a workflow
only when every job of it is in its queues: any other is not found."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Request, Response

from app.core.access import Role
from app.core.errors import NotFound
from app.core.limits import MAX_JOB_ID, NO_NUL
from app.core.states import WorkflowStatus
from app.http.auth import Caller
from app.http.deps import RuntimeDep
from app.http.problems import status_of
from app.service import workflows
from app.ui import pages
from app.ui.routes.common import Flash, JobIdPath, Next, button_router, html, page_router, pressed

WORKFLOWS_PAGE_SIZE = 50
# The list's status filter: one of the statuses, or empty (the picker's "any status").
ANY_STATUS = f"^(|{'|'.join(WorkflowStatus)})$"
MAX_NAME = 128  # as GET /workflows takes it

viewed = page_router()


@viewed.get("/workflows", response_model=None)
async def workflows_page(
    request: Request,
    runtime: RuntimeDep,
    caller: Caller,
    status: Annotated[str | None, Query(pattern=ANY_STATUS)] = None,
    name: Annotated[str | None, Query(pattern=NO_NUL, max_length=MAX_NAME)] = None,
    before_id: Annotated[int | None, Query(ge=1, le=MAX_JOB_ID)] = None,
    flash: Flash = None,
) -> Response:
    """Workflows newest first, by status and name (the form's empty fields are no filter); for a token
    limited to some queues, those whose jobs are all in them."""
    filters = {"status": status or None, "name": name or None}
    page = await workflows.list_workflows(
        runtime.db,
        filters["status"],
        filters["name"],
        WORKFLOWS_PAGE_SIZE,
        before_id or MAX_JOB_ID + 1,
        caller.like,
    )
    return html(request, pages.workflows_page(page, filters=filters, flash=flash))


@viewed.get("/workflows/{id}", response_model=None)
async def workflow_page(
    id: JobIdPath, request: Request, runtime: RuntimeDep, caller: Caller, flash: Flash = None
) -> Response:
    try:
        workflow = await workflows.visible_workflow(runtime, id, caller)
    except NotFound as exc:
        return html(request, pages.not_found_page(exc.detail), status=status_of(exc))
    return html(request, pages.workflow_page(workflow, flash=flash, actions=caller.has(Role.ADMIN)))


buttons = button_router()


@buttons.post("/workflows/{id}/cancel", response_model=None)
async def cancel_workflow(
    id: JobIdPath, runtime: RuntimeDep, caller: Caller, next: Next = "/ui/workflows"
) -> Response:
    async def cancel() -> None:
        await workflows.cancel_workflow(runtime, await workflows.visible_workflow(runtime, id, caller))

    done = f"Cancelled workflow {id}: its waiting and pending jobs will not run; running ones finish."
    return await pressed(next, cancel(), done)


@buttons.post("/workflows/{id}/retry", response_model=None)
async def retry_workflow(
    id: JobIdPath, runtime: RuntimeDep, caller: Caller, next: Next = "/ui/workflows"
) -> Response:
    async def retry() -> None:
        await workflows.retry_workflow(runtime, await workflows.visible_workflow(runtime, id, caller))

    done = f"Retried workflow {id}: its dead jobs are pending again, the jobs they cancelled wait again."
    return await pressed(next, retry(), done)
