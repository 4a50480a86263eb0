"""The schedules, a page at a time by name: cron, queue, next and last run; pause, resume, trigger now."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.ui.pages.layout import button, esc, layout, url, when


def schedules_page(
    page: Mapping[str, Any], *, after: str | None = None, flash: str | None = None, actions: bool = True
) -> str:
    """A page of schedules by name (GET /schedules' page), with a link to the next."""
    base, here = "/ui/schedules", url("/ui/schedules", after=after)
    rows = []
    for schedule in page["schedules"]:
        name, queue, paused = schedule["name"], schedule["queue"], schedule["paused"]
        toggle = (
            button(f"{base}/{name}/resume", "Resume", back=here)
            if paused
            else button(f"{base}/{name}/pause", "Pause", back=here)
        )
        trigger = button(f"{base}/{name}/trigger", "Trigger now", back=here)
        last_job = schedule["last_job_id"]
        last_run = when(schedule["last_run_at"])
        if last_job is not None:
            last_run += f' <a href="/ui/jobs/{last_job}">job {last_job}</a>'
        rows.append(
            f'<tr id="schedule-{esc(name)}" data-schedule="{esc(name)}" class="{"paused" if paused else ""}">'
            f'<th scope="row">{esc(name)}</th>'
            f"<td><code>{esc(schedule['cron'])}</code> {esc(schedule['timezone'])}</td>"
            f'<td><a href="{esc(url("/ui/dead", queue=queue))}">{esc(queue)}</a></td>'
            f'<td class="next">{when(schedule["next_run_at"])}</td><td class="last">{last_run}</td>'
            f'<td class="state">{"paused" if paused else "active"}</td>'
            + (f'<td class="actions">{toggle}{trigger}</td>' if actions else "")
            + "</tr>"
        )
    table = (
        "<table><thead><tr><th>Schedule</th><th>Cron</th><th>Queue</th><th>Next run</th><th>Last run</th>"
        f"<th>State</th>{'<th></th>' if actions else ''}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        if rows
        else '<p class="empty">No schedules yet: PUT /schedules/{name} creates one.</p>'
    )
    following = page["next_after"]
    if following:
        table += f'<p><a rel="next" href="{esc(url("/ui/schedules", after=following))}">Next →</a></p>'
    summary = '<p class="meta">A paused schedule has no next run; "Trigger now" enqueues its job at once.</p>'
    return layout("Schedules", f"<h1>Schedules</h1>{table}{summary}", flash=flash, refresh=True)
