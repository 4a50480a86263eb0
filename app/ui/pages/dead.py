"""The dead jobs, newest first, by queue: retry or purge each, or retry every dead job of a queue."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from app.ui.pages.layout import (
    ERROR_CHARS,
    PREVIEW_CHARS,
    button,
    esc,
    layout,
    payload_text,
    shorten,
    url,
    when,
)


def dead_page(
    page: Mapping[str, Any],
    *,
    queue: str | None,
    queues: Iterable[str],
    here: str,
    flash: str | None = None,
    actions: bool = True,
) -> str:
    options = "".join(
        f'<option value="{esc(q)}"{" selected" if q == queue else ""}>{esc(q)}</option>' for q in queues
    )
    picker = (
        '<form class="filter" action="/ui/dead" method="get"><label>Queue '
        f'<select name="queue"><option value="">all queues</option>{options}</select></label> '
        "<button>Show</button></form>"
    )
    retry_all = (
        button(
            f"/ui/queues/{queue}/retry-dead",
            f"Retry all dead jobs in {queue}",
            back=here,
            confirm=f"Retry every dead job of {queue}?",
        )
        if queue and page["jobs"] and actions
        else ""
    )
    rows = []
    for job in page["jobs"]:
        job_id = job["id"]
        text = payload_text(job["payload"])
        error = job["last_error"] or ""
        retry = button(f"/ui/dead/{job_id}/retry", "Retry", back=here)
        purge = button(
            f"/ui/dead/{job_id}/purge", "Purge", back=here, confirm=f"Purge job {job_id}?", danger=True
        )
        rows.append(
            f'<tr data-job="{job_id}">'
            f'<th scope="row"><a href="/ui/jobs/{job_id}">{job_id}</a></th>'
            f'<td>{esc(job["queue"])}</td><td class="num">{job["attempts"]}/{job["max_attempts"]}</td>'
            f"<td>{when(job['updated_at'])}</td>"
            f'<td class="error" title="{esc(shorten(error, 2000))}">{esc(shorten(error, ERROR_CHARS))}</td>'
            f"<td><code>{esc(shorten(text, PREVIEW_CHARS))}</code></td>"
            + (f'<td class="actions">{retry}{purge}</td>' if actions else "")
            + "</tr>"
        )
    table = (
        "<table><thead><tr><th>Job</th><th>Queue</th><th>Attempts</th><th>Died</th><th>Error</th>"
        f"<th>Payload</th>{'<th></th>' if actions else ''}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        if rows
        else '<p class="empty">No dead jobs.</p>'
    )
    older = page["next_before_id"]
    more = (
        f'<p><a rel="next" href="{esc(url("/ui/dead", queue=queue, before_id=older))}">Older →</a></p>'
        if older
        else ""
    )
    title = f"Dead jobs in {queue}" if queue else "Dead jobs"
    return layout(title, f"<h1>{esc(title)}</h1>{picker}{retry_all}{table}{more}", flash=flash)
