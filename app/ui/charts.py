"""Charts drawn on the server as SVG: no script, no library, nothing loaded from elsewhere.

A chart is a few polylines over a span of time cut into equal steps, with its largest value marked on
the y axis and the span's start, middle and end on the x axis. Each line carries its series' name and
total as data attributes, and the chart a text alternative (its title and each total), so what it shows
is also there in words.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from html import escape

WIDTH, HEIGHT = 720, 160
LEFT, RIGHT, TOP, BOTTOM = 48, 8, 10, 22  # margins for the axes' labels
COLORS = {
    "enqueued": "#2457d6",
    "completed": "#067647",
    "failed": "#b54708",
    "dead": "#b42318",
    "lag": "#6941c6",
}


def _nice(value: float) -> float:
    """The smallest of 1, 2 and 5 times a power of ten not below `value` (the y axis' top)."""
    if value <= 0:
        return 1.0
    power = 10.0 ** (len(str(int(value))) - 1) if value >= 1 else 0.1
    while power * 10 < value:
        power *= 10
    for factor in (1, 2, 5, 10):
        if factor * power >= value:
            return factor * power
    return 10 * power


def _label(value: float, unit: str) -> str:
    text = f"{value:,.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"
    return f"{text} {unit}".strip()


def line_chart(
    title: str,
    start: datetime,
    step: timedelta,
    points: int,
    series: Mapping[str, Sequence[float | None]],
    *,
    unit: str = "",
) -> str:
    """An SVG chart of `series` (name -> one value per step, None for no data), `points` steps from
    `start`."""
    top = _nice(max((v for values in series.values() for v in values if v is not None), default=0))
    inner_w, inner_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(i: int) -> float:
        return LEFT + (inner_w * i / max(points - 1, 1))

    def y(v: float) -> float:
        return TOP + inner_h * (1 - v / top)

    lines, legend, said = [], [], []
    for name, values in series.items():
        color = COLORS.get(name, "#1d2330")
        runs: list[list[str]] = [[]]
        for i, v in enumerate(values):
            if v is None:
                runs.append([])
            else:
                runs[-1].append(f"{x(i):.1f},{y(v):.1f}")
        total = sum(v for v in values if v is not None)
        shown = max((v for v in values if v is not None), default=None) if unit else total
        for run in (r for r in runs if r):
            lines.append(
                f'<polyline class="series" data-series="{escape(name)}" data-total="{total:g}" fill="none" '
                f'stroke="{color}" stroke-width="1.6" points="{" ".join(run)}"/>'
            )
        # The key's colour as an SVG attribute: the pages' CSP allows no inline style.
        swatch = f'<svg width="12" height="4" aria-hidden="true"><rect width="12" height="4" fill="{color}"/>'
        swatch += "</svg>"
        legend.append(f'<span class="key">{swatch} {escape(name)}</span>')
        said.append(f"{name} {_label(shown, unit) if shown is not None else 'no data'}")
    end = start + step * max(points - 1, 0)
    middle = start + (end - start) / 2
    form = "%H:%M" if step < timedelta(hours=1) else "%m-%d %H:%M"
    places = ((LEFT, start, "start"), (LEFT + inner_w / 2, middle, "middle"), (WIDTH - RIGHT, end, "end"))
    ticks = "".join(
        f'<text x="{at_x:.0f}" y="{HEIGHT - 6}" text-anchor="{anchor}">{at.strftime(form)}</text>'
        for at_x, at, anchor in places
    )
    summary = f"{title}: " + ", ".join(said) + (" (largest)" if unit else " in all")
    return (
        f'<figure class="chart"><figcaption>{escape(title)} {"".join(legend)}</figcaption>'
        f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
        f'aria-label="{escape(summary)}"><title>{escape(summary)}</title>'
        f'<line x1="{LEFT}" y1="{TOP + inner_h}" x2="{WIDTH - RIGHT}" y2="{TOP + inner_h}" class="axis"/>'
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + inner_h}" class="axis"/>'
        f'<text x="{LEFT - 4}" y="{TOP + 8}" text-anchor="end">{escape(_label(top, unit))}</text>'
        f'<text x="{LEFT - 4}" y="{TOP + inner_h}" text-anchor="end">0</text>'
        f"{ticks}{''.join(lines)}</svg></figure>"
    )
