"""MkDocs hooks: pages made from the code they describe, so that they cannot drift from it.

- `<!-- settings -->` in a page becomes the reference of every setting of app/settings.py's `Settings`:
  its environment variables, its default, and the comment written above it in the class (fields with no
  blank line between them share the comment above the first). A field without a comment fails the build.
- `<!-- performance: bench -->` and `<!-- performance: peers -->` become the tables (and, for the peers,
  a chart) of the runs recorded in docs/data/: `make bench-record` copies the last `make bench` run
  there, and the peers harness's JSON is copied there as peers.json.
- `<!-- chaos -->` becomes the table of the chaos runs recorded in docs/data/chaos.json (`python -m
  chaos.run --record`): per scenario, its faults, operations, jobs and the checker's violations.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SETTINGS_MARKER = "<!-- settings -->"
PERFORMANCE_MARKER = re.compile(r"<!-- performance: (bench|peers) -->")
CHAOS_MARKER = "<!-- chaos -->"
DATA = ROOT / "docs" / "data"


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 - MkDocs' signature
    if SETTINGS_MARKER in markdown:
        markdown = markdown.replace(SETTINGS_MARKER, settings_reference())
    if CHAOS_MARKER in markdown:
        markdown = markdown.replace(CHAOS_MARKER, chaos_table(json.loads((DATA / "chaos.json").read_text())))
    renderers = {"bench": bench_tables, "peers": peers_tables}
    return PERFORMANCE_MARKER.sub(
        lambda m: renderers[m[1]](json.loads((DATA / f"{m[1]}.json").read_text())), markdown
    )


# --- the settings -----------------------------------------------------------------------------------


def setting_groups(source: str) -> list[tuple[list[str], str]]:
    """The fields of class `Settings` in `source`, in order, as groups of field names with the comment
    written above the group's first field."""
    lines = source.splitlines()
    (cls,) = (n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "Settings")
    groups: list[tuple[list[str], str]] = []
    previous_end = None
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            previous_end = None
            continue
        name = node.target.id
        if name == "model_config":
            continue
        above = []
        line = node.lineno - 2  # 0-based index of the line above
        while line >= 0 and lines[line].strip().startswith("#"):
            above.insert(0, lines[line].strip().removeprefix("#").strip())
            line -= 1
        if not above and previous_end == node.lineno - 1 and groups:
            groups[-1][0].append(name)
        else:
            if not above:
                raise ValueError(f"app/settings.py: the setting {name!r} has no comment above it")
            groups.append(([name], " ".join(above)))
        previous_end = node.end_lineno
    return groups


def _environment_names(name: str, field) -> list[str]:
    alias = field.validation_alias
    choices = getattr(alias, "choices", None)
    if choices:
        return [str(c) for c in choices]
    return [f"JOBQ_{name.upper()}"]


def _default(field) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    else:
        value = field.default
    if value is None:
        return "none"
    if isinstance(value, Path):
        return f"`{value}`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, dict | list):
        return f"`{json.dumps(value)}`" if value else "none"
    return f"`{value}`"


def settings_reference() -> str:
    from app.settings import Settings

    source = (ROOT / "app" / "settings.py").read_text()
    fields = Settings.model_fields
    out = []
    for names, comment in setting_groups(source):
        missing = [n for n in names if n not in fields]
        if missing:
            raise ValueError(f"app/settings.py: {missing} are not fields of Settings")
        variables = [v for n in names for v in _environment_names(n, fields[n])]
        out.append(f"### {', '.join(f'`{v}`' for v in variables)}\n")
        defaults = ", ".join(_default(fields[n]) for n in names)
        out.append(f"Default: {defaults}.\n")
        out.append(_linked(comment) + "\n")
    return "\n".join(out)


def _linked(text: str) -> str:
    """A comment as Markdown: its angle brackets as text, setting names and paths as code."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = re.sub(r"(?<![`\w])(JOBQ_[A-Z_*]+)", r"`\1`", text)
    return re.sub(r"(?<![`\w/])((?:app|clients|deploy|tests)/[\w./-]+\w)", r"`\1`", text)


# --- performance ------------------------------------------------------------------------------------


def _number(value: float | None) -> str:
    if value is None:
        return ""
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"


def _label(key: str) -> str:
    return key.replace("_ms", " (ms)").replace("_mb", " (MB)").replace("_", " ")


def _value(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{_label(k)} {_value(v)}" for k, v in value.items())
    return _number(value) if isinstance(value, int | float) and not isinstance(value, bool) else str(value)


def _other(values: dict) -> str:
    """A figure that is not a rate against a reference, as its fields."""
    shown = {k: v for k, v in values.items() if k not in ("scenario", "target")}
    return "; ".join(f"{_label(k)}: {_value(v)}" for k, v in shown.items())


def bench_tables(run: dict) -> str:
    """`make bench`'s recorded run: each figure beside its reference of the same run, with the command
    that measures it again."""
    meta = run["meta"]
    out = [
        f"Recorded {meta['when'][:10]} at commit `{meta.get('commit') or 'unknown'}` on {meta['cpus']} cores "
        f"({meta['machine']}), medians of {run['repeat']} alternating runs, {run['seconds']} s in all.\n",
        "| figure | jobq | reference (same run) | ratio | target | measured by |",
        "|---|---:|---|---:|---|---|",
    ]
    others = []
    for name, values in run["results"].items():
        again = f"`make bench BENCH_ARGS=--only={values['scenario']}`" if "scenario" in values else ""
        if {"jobq", "reference", "ratio"} <= values.keys():
            unit = values.get("unit", "")
            reference = f"{_number(values['reference'])} {unit}: {values.get('reference_is', '')}"
            out.append(
                f"| {name} | {_number(values['jobq'])} {values.get('unit', '')} | {reference} "
                f"| **{_number(values['ratio'])}** | {values.get('target', '')} | {again} |"
            )
        else:
            others.append(f"| {name} | {_other(values)} | {values.get('target', '')} | {again} |")
    if others:
        out += ["", "| figure | measured | target | measured by |", "|---|---|---|---|", *others]
    return "\n".join(out) + "\n"


PEER_SCENARIOS = {
    "E": ("Bulk enqueue", "jobs/s", "higher is better"),
    "D": ("Drain, each system at its recommended high-throughput settings", "jobs/s", "higher is better"),
    "S": ("One job per fetch", "jobs/s", "higher is better"),
    "L": ("Pickup, enqueue to handler start, p50", "ms", "lower is better"),
}


def peers_tables(run: dict) -> str:
    """The peers harness's recorded run: per scenario, each system's variants with their ratio to jobq's
    reference variant of the same run, and a chart of the drains."""
    meta = run["meta"]
    versions = ", ".join(f"{k} {v}" for k, v in meta["versions"].items() if k not in ("jobq_commit",))
    out = [
        f"Recorded {meta['when'][:10]} at commit `{meta['versions'].get('jobq_commit', 'unknown')}`: "
        f"{meta['n']:,} no-op jobs per drain, {meta['repeat']} round(s), on {meta['cpus']} cores "
        f"({meta['machine']}). Versions: {versions}.\n"
    ]
    rows = [r for r in run["rows"] if not r["variant"].endswith("@end")]
    for code, (title, unit, better) in PEER_SCENARIOS.items():
        chosen = [r for r in rows if r["scenario"] == code]
        if not chosen:
            continue
        out += [
            f"### {title}\n",
            f"| system | how | {unit} | vs jobq ({better}) |",
            "|---|---|---:|---:|",
        ]
        for r in chosen:
            value, ratio = (_number(r["value"]), _number(r["ratio"])) if r["ok"] else ("failed", "")
            out.append(f"| {r['system']} | {r['label']} | {value} | {ratio} |")
        out.append("")
        if code == "D":
            out.append(_bars(chosen, unit))
    if any(not r["ok"] for r in rows):
        out.append(
            "A row marked failed did not pass the harness's checks (every job run once, none left): its "
            "figure is not shown, nor drawn.\n"
        )
    controls = [r for r in run["rows"] if r["variant"].endswith("@end")]
    if controls:
        drift = ", ".join(f"{r['label']} {_number(r['ratio'])}" for r in controls)
        out.append(f"jobq's figures measured again at the end of the run, as ratios to its start: {drift}.\n")
    return "\n".join(out)


def _bars(rows: list[dict], unit: str) -> str:
    """A horizontal bar chart, in SVG, of each system's best variant."""
    best: dict[str, dict] = {}
    for r in rows:
        if r["ok"] and r["value"] > best.get(r["system"], {"value": -1})["value"]:
            best[r["system"]] = r
    ordered = sorted(best.values(), key=lambda r: -r["value"])
    top = max(r["value"] for r in ordered)
    bar, gap, label, width = 22, 8, 150, 420
    height = len(ordered) * (bar + gap)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{label + width + 90}" height="{height}" '
        f'aria-label="Drain rate by system, {unit}" style="font: 13px sans-serif">'
    ]
    for n, r in enumerate(ordered):
        y = n * (bar + gap)
        length = max(1, round(width * r["value"] / top))
        fill = "#3f51b5" if r["system"] == "jobq" else "#9e9e9e"
        parts += [
            f'<text x="{label - 8}" y="{y + bar * 0.7:.0f}" text-anchor="end">{r["system"]}</text>',
            f'<rect x="{label}" y="{y}" width="{length}" height="{bar}" fill="{fill}">'
            f"<title>{r['label']}</title></rect>",
            f'<text x="{label + length + 6}" y="{y + bar * 0.7:.0f}">{_number(r["value"])}</text>',
        ]
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


# --- the chaos runs -----------------------------------------------------------------------------------

CHAOS_ORDER = ("none", "kill", "pause", "restart", "partition", "delay", "mixed", "failover", "patroni")


def chaos_table(runs: dict) -> str:
    """The recorded chaos runs (chaos/run.py), a row per scenario: what was injected, how much was done,
    and what the checker found; then the promotions of the failover scenarios."""
    out = [
        "| scenario | faults injected | seconds | operations (ok / fail / info) | jobs | violations "
        "| recorded |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    promotions = []
    for name in sorted(runs, key=lambda n: CHAOS_ORDER.index(n) if n in CHAOS_ORDER else len(CHAOS_ORDER)):
        run = runs[name]
        faults = ", ".join(f"{kind} ×{n}" for kind, n in run["faults"].items()) or "none"
        outcomes = run["outcomes"]
        counts = " / ".join(f"{outcomes.get(k, 0):,}" for k in ("ok", "fail", "info"))
        out.append(
            f"| `{name}` | {faults} | {run['seconds']:.0f} | {run['operations']:,} ({counts}) "
            f"| {run['jobs']:,} | **{run['violations']}** | {run['date']}, seed {run['seed']} |"
        )
        for promotion in run.get("promotions", []):
            after = promotion["serving_after"]
            promotions.append(
                f"| `{name}` | {promotion['fault']} | {promotion['seconds']:.1f} s "
                f"| {'not seen' if after is None else f'{after:.2f} s'} |"
            )
    if promotions:
        out += [
            "",
            "| scenario | fault | from the fault to a new primary taking writes | then to jobq's next 201 |",
            "|---|---|---:|---:|",
            *promotions,
        ]
    return "\n".join(out) + "\n"
