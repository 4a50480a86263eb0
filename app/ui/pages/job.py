"""A job's page: every field, its result, progress, last error and payload, and the buttons its state
allows (retry and purge a dead job, run a scheduled one now, cancel a waiting one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.ui.pages.layout import button, esc, job_state, layout, outcome, pretty_json, url, when


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


def job_page(job: Mapping[str, Any], *, flash: str | None = None, actions: bool = True) -> str:
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
    if actions and state == "scheduled":
        pressed.append(button(f"{here}/run", "Run now", back=here))
    if actions and state in ("pending", "scheduled"):
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
        f'<h2>Payload</h2><pre class="payload">{esc(pretty)}</pre>'
    )
    return layout(f"Job {job_id}", body, flash=flash)
