"""The jobs of any state, newest first, filtered and searched, with bulk actions on a selection or on
every job the filters match.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from app.core.states import JobStatus
from app.ui.pages.layout import (
    ERROR_CHARS,
    PREVIEW_CHARS,
    button,
    esc,
    job_state,
    layout,
    payload_text,
    select,
    shorten,
    text_input,
    url,
    when,
)

STATUSES = tuple(JobStatus)  # the status picker's choices, in the state machine's order
ALL_BOX = '<th><input type="checkbox" data-select-all aria-label="select every job shown"></th>'
# What the dashboard does to a selection of jobs, or to every job a list matches, and to which jobs
# each action applies: the others in a selection are left as they are, and said so.
BULK = {"retry": ("dead", "Retry"), "purge": ("dead", "Purge"), "cancel": ("pending", "Cancel")}


def jobs_page(
    page: Mapping[str, Any],
    *,
    filters: Mapping[str, str | None],
    queues: Iterable[str],
    here: str,
    flash: str | None = None,
    actions: bool = True,
) -> str:
    """Jobs of any state, newest first, with filters and search; checkboxes for bulk actions, and the
    same actions on every job the filters match."""
    status = filters.get("status")
    picker = (
        '<form class="filter" action="/ui/jobs" method="get">'
        + select("queue", "Queue", filters.get("queue"), queues, "all queues")
        + " "
        + select("status", "Status", status, STATUSES, "any status")
        + " "
        + text_input("kind", "Kind", filters.get("kind"))
        + " "
        + text_input("key", "Key", filters.get("key"))
        + " "
        + text_input("q", "Search", filters.get("q"), 20)
        + " <button>Show</button></form>"
    )
    shown = [action for action, (applies, _) in BULK.items() if status in (None, applies)]
    bulk = ""
    ticks = actions and bool(shown)  # checkboxes, where some action applies to the jobs listed
    if ticks and page["jobs"]:
        selected = "".join(
            f'<button name="action" value="{a}" class="{"danger" if a != "retry" else ""}"'
            f' data-confirm="{BULK[a][1]} the selected jobs?">{BULK[a][1]} selected</button> '
            for a in shown
        )
        target = esc(url("/ui/jobs/selected", next=here))
        bulk = f'<form id="selected" class="bulk" method="post" action="{target}">{selected}</form>'
        if status is not None:  # every match: only where the filter names the one status they act on
            matching = {k: v for k, v in filters.items() if v}
            for action in shown:
                label = BULK[action][1]
                bulk += button(
                    url("/ui/jobs/matching", action=action, **matching),
                    f"{label} all matching",
                    back=here,
                    confirm=f"{label} every {status} job these filters match, on every page?",
                    danger=action != "retry",
                )
    rows = []
    for job in page["jobs"]:
        job_id = job["id"]
        state = job_state(job)
        error = job["last_error"] or ""
        box = (
            f'<td><input type="checkbox" name="id" value="{job_id}" form="selected" '
            f'aria-label="select job {job_id}"></td>'
            if ticks
            else ""
        )
        rows.append(
            f'<tr data-job="{job_id}">{box}'
            f'<th scope="row"><a href="/ui/jobs/{job_id}">{job_id}</a></th>'
            f'<td><a href="/ui/queues/{esc(job["queue"])}">{esc(job["queue"])}</a></td>'
            f"<td>{esc(job['kind'] or '')}</td><td>{esc(job.get('key') or '')}</td>"
            f'<td><span class="status {esc(state)}">{esc(state)}</span></td>'
            f'<td class="num">{job["attempts"]}/{job["max_attempts"]}</td>'
            f"<td>{when(job['updated_at'])}</td>"
            f'<td class="{"error" if state == "dead" else "error earlier"}" '
            f'title="{esc(shorten(error, 2000))}">{esc(shorten(error, ERROR_CHARS))}</td>'
            f"<td><code>{esc(shorten(payload_text(job['payload']), PREVIEW_CHARS))}</code></td></tr>"
        )
    table = (
        f"<table><thead><tr>{ALL_BOX if ticks else ''}<th>Job</th><th>Queue</th><th>Kind</th>"
        "<th>Key</th><th>Status</th><th>Attempts</th><th>Updated</th><th>Error</th><th>Payload</th></tr>"
        f"</thead><tbody>{''.join(rows)}</tbody></table>"
        if rows
        else '<p class="empty">No jobs match on this page.</p>'
    )
    older = page["next_before_id"]
    more = (
        f'<p><a rel="next" href="{esc(url("/ui/jobs", **filters, before_id=older))}">Older →</a></p>'
        if older
        else ""
    )
    note = (
        '<p class="meta">Newest first. A page looks at up to 10,000 jobs of its queue and status: with a '
        "rare kind, key or search it may show few jobs, or none, and still have older ones.</p>"
    )
    title = f"Jobs in {filters['queue']}" if filters.get("queue") else "Jobs"
    return layout(title, f"<h1>{esc(title)}</h1>{picker}{bulk}{table}{more}{note}", flash=flash)
