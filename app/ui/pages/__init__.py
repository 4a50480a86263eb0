"""The dashboard's pages, as HTML strings: a module per page, each in the frame of ``layout``, which also
holds how values are written.

Every value that comes from the database or the request goes through ``esc`` (queue names are
restricted, but payloads, errors and dedup keys are anything). Buttons are small forms that POST to
the dashboard's own routes, which answer with a redirect back here (post/redirect/get); the action and
the page to come back to travel in the form's URL, so no form body needs parsing. Pages for a caller
who may not press them (a viewer: `actions=False`) have no buttons at all.
"""

from app.ui.pages.dead import dead_page
from app.ui.pages.job import RELATIVES_SHOWN, job_page
from app.ui.pages.jobs import BULK, jobs_page
from app.ui.pages.keys import KEYS_SHOWN, keys_page
from app.ui.pages.layout import limits_text, not_found_page, url, with_sign_out
from app.ui.pages.queue import SETTINGS, queue_charts, queue_page
from app.ui.pages.queues import database_health, queues_page
from app.ui.pages.schedules import schedules_page
from app.ui.pages.sign_in import sign_in_page
from app.ui.pages.workers import workers_page
from app.ui.pages.workflows import workflow_page, workflows_page

__all__ = [
    "BULK",
    "KEYS_SHOWN",
    "RELATIVES_SHOWN",
    "SETTINGS",
    "database_health",
    "dead_page",
    "job_page",
    "jobs_page",
    "keys_page",
    "limits_text",
    "not_found_page",
    "queue_charts",
    "queue_page",
    "queues_page",
    "schedules_page",
    "sign_in_page",
    "url",
    "with_sign_out",
    "workers_page",
    "workflow_page",
    "workflows_page",
]
