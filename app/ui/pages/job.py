"""A job's page: every field, its result, progress, last error, last push delivery (API part 7) and payload,
its parents and children (API part 6) and its workflow, its recorded steps, the events that reached it and
what it waits for or until when it sleeps (API part 8), and the buttons its state allows (retry and purge a
dead job, run a scheduled or sleeping one now, cancel a pending or scheduled one, or one waiting for its
parents or an event).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from app.ui.pages.layout import (
    button,
    duration,
    esc,
    job_state,
    layout,
    outcome,
    payload_text,
    pretty_json,
    url,
    when,
)

RELATIVES_SHOWN = 100  # of a job's parents, and of its children, on its page
# What a job's run_if means, once its last parent ends.
RUN_IF = {
    "completed": "it runs once every parent completed, and is cancelled if one did not.",
    "finished": "it runs once every parent ended, however they ended.",
    "failed": "it runs once its parents ended if one is dead or cancelled, and is cancelled otherwise.",
}
# What a push delivery's outcome did to the job (app/service/push.py).
DELIVERY_OUTCOMES = {
    "completed": "a 2xx answer: the job completed",
    "failed": "the attempt counted",
    "retry_later": "the endpoint asked for it again later: the attempt not counted",
    "released": "given back unanswered as a replica stopped: the attempt not counted",
}


def schedule_of(job: Mapping[str, Any]) -> str:
    """The schedule that enqueued a job, linked, with the slot it was for (none: triggered by hand)."""
    name = job.get("schedule")
    if name is None:
        return "—"
    link = f'<a href="/ui/schedules#schedule-{esc(name)}">{esc(name)}</a>'
    slot = job.get("schedule_slot")
    return f"{link}, slot {when(slot)}" if slot is not None else f"{link}, triggered"


def _worker_of(job: Mapping[str, Any]) -> str:
    """The worker of a job's latest lease, linked to the workers page; running: it holds the job now."""
    worker = job.get("worker_id")
    if worker is None:
        return "—"
    held = " (holds it now)" if job["status"] == "running" else " (its last lease)"
    return f'<a href="/ui/workers">{esc(worker)}</a>{held}'


def _relatives(rows: Sequence[Mapping[str, Any]], what: str) -> str:
    """A table of a job's parents or children: each linked, with its kind and status (and queue, for
    children)."""
    queues = any("queue" in row for row in rows)
    lines = []
    for row in rows:
        state = job_state(row) if "run_at" in row else row["status"]
        queue = f'<td><a href="/ui/queues/{esc(row["queue"])}">{esc(row["queue"])}</a></td>' if queues else ""
        lines.append(
            f'<tr data-job="{row["id"]}"><th scope="row"><a href="/ui/jobs/{row["id"]}">{row["id"]}</a></th>'
            f"{queue}<td>{esc(row['kind'] or '')}</td>"
            f'<td><span class="status {esc(state)}">{esc(state)}</span></td></tr>'
        )
    head = "<th>Job</th>" + ("<th>Queue</th>" if queues else "") + "<th>Kind</th><th>Status</th>"
    return f'<table class="{what}"><thead><tr>{head}</tr></thead><tbody>{"".join(lines)}</tbody></table>'


def parents_section(job: Mapping[str, Any], parents: Mapping[str, Any] | None) -> str:
    """A job's parents (the first page of job_parents), with how many it has, and what it waits for them
    to end as (its run_if)."""
    named = list(dict.fromkeys(job.get("depends_on") or ()))
    if not named or parents is None:
        return ""
    rows = parents["parents"]
    said = f"{len(named)} parent{'s' if len(named) != 1 else ''}; {RUN_IF.get(job.get('run_if') or '', '')}"
    if parents["next_after_id"] is not None:
        said += (
            f" The first {len(rows)} are shown; GET /jobs/{job['id']}/parents?after_id="
            f"{parents['next_after_id']} pages on."
        )
    elif len(rows) < len(named):
        said += f" {len(named) - len(rows)} of them are no longer kept (their queues' retention)."
    table = _relatives(rows, "parents") if rows else ""
    return f'<h2>Parents</h2><p class="meta">{said}</p>{table}'


def children_section(children: Mapping[str, Any] | None) -> str:
    """A job's children (the first page of job_children); nothing for a job without any."""
    if children is None or not children["children"]:
        return ""
    rows = children["children"]
    said = "The jobs that wait for this one (and, of its workflow, those that waited for it)."
    if children["next_after_id"] is not None:
        said += f" The first {len(rows)} are shown."
    return f'<h2>Children</h2><p class="meta">{said}</p>{_relatives(rows, "children")}'


def delivery_section(delivery: Any) -> str:
    """A job's last push delivery (its `delivery`, stored JSON text): outcome, HTTP status, duration,
    when, and what went wrong; nothing for a job never pushed."""
    if delivery is None:
        return ""
    shown = json.loads(payload_text(delivery))
    said = DELIVERY_OUTCOMES.get(shown["outcome"])
    fields = [
        ("Outcome", esc(shown["outcome"]) + (f' <span class="meta">({esc(said)})</span>' if said else "")),
        ("HTTP status", esc(shown["status"]) if shown.get("status") is not None else "— (no answer)"),
        ("Took", f"{esc(format(shown['ms'], 'g'))} ms"),
        ("At", _moment(shown["at"])),
    ]
    if shown.get("error") is not None:
        fields.append(("Error", esc(shown["error"])))
    if shown.get("retry_after") is not None:
        fields.append(("Retry after", duration(shown["retry_after"])))
    if shown.get("note") is not None:
        fields.append(("Note", esc(shown["note"])))
    table = "".join(f"<tr><th>{name}</th><td>{value}</td></tr>" for name, value in fields)
    return f'<h2>Last delivery</h2><table class="fields delivery">{table}</table>'


def _parked(job: Mapping[str, Any]) -> str:
    """What a parked job waits for: an event (and until when), or the end of its sleep; "—" otherwise."""
    waiting = job.get("waiting_for")
    if waiting is not None:
        return f'event <code class="event">{esc(waiting["event"])}</code>, until {when(waiting["until"])}'
    if job.get("sleeping_until") is not None:
        return f'sleeps until {when(job["sleeping_until"])} <span class="meta">(no attempt counted)</span>'
    return "—"


def steps_section(job: Mapping[str, Any]) -> str:
    """The steps the job's handler recorded, each with its result; nothing for a job without."""
    if job.get("steps") is None:
        return ""
    steps = json.loads(payload_text(job["steps"]))
    rows = "".join(
        f'<tr><th scope="row"><code>{esc(name)}</code></th><td>{_json(result, job["id"])}</td></tr>'
        for name, result in sorted(steps.items())
    )
    said = (
        "Results its handler recorded (POST /jobs/{id}/steps): a run of the handler answers each of these "
        "from the record and runs only what is left."
    )
    return f'<h2>Steps ({len(steps)})</h2><p class="meta">{said}</p><table class="steps">{rows}</table>'


def _json(value: Any, job_id: int) -> str:
    """A value of a step or an event as the page shows results: null written out."""
    return outcome(value, job_id) if value is not None else '<pre class="outcome">null</pre>'


def events_section(job: Mapping[str, Any]) -> str:
    """The events that reached the job, and its waits that ran out, in order; nothing for a job without."""
    if job.get("events") is None:
        return ""
    lines = []
    for event in json.loads(payload_text(job["events"])):
        if event.get("timed_out"):
            got = '<span class="meta">the wait ran out without it</span>'
        else:
            got = _json(event.get("payload"), job["id"])
        lines.append(
            f'<tr><th scope="row"><code>{esc(event["name"])}</code></th><td>{_moment(event["at"])}</td>'
            f"<td>{got}</td></tr>"
        )
    head = "<thead><tr><th>Event</th><th>At</th><th>Payload</th></tr></thead>"
    return f'<h2>Events</h2><table class="events">{head}<tbody>{"".join(lines)}</tbody></table>'


def _moment(text: str) -> str:
    """A time of a job's JSON (RFC 3339) as the page writes times; the text itself if it is not one."""
    try:
        return when(datetime.fromisoformat(text))
    except ValueError:
        return esc(text)


def _workflow_of(job: Mapping[str, Any]) -> str:
    workflow_id = job.get("workflow_id")
    if workflow_id is None:
        return "—"
    return f'<a href="/ui/workflows/{workflow_id}">workflow {workflow_id}</a>'


def job_page(
    job: Mapping[str, Any],
    *,
    parents: Mapping[str, Any] | None = None,
    children: Mapping[str, Any] | None = None,
    flash: str | None = None,
    actions: bool = True,
) -> str:
    """A job's page; `parents` and `children` are the first pages of job_parents and job_children."""
    job_id = job["id"]
    here = f"/ui/jobs/{job_id}"
    state = job_state(job)
    fields = [
        ("Queue", f'<a href="/ui/queues/{esc(job["queue"])}">{esc(job["queue"])}</a>'),
        ("Kind", esc(job["kind"]) if job["kind"] is not None else "—"),
        ("Key", esc(job["key"]) if job.get("key") is not None else "—"),
        ("Status", f'<span class="status {esc(state)}">{esc(state)}</span>'),
        ("Attempts", f"{job['attempts']} of {job['max_attempts']}"),
        ("Priority", esc(job["priority"])),
        ("Run at", when(job["run_at"])),
        ("Lease expires", when(job["lease_expires_at"])),
        ("Worker", _worker_of(job)),
        ("Dedup key", esc(job["dedup_key"]) if job["dedup_key"] is not None else "—"),
        ("Schedule", schedule_of(job)),
        ("Workflow", _workflow_of(job)),
        ("Run if", esc(job["run_if"]) if job.get("run_if") else "—"),
        ("Waits for", _parked(job)),
        ("Created", when(job["created_at"])),
        ("Updated", when(job["updated_at"])),
        ("Completed", when(job["completed_at"])),
        ("Result", outcome(job["result"], job_id)),
        ("Progress", outcome(job["progress"], job_id)),
    ]
    table = "".join(f"<tr><th>{name}</th><td>{value}</td></tr>" for name, value in fields)
    pressed = []
    if actions and state == "dead":
        pressed.append(button(f"/ui/dead/{job_id}/retry", "Retry", back=here))
        gone = url("/ui/jobs", queue=job["queue"], status="dead")
        confirm = f"Purge job {job_id} for good?"
        pressed.append(button(f"/ui/dead/{job_id}/purge", "Purge", back=gone, confirm=confirm, danger=True))
    if actions and state == "scheduled":  # a sleeping job too: it wakes now
        pressed.append(button(f"{here}/run", "Run now", back=here))
    if actions and state in ("pending", "scheduled", "waiting"):
        confirm = f"Cancel job {job_id}? It will not run."
        pressed.append(button(f"{here}/cancel", "Cancel", back=here, confirm=confirm, danger=True))
    buttons = f'<div class="actions">{"".join(pressed)}</div>' if pressed else ""
    error = ""
    if job["last_error"]:
        # Red while it is why the job is dead; once the job is retried (or runs again after a nack), what
        # an earlier attempt said, muted.
        if state == "dead":
            error = f'<h2>Last error</h2><pre class="error">{esc(job["last_error"])}</pre>'
        else:
            error = (
                "<h2>Last error (an earlier attempt)</h2>"
                f'<pre class="error earlier">{esc(job["last_error"])}</pre>'
            )
    pretty = pretty_json(job["payload"])
    body = (
        f'<h1>Job {job_id}</h1>{buttons}<table class="fields">{table}</table>{error}'
        f"{delivery_section(job.get('delivery'))}{steps_section(job)}{events_section(job)}"
        f"{parents_section(job, parents)}{children_section(children)}"
        f'<h2>Payload</h2><pre class="payload">{esc(pretty)}</pre>'
    )
    return layout(f"Job {job_id}", body, flash=flash)
