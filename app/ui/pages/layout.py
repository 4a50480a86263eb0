"""What every page of the dashboard shares: the frame (header, navigation, the Sign out slot, the notice),
the one-button forms, and how values are written (escaped, times, durations, rates, JSON, limits).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from html import escape
from typing import Any
from urllib.parse import urlencode

import orjson

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
# knows; app/ui/routes/common.py's `html`).
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
        """<nav><a href="/ui">Queues</a> <a href="/ui/jobs">Jobs</a> <a href="/ui/workflows">Workflows</a>
    <a href="/ui/dead">Dead jobs</a>
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


def select(name: str, label: str, chosen: str | None, options: Iterable[str], everything: str) -> str:
    """A filter form's picker: `everything` (an empty value) or one of `options`."""
    items = "".join(
        f'<option value="{esc(o)}"{" selected" if o == chosen else ""}>{esc(o)}</option>' for o in options
    )
    return (
        f'<label>{label} <select name="{name}"><option value="">{everything}</option>{items}</select></label>'
    )


def text_input(name: str, label: str, value: str | None, size: int = 12) -> str:
    """A filter form's text field."""
    return f'<label>{label} <input name="{name}" value="{esc(value or "")}" size="{size}"></label>'


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


def rate_text(limit: int | None, period: float | None) -> str:
    return "" if limit is None or period is None else f"{limit} per {period:g} s"


def limits_text(row: Mapping[str, Any]) -> str:
    """A queue's flow-control settings in a few words ('' for none)."""
    parts = []
    concurrency = row["key_concurrency"]
    if concurrency is not None:
        parts.append(f"{concurrency} per key" + (", in order" if concurrency == 1 else ""))
    if row["fair"]:
        parts.append("fair")
    if queue_rate := rate_text(row["rate_limit"], row["rate_period"]):
        parts.append(queue_rate)
    if key_rate := rate_text(row["key_rate_limit"], row["key_rate_period"]):
        parts.append(f"{key_rate} per key")
    return " · ".join(parts)


def job_state(job: Mapping[str, Any]) -> str:
    """A job's status as shown: `scheduled` for a pending job not due yet (it waits for its run_at)."""
    status = job["status"]
    if status == "pending" and job["run_at"] > datetime.now(UTC):
        return "scheduled"
    return status


def not_found_page(detail: str) -> str:
    return layout("Not found", f'<h1>Not found</h1><p class="empty">{esc(detail)}</p>')
