"""The workers seen leasing in the last hour, and any holding jobs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.ui.pages.layout import esc, layout, url, when


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
