"""The dashboard's pages, as HTML strings.

Every value that comes from the database or the request goes through ``esc`` (queue names are
restricted, but payloads, errors and dedup keys are anything). Buttons are small forms that POST to
the dashboard's own routes, which answer with a redirect back here (post/redirect/get); the action and
the page to come back to travel in the form's URL, so no form body needs parsing. Pages for a caller
who may not press them (a viewer: `actions=False`) have no buttons at all.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from html import escape
from typing import Any
from urllib.parse import urlencode

import orjson

from app.core.states import JobStatus
from app.service.rollups import ROLLUP_ORIGIN, SERIES, SPANS
from app.telemetry.metrics import DatabaseHealth, holding_back
from app.ui.charts import line_chart

PREVIEW_CHARS = 120  # of a payload in the dead-job list
ERROR_CHARS = 200  # of an error in the dead-job list
# Of a result or progress on a job's page, pretty-printed: results may be 64 KiB (JOBQ_MAX_RESULT_BYTES),
# more than a glance at a page wants; the API answers them whole.
OUTCOME_CHARS = 4000


def esc(value: object) -> str:
    return escape(str(value), quote=True)


def url(path: str, **query: object) -> str:
    """`path` (which may have a query string) with the query parameters that are not None."""
    params = {k: v for k, v in query.items() if v is not None}
    if not params:
        return path
    return f"{path}{'&' if '?' in path else '?'}{urlencode(params)}"


# Where a page's header has the Sign out button when the caller came with a session cookie (the router
# knows; app/ui/routes.py's `html`).
ACCOUNT = "<!-- account -->"
SIGN_OUT = '<form class="account" method="post" action="/ui/sign-out"><button>Sign out</button></form>'


def with_sign_out(page: str) -> str:
    return page.replace(ACCOUNT, SIGN_OUT, 1)


def layout(
    title: str, body: str, *, flash: str | None = None, refresh: bool = False, nav: bool = True
) -> str:
    notice = f'<p class="flash" role="status">{esc(flash)}</p>' if flash else ""
    refresh_toggle = (
        '<label class="refresh"><input type="checkbox" id="auto-refresh" checked> auto-refresh</label>'
        if refresh
        else ""
    )
    links = (
        """<nav><a href="/ui">Queues</a> <a href="/ui/jobs">Jobs</a> <a href="/ui/dead">Dead jobs</a>
    <a href="/ui/schedules">Schedules</a> <a href="/ui/workers">Workers</a></nav>
  <form class="lookup" action="/ui/jobs" method="get">
    <input name="id" inputmode="numeric" placeholder="job id" aria-label="job id"> <button>Open</button>
  </form>"""
        if nav
        else ""
    )
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)} · jobq</title>
<link rel="stylesheet" href="/ui/static/ui.css">
<script src="/ui/static/ui.js" defer></script>
</head>
<body>
<header>
  <a class="brand" href="/ui">jobq</a>
  {links}
  {refresh_toggle}
  {ACCOUNT}
</header>
<main{' data-refresh="5"' if refresh else ""}>
{notice}
{body}
</main>
</body>
</html>
"""


def button(action: str, label: str, *, back: str, confirm: str | None = None, danger: bool = False) -> str:
    """A one-button form that POSTs to `action` and comes back to `back`."""
    confirm_attr = f' data-confirm="{esc(confirm)}"' if confirm else ""
    css = "danger" if danger else ""
    return (
        f'<form method="post" action="{esc(url(action, next=back))}"{confirm_attr}>'
        f'<button class="{css}">{esc(label)}</button></form>'
    )


def when(moment: datetime | None) -> str:
    if moment is None:
        return "—"
    text = moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    return f'<time datetime="{esc(moment.isoformat())}">{esc(text)}</time>'


def duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} m {sec} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} m" if hours < 48 else f"{hours // 24} d {hours % 24} h"


def rate(per_second: float | None) -> str:
    if per_second is None:
        return "—"
    return f"{per_second:.1f}/s" if per_second < 100 else f"{per_second:,.0f}/s"


def payload_text(payload: Any) -> str:
    """A job's payload as its JSON text (payloads come from the database as raw JSON fragments)."""
    return orjson.dumps(payload).decode()


def shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def pretty_json(value: Any) -> str:
    """A payload, result or progress (raw JSON fragments from the database) as indented JSON text."""
    return json.dumps(json.loads(payload_text(value)), indent=2, ensure_ascii=False)


def outcome(value: Any, job_id: int) -> str:
    """A job's result or progress as a page shows it: pretty JSON, escaped, cut at OUTCOME_CHARS."""
    if value is None:
        return "—"
    text = pretty_json(value)
    if len(text) > OUTCOME_CHARS:
        more = len(text) - OUTCOME_CHARS
        text = f"{text[:OUTCOME_CHARS]}\n… {more} more characters (GET /jobs/{job_id} has all of it)"
    return f'<pre class="outcome">{esc(text)}</pre>'


# --- pages -----------------------------------------------------------------------------------------


def queues_page(
    rows: list[Mapping[str, Any]],
    throughput: Mapping[str, Mapping[str, float]],
    gauges: Any,
    *,
    completed: Mapping[str, int] | None = None,
    flash: str | None = None,
    actions: bool = True,
) -> str:
    completed = completed or {}
    body_rows = []
    for row in rows:
        name = row["queue"]
        rates = throughput.get(name, {})
        paused = row["paused"]
        toggle = (
            button(f"/ui/queues/{name}/resume", "Resume", back="/ui")
            if paused
            else button(f"/ui/queues/{name}/pause", "Pause", back="/ui")
        )
        toggle_cell = f"<td>{toggle}</td>" if actions else ""
        dead = row["dead"]
        dead_cell = f'<a href="{esc(url("/ui/dead", queue=name))}">{dead}</a>' if dead else "0"
        limits = esc(limits_text(row))
        if row["flow"]:
            limits = f'<a href="/ui/queues/{esc(name)}/keys">{limits}</a>'
        body_rows.append(
            f'<tr data-queue="{esc(name)}" class="{"paused" if paused else ""}">'
            f'<th scope="row"><a href="/ui/queues/{esc(name)}">{esc(name)}</a></th>'
            f'<td class="num">{row["pending"]}</td><td class="num">{row["scheduled"]}</td>'
            f'<td class="num">{row["running"]}</td><td class="num dead">{dead_cell}</td>'
            f'<td class="num completed">{completed.get(name, 0)}</td>'
            f'<td class="num lag">{duration(row["lag_seconds"])}</td>'
            f'<td class="num">{rate(rates.get("enqueued"))}</td>'
            f'<td class="num">{rate(rates.get("acked"))}</td>'
            f'<td class="state">{"paused" if paused else "active"}</td>'
            f'<td class="limits">{limits}</td>{toggle_cell}</tr>'
        )
    table = (
        "<table><thead><tr><th>Queue</th><th>Pending</th><th>Scheduled</th><th>Running</th><th>Dead</th>"
        '<th title="Jobs completed in the last hour, all replicas">Done, 1 h</th>'
        "<th>Lag</th><th>Enqueued</th><th>Acked</th><th>State</th><th>Limits</th>"
        f"{'<th></th>' if actions else ''}</tr></thead>"
        f"<tbody>{''.join(body_rows)}</tbody></table>"
        if rows
        else '<p class="empty">No queues yet: a queue appears with its first job.</p>'
    )
    refreshed = f"as of {when(datetime.fromtimestamp(gauges.at, UTC))}" if gauges.at else "not read yet"
    summary = (
        f'<p class="meta">Lag is the age of the oldest ready job. Rates are this process\'s, over the last '
        f"minute. Sessions waiting for a lock: <b>{gauges.lock_waiting}</b> ({refreshed}).</p>"
    )
    health = database_health(gauges.health) if gauges.at else ""
    return layout("Queues", f"<h1>Queues</h1>{table}{summary}{health}", flash=flash, refresh=True)


def _bytes(n: int) -> str:
    return f"{n / 2**20:,.1f} MB" if n >= 2**20 else f"{n / 1024:,.0f} kB"


def database_health(health: DatabaseHealth) -> str:
    """What holds back vacuum of jobq's tables, named (pid, application, state, how long), a warning once
    it has held a minute; and the jobs table's rows, size and last vacuum."""
    oldest = health.oldest
    if oldest is None:
        horizon = '<p class="meta horizon">Vacuum: no open transaction holds back the jobs table.</p>'
    else:
        who = f"{oldest['holder'].replace('_', ' ')} {esc(oldest['name'] or '')}".rstrip()
        if oldest["pid"] is not None:
            who += f" (pid {oldest['pid']}{', ' + esc(oldest['state']) if oldest['state'] else ''})"
        held = f"open {duration(oldest['seconds'])}, " if oldest["seconds"] is not None else ""
        warn = holding_back(oldest)
        horizon = (
            f'<p class="{"flash warn" if warn else "meta"} horizon">Vacuum: the oldest snapshot is the {who}:'
            f" {held}{oldest['xid_age']:,} transactions old."
            + (" Dead jobs rows it can see cannot be vacuumed while it stays open." if warn else "")
            + (f" Last statement: <code>{esc(oldest['query'])}</code>" if oldest["query"] else "")
            + "</p>"
        )
    table = health.table
    if table is None:
        return horizon
    vacuumed = table["since_vacuum_seconds"]
    return horizon + (
        f'<p class="meta jobs-table">Jobs table: {table["live_tuples"]:,} live rows, {table["dead_tuples"]:,}'
        f" dead; {_bytes(table['bytes'])}, claim index {_bytes(table['claim_index_bytes'])};"
        f" {'vacuumed ' + duration(vacuumed) + ' ago' if vacuumed is not None else 'no vacuum recorded'}.</p>"
    )


def _rate_text(limit: int | None, period: float | None) -> str:
    return "" if limit is None or period is None else f"{limit} per {period:g} s"


def limits_text(row: Mapping[str, Any]) -> str:
    """A queue's flow-control settings in a few words ('' for none)."""
    parts = []
    concurrency = row["key_concurrency"]
    if concurrency is not None:
        parts.append(f"{concurrency} per key" + (", in order" if concurrency == 1 else ""))
    if row["fair"]:
        parts.append("fair")
    if queue_rate := _rate_text(row["rate_limit"], row["rate_period"]):
        parts.append(queue_rate)
    if key_rate := _rate_text(row["key_rate_limit"], row["key_rate_period"]):
        parts.append(f"{key_rate} per key")
    return " · ".join(parts)


KEYS_SHOWN = 50


def keys_page(queue: str, limits: str, keys: list[Mapping[str, Any]]) -> str:
    """A queue's keys with the most jobs waiting, and keys with limits of their own (KEYS_SHOWN at most)."""
    rows = []
    for key in keys:
        own = [f"{key['concurrency']} at once"] if key["concurrency"] is not None else []
        if key["rate"]:
            own.append(_rate_text(key["rate"]["limit"], key["rate"]["period"]))
        rows.append(
            f'<tr data-key="{esc(key["key"])}"><th scope="row">{esc(key["key"])}</th>'
            f'<td class="num">{key["pending"]}</td><td class="num">{key["running"]}</td>'
            f"<td>{esc(' · '.join(own) or 'the queue’s')}</td></tr>"
        )
    table = (
        "<table><thead><tr><th>Key</th><th>Waiting</th><th>Running</th><th>Own limits</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
        if rows
        else '<p class="empty">No key has jobs waiting or running, or limits of its own.</p>'
    )
    summary = (
        f'<p class="meta">Limits of the queue: {esc(limits or "none")}. The {KEYS_SHOWN} keys with the most'
        " jobs waiting, then keys with limits of their own (PUT /queues/{queue}/keys/{key}).</p>"
    )
    return layout(f"Keys of {queue}", f"<h1>Keys of {esc(queue)}</h1>{table}{summary}", refresh=True)


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


STATUSES = tuple(JobStatus)  # the status picker's choices, in the state machine's order
ALL_BOX = '<th><input type="checkbox" data-select-all aria-label="select every job shown"></th>'
# What the dashboard does to a selection of jobs, or to every job a list matches, and to which jobs
# each action applies: the others in a selection are left as they are, and said so.
BULK = {"retry": ("dead", "Retry"), "purge": ("dead", "Purge"), "cancel": ("pending", "Cancel")}


def _select(name: str, label: str, chosen: str | None, options: Iterable[str], everything: str) -> str:
    items = "".join(
        f'<option value="{esc(o)}"{" selected" if o == chosen else ""}>{esc(o)}</option>' for o in options
    )
    return (
        f'<label>{label} <select name="{name}"><option value="">{everything}</option>{items}</select></label>'
    )


def _text_input(name: str, label: str, value: str | None, size: int = 12) -> str:
    return f'<label>{label} <input name="{name}" value="{esc(value or "")}" size="{size}"></label>'


def job_state(job: Mapping[str, Any]) -> str:
    """A job's status as shown: `scheduled` for a pending job not due yet (it waits for its run_at)."""
    status = job["status"]
    if status == "pending" and job["run_at"] > datetime.now(UTC):
        return "scheduled"
    return status


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
        + _select("queue", "Queue", filters.get("queue"), queues, "all queues")
        + " "
        + _select("status", "Status", status, STATUSES, "any status")
        + " "
        + _text_input("kind", "Kind", filters.get("kind"))
        + " "
        + _text_input("key", "Key", filters.get("key"))
        + " "
        + _text_input("q", "Search", filters.get("q"), 20)
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


# A queue's settings as its page shows and edits them: (field, label, unit).
SETTINGS = (
    ("visibility_timeout", "Visibility timeout", "s"),
    ("max_attempts", "Max attempts", ""),
    ("backoff_base", "Backoff base", "s"),
    ("backoff_cap", "Backoff cap", "s"),
    ("retention", "Retention of finished jobs", "s"),
)


SPAN_NAMES = {
    "1h": ("Last hour", "per minute"),
    "1d": ("Last day", "per 15 minutes"),
    "7d": ("Last week", "per 2 hours"),
}


def queue_charts(queue: str, rows: list[Mapping[str, Any]], span: str, now: datetime) -> str:
    """The queue's rollups over `span` as two charts: jobs per step by series, and the longest lag."""
    seconds, step_seconds = SPANS[span]
    step = timedelta(seconds=step_seconds)
    points = seconds // step_seconds
    last = ROLLUP_ORIGIN + step * ((now - ROLLUP_ORIGIN) // step)
    steps = [last - step * (points - 1 - i) for i in range(points)]
    by_step = {row["at"]: row for row in rows}
    counts = {name: [by_step[at][name] if at in by_step else 0 for at in steps] for name in SERIES}
    lag = {"lag": [by_step[at]["lag"] if at in by_step else None for at in steps]}
    title, per = SPAN_NAMES[span]
    here = f"/ui/queues/{queue}"
    spans = " · ".join(
        f"<b>{name}</b>" if key == span else f'<a href="{esc(url(here, span=key))}">{name}</a>'
        for key, (name, _) in SPAN_NAMES.items()
    )
    return (
        f'<p class="spans">{spans}</p>'
        + line_chart(f"Jobs {per}", steps[0], step, points, counts)
        + line_chart(f"Lag (oldest ready job), longest {per}", steps[0], step, points, lag, unit="s")
        + '<p class="meta">Counted by every replica and written each metrics interval; jobs enqueued with '
        "the SQL function are in the lag, not in <i>enqueued</i>.</p>"
    )


def queue_page(
    queue: Mapping[str, Any], *, charts: str = "", flash: str | None = None, actions: bool = True
) -> str:
    """A queue: its jobs by state (each a link to the list; `cancelled`, which the API's row has not,
    added by the router), charts over time, its settings and limits (a form for admins), pause and
    resume."""
    name = queue["queue"]
    here = f"/ui/queues/{name}"
    counts = [
        ("Pending (ready)", "pending", queue["pending"]),
        ("Scheduled", "pending", queue["scheduled"]),
        ("Running", "running", queue["running"]),
        ("Completed (kept)", "completed", queue["completed"]),
        ("Dead", "dead", queue["dead"]),
        ("Cancelled (kept)", "cancelled", queue["cancelled"]),
    ]
    states = "".join(
        f'<tr data-state="{esc(label.split()[0].lower())}"><th>{label}</th>'
        f'<td class="num"><a href="{esc(url("/ui/jobs", queue=name, status=status))}">{n}</a></td></tr>'
        for label, status, n in counts
    )
    settings = queue["settings"]
    if actions:
        fields = "".join(
            f'<tr><th><label for="setting-{field}">{label}</label></th><td><input id="setting-{field}" '
            f'name="{field}" value="{esc(_number(settings[field]))}" size="10"> {unit}</td></tr>'
            for field, label, unit in SETTINGS
        )
        concurrency = settings["key_concurrency"]
        for setting, label in (("rate", "Leases of the queue"), ("key_rate", "Leases per key")):
            rate = settings[setting] or {}
            fields += (
                f'<tr><th><label for="setting-{setting}_limit">{label}</label></th><td>'
                f'<input id="setting-{setting}_limit" name="{setting}_limit" size="6" '
                f'value="{esc(_number(rate.get("limit")))}"> per '
                f'<input id="setting-{setting}_period" name="{setting}_period" size="6" '
                f'aria-label="{label}: period" '
                f'value="{esc(_number(rate.get("period")))}"> s; empty: no limit</td></tr>'
            )
        fields += (
            '<tr><th><label for="setting-key_concurrency">Jobs per key at once</label></th><td>'
            f'<input id="setting-key_concurrency" name="key_concurrency" size="10" '
            f'value="{esc("" if concurrency is None else concurrency)}"> empty: no limit</td></tr>'
            '<tr><th><label for="setting-fair">Fair between keys</label></th><td>'
            '<input type="checkbox" id="setting-fair" name="fair" value="on"'
            f"{' checked' if settings['fair'] else ''}></td></tr>"
        )
        action = esc(url(f"{here}/settings", next=here))
        editor = (
            f'<form class="settings" method="post" action="{action}">'
            f'<table class="fields">{fields}</table><p><button>Save settings</button></p></form>'
        )
    else:
        shown = [(label, f"{_number(settings[field])} {unit}".strip()) for field, label, unit in SETTINGS]
        editor = (
            '<table class="fields">'
            + "".join(f"<tr><th>{label}</th><td>{esc(value)}</td></tr>" for label, value in shown)
            + "</table>"
        )
    limits = limits_text(
        {
            "key_concurrency": settings["key_concurrency"],
            "fair": settings["fair"],
            "rate_limit": (settings["rate"] or {}).get("limit"),
            "rate_period": (settings["rate"] or {}).get("period"),
            "key_rate_limit": (settings["key_rate"] or {}).get("limit"),
            "key_rate_period": (settings["key_rate"] or {}).get("period"),
        }
    )
    paused = queue["paused"]
    toggle = ""
    if actions:
        toggle = (
            button(f"{here}/resume", "Resume", back=here)
            if paused
            else button(f"{here}/pause", "Pause", back=here)
        )
    said = "Paused: it leases nothing until resumed." if paused else "Active."
    state = f'<p class="state">{said} {toggle}</p>'
    body = (
        f'<h1>Queue {esc(name)}</h1>{state}<h2>Jobs</h2><table class="fields states">{states}</table>'
        f'<p class="meta">Oldest ready job: {duration(queue["oldest_pending_age_seconds"])} old. '
        f'<a href="{esc(url("/ui/jobs", queue=name))}">All its jobs</a></p>'
        f"<h2>Over time</h2>{charts}"
        f"<h2>Settings</h2>{editor}"
        f"<h2>Limits</h2><p>{esc(limits or 'none')}"
        + (f' · <a href="{here}/keys">its keys</a>' if limits else "")
        + "</p>"
    )
    return layout(f"Queue {name}", body, flash=flash)


def _number(value: float | int | None) -> str:
    return "" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def workers_page(workers: list[Mapping[str, Any]]) -> str:
    """Workers seen leasing in the last hour, and any holding jobs: queues, last seen, leased, held."""
    rows = []
    for worker in workers:
        worker_id = worker["worker_id"]
        queues = ", ".join(f'<a href="/ui/queues/{esc(q)}">{esc(q)}</a>' for q in worker["queues"] or [])
        held = worker["held"]
        held_cell = f'<a href="{esc(url("/ui/jobs", status="running"))}">{held}</a>' if held else "0"
        rows.append(
            f'<tr data-worker="{esc(worker_id)}"><th scope="row">{esc(worker_id)}</th><td>{queues}</td>'
            f'<td class="last-seen">{when(worker["last_seen"])}</td><td class="num">{worker["leased"]}</td>'
            f'<td class="num held">{held_cell}</td><td>{when(worker["next_deadline"])}</td></tr>'
        )
    table = (
        "<table><thead><tr><th>Worker</th><th>Queues</th><th>Last seen</th><th>Leased</th><th>Holding</th>"
        f"<th>Next lease deadline</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
        if rows
        else '<p class="empty">No worker has leased in the last hour. Workers are known by the '
        "<code>worker_id</code> they send with <code>POST /lease</code>; the Python runner sends one.</p>"
    )
    summary = (
        '<p class="meta">By the <code>worker_id</code> each sends with its leases. Every replica writes '
        "what it saw every few seconds; a worker not seen for an hour is dropped.</p>"
    )
    return layout("Workers", f"<h1>Workers</h1>{table}{summary}", refresh=True)


def sign_in_page(next_page: str, max_age: int, *, flash: str | None = None, linked: bool = False) -> str:
    """The sign-in form: a token, once, for a session of `max_age` seconds; then on to `next_page`.
    `linked`: the browser came by a link from another site, which carried no session cookie: it may be
    signed in already, and following a link of this page tells."""
    already = (
        f'<p class="flash">Signed in already? A link from another site does not bring the session along: '
        f'<a href="{esc(next_page)}">continue to {esc(next_page)}</a>.</p>'
        if linked
        else ""
    )
    body = (
        f"<h1>Sign in</h1>{already}"
        '<form class="sign-in" method="post" action="/ui/sign-in">'
        f'<input type="hidden" name="next" value="{esc(next_page)}">'
        '<p><label for="token">Token</label><br><input id="token" name="token" type="password" '
        'autocomplete="current-password" required autofocus></p>'
        "<p><button>Sign in</button></p></form>"
        f'<p class="meta">A token with the viewer or admin role. This browser stays signed in for '
        f"{duration(max_age)}, or until you sign out.</p>"
    )
    return layout("Sign in", body, flash=flash, nav=False)


def not_found_page(detail: str) -> str:
    return layout("Not found", f'<h1>Not found</h1><p class="empty">{esc(detail)}</p>')
