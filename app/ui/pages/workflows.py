"""Workflows (API part 6): the list, newest first, by status and name; and a workflow's page: its status,
counts, times, Cancel and Retry where they apply, its graph (app/ui/graph.py) and its jobs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from app.core.states import JobStatus, WorkflowStatus
from app.ui.graph import workflow_graph
from app.ui.pages.layout import button, esc, layout, select, shorten, text_input, url, when

WORKFLOW_STATUSES = tuple(WorkflowStatus)
PARENTS_LISTED = 10  # of a job's parents, in the jobs table (its page lists them all)
NAME_CHARS = 80  # of a workflow's name in the list (its page has all of it)


def workflow_title(workflow: Mapping[str, Any]) -> str:
    name = workflow["name"]
    return f"Workflow {workflow['id']}" + (f": {name}" if name else "")


def _status(status: str) -> str:
    return f'<span class="status {esc(status)}">{esc(status)}</span>'


def workflows_page(
    page: Mapping[str, Any], *, filters: Mapping[str, str | None], flash: str | None = None
) -> str:
    """Workflows newest first, with a status and name filter and a link to the older ones."""
    picker = (
        '<form class="filter" action="/ui/workflows" method="get">'
        + select("status", "Status", filters.get("status"), WORKFLOW_STATUSES, "any status")
        + " "
        + text_input("name", "Name", filters.get("name"), 20)
        + " <button>Show</button></form>"
    )
    rows = []
    for workflow in page["workflows"]:
        workflow_id = workflow["id"]
        link = f"/ui/workflows/{workflow_id}"
        name = workflow["name"]
        whole = f' title="{esc(name)}"' if name and len(name) > NAME_CHARS else ""
        named = (
            f'<a href="{link}"{whole}>{esc(shorten(name, NAME_CHARS))}</a>'
            if name
            else '<span class="meta">—</span>'
        )
        rows.append(
            f'<tr data-workflow="{workflow_id}"><th scope="row"><a href="{link}">{workflow_id}</a></th>'
            f"<td>{named}</td><td>{_status(workflow['status'])}</td>"
            f"<td>{when(workflow['created_at'])}</td><td>{when(workflow['finished_at'])}</td></tr>"
        )
    table = (
        "<table><thead><tr><th>Workflow</th><th>Name</th><th>Status</th><th>Created</th><th>Finished</th>"
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        if rows
        else '<p class="empty">No workflows match.</p>'
    )
    older = page["next_before_id"]
    more = (
        f'<p><a rel="next" href="{esc(url("/ui/workflows", **filters, before_id=older))}">Older →</a></p>'
        if older
        else ""
    )
    note = (
        '<p class="meta">Newest first; the name is matched whole. A running workflow\'s status is brought '
        "up to date when it is read, and by the service every few seconds.</p>"
    )
    return layout("Workflows", f"<h1>Workflows</h1>{picker}{table}{more}{note}", flash=flash)


def _counts(counts: Mapping[str, int]) -> str:
    """Jobs per status, in the state machine's order."""
    order = [s for s in JobStatus if s in counts] + sorted(s for s in counts if s not in set(JobStatus))
    return " · ".join(f"{_status(s)} {counts[s]}" for s in order) or "—"


def _parents_cell(parents: Iterable[Any]) -> str:
    """A job's parents in the jobs table: the refs of its siblings, and ids (linked) of jobs outside the
    workflow; the first PARENTS_LISTED."""
    listed = list(parents)
    shown = [
        f'<a href="/ui/jobs/{p}">job {p}</a>' if isinstance(p, int) else f"<code>{esc(p)}</code>"
        for p in listed[:PARENTS_LISTED]
    ]
    if len(listed) > PARENTS_LISTED:
        shown.append(f'<span class="meta">and {len(listed) - PARENTS_LISTED} more</span>')
    return ", ".join(shown) or "—"


def workflow_page(workflow: Mapping[str, Any], *, flash: str | None = None, actions: bool = True) -> str:
    """A workflow: its fields, Cancel (running) and Retry (failed), its graph and its jobs."""
    workflow_id = workflow["id"]
    here = f"/ui/workflows/{workflow_id}"
    status = workflow["status"]
    jobs = workflow["jobs"]
    fields = [
        ("Name", esc(workflow["name"]) if workflow["name"] else "—"),
        ("Status", _status(status)),
        ("Jobs", f"{len(jobs)}: {_counts(workflow['counts'])}"),
        ("Created", when(workflow["created_at"])),
        ("Finished", when(workflow["finished_at"])),
    ]
    table = "".join(f"<tr><th>{name}</th><td>{value}</td></tr>" for name, value in fields)
    pressed = []
    if actions and status == WorkflowStatus.FAILED:
        pressed.append(button(f"{here}/retry", "Retry", back=here))
    if actions and status == WorkflowStatus.RUNNING:
        confirm = f"Cancel workflow {workflow_id}? Its waiting and pending jobs will not run."
        pressed.append(button(f"{here}/cancel", "Cancel", back=here, confirm=confirm, danger=True))
    buttons = f'<div class="actions">{"".join(pressed)}</div>' if pressed else ""
    explained = {
        WorkflowStatus.FAILED: "A job is dead, or a parent's end cancelled it. Retry resumes the workflow "
        "where it failed: its dead jobs run again, and the jobs their end cancelled wait again.",
        WorkflowStatus.RUNNING: "Cancel stops its waiting and pending jobs; running ones finish, and their "
        "children are cancelled.",
    }.get(status, "")
    about = f'<p class="meta">{esc(explained)}</p>' if explained and pressed else ""
    rows = "".join(
        f'<tr data-job="{job["id"]}"><td><code>{esc(job["ref"])}</code></td>'
        f'<th scope="row"><a href="/ui/jobs/{job["id"]}">{job["id"]}</a></th>'
        f'<td><a href="/ui/queues/{esc(job["queue"])}">{esc(job["queue"])}</a></td>'
        f"<td>{esc(job['kind'] or '')}</td><td>{_status(job['status'])}</td>"
        f"<td>{_parents_cell(job['depends_on'])}</td></tr>"
        for job in jobs
    )
    listing = (
        "<table><thead><tr><th>Ref</th><th>Job</th><th>Queue</th><th>Kind</th><th>Status</th>"
        f"<th>Parents</th></tr></thead><tbody>{rows}</tbody></table>"
        if jobs
        else '<p class="empty">Its jobs are gone (pruned by their queues\' retention).</p>'
    )
    graph = f"<h2>Graph</h2>{workflow_graph(jobs)}" if jobs else ""
    body = (
        f"<h1>{esc(workflow_title(workflow))}</h1>{buttons}{about}"
        f'<table class="fields">{table}</table>{graph}<h2>Jobs</h2>{listing}'
    )
    return layout(workflow_title(workflow), body, flash=flash, refresh=status == WorkflowStatus.RUNNING)
