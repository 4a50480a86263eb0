"""A queue's page: its jobs by state, charts of its rollups over time, its settings (a form for admins)
and limits, its push target, pause and resume.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from app.service.rollups import ROLLUP_ORIGIN, SERIES, SPANS
from app.ui.charts import line_chart
from app.ui.pages.layout import button, duration, esc, layout, limits_text, url

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


def push_section(push: Mapping[str, Any] | None) -> str:
    """The queue's push target (API part 7), where the service POSTs its jobs; nothing for a queue that
    workers lease. The row holds no signing secret (QUEUE_STATS reads only `push`), so none can show."""
    if push is None:
        return ""
    fields = (
        ("URL", esc(push["url"])),
        ("Timeout", f"{esc(_number(push['timeout']))} s"),
        ("Deliveries at once", f"{esc(push['concurrency'])}, across every replica"),
    )
    table = "".join(f"<tr><th>{name}</th><td>{value}</td></tr>" for name, value in fields)
    return f'<h2>Push delivery</h2><table class="fields push">{table}</table>'


def queue_page(
    queue: Mapping[str, Any], *, charts: str = "", flash: str | None = None, actions: bool = True
) -> str:
    """A queue: its jobs by state (each a link to the list; `cancelled`, which the API's row has not,
    added by the router), charts over time, its settings and limits (a form for admins), its push
    target, pause and resume."""
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
        + push_section(queue.get("push"))
    )
    return layout(f"Queue {name}", body, flash=flash)


def _number(value: float | int | None) -> str:
    return "" if value is None else f"{value:g}" if isinstance(value, float) else str(value)
