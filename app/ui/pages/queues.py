"""The queues page, the dashboard's front: each queue's depth, lag, throughput and limits, pause and
resume, and what holds back vacuum of jobq's tables.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from app.telemetry.metrics import DatabaseHealth, holding_back
from app.ui.pages.layout import button, duration, esc, layout, limits_text, rate, url, when


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
