"""A queue's keys: those with the most jobs waiting, and those with limits of their own."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.ui.pages.layout import esc, layout, rate_text

KEYS_SHOWN = 50


def keys_page(queue: str, limits: str, keys: list[Mapping[str, Any]]) -> str:
    """A queue's keys with the most jobs waiting, and keys with limits of their own (KEYS_SHOWN at most)."""
    rows = []
    for key in keys:
        own = [f"{key['concurrency']} at once"] if key["concurrency"] is not None else []
        if key["rate"]:
            own.append(rate_text(key["rate"]["limit"], key["rate"]["period"]))
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
