"""The dashboard under /ui: queues (depth, lag, throughput, pause and resume) and each queue's page (its
jobs by state, its settings, editable by admins), jobs of any state (filters, search, bulk retry, purge
and cancel, of a selection or of every match), workflows (their graphs; cancel, retry), dead jobs (retry,
purge), schedules (pause, resume, trigger now), workers (what each holds, when last seen) and a job's page
(its parents and children; cancel, run now, retry, purge), rendered on the server from the same service
layer (``app.service``) the JSON API uses: a module per group of pages with their buttons, and what they
share in ``common``.

Every page and button of the dashboard is a route of a module's `viewed` (``common.page_router``) or `buttons`
(``common.button_router``), and each carries its role check: with tokens configured, the pages are for viewers
and admins, the buttons for admins only (a viewer's pages show none, and its posts are refused, 403). A caller
is known by its `Authorization: Bearer <token>` header (a script, or a proxy in front adding it), else by the
session cookie that the sign-in form gives a browser for a token (app/ui/session.py); a browser with neither
is sent to the sign-in form. A token limited to some queues (app/core/access.py) sees those queues, their jobs
and the schedules that enqueue into them only, through a session as well. The sign-in form, sign-out and the
static files need no token. Posts that a page of another site makes the browser send, the sign-in form's
included, are refused before they get here, as for every route (app/http/middleware/origin.py).
"""

from fastapi import APIRouter

from app.ui.routes import dead, jobs, queues, schedules, sign_in, static, workers, workflows

router = APIRouter(include_in_schema=False)
router.include_router(static.router)
router.include_router(sign_in.router)
for group in (queues, dead, jobs, workflows, schedules, workers):
    router.include_router(group.viewed)
for group in (queues, dead, jobs, workflows, schedules):
    router.include_router(group.buttons)
