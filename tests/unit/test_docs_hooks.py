"""The documentation's made pages (docs/hooks.py): the settings reference and the performance tables."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
hooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hooks)

SETTINGS = """
class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="JOBQ_")

    # Where it listens.
    host: str = "127.0.0.1"
    port: int = 8000

    # How long, in
    # seconds.
    timeout: float = 5.0

    @field_validator("timeout")
    def _timeout(cls, value): ...

    # After a method.
    last: int = 1
"""


def test_fields_without_a_blank_line_between_share_the_comment_above_the_first():
    assert hooks.setting_groups(SETTINGS) == [
        (["host", "port"], "Where it listens."),
        (["timeout"], "How long, in seconds."),
        (["last"], "After a method."),
    ]


def test_a_setting_without_its_comment_fails_the_build():
    with pytest.raises(ValueError, match="'bare' has no comment"):
        hooks.setting_groups(SETTINGS + "\n    bare: int = 2\n")


def test_the_settings_reference_names_every_variable_and_escapes_brackets():
    reference = hooks.settings_reference()
    assert "### `JOBQ_DATABASE_URL`, `DATABASE_URL`" in reference
    assert "### `JOBQ_HOST`, `JOBQ_PORT`\n\nDefault: `127.0.0.1`, `8000`." in reference
    assert '{"&lt;token&gt;": "&lt;role&gt;"}' in reference


META = {"when": "2026-11-28T22:00:00Z", "machine": "Linux", "cpus": 2, "commit": "abc1234"}


def test_bench_figures_go_beside_their_reference_with_the_command_that_measures_them():
    run = {
        "meta": META,
        "seconds": 600,
        "repeat": 3,
        "results": {
            "drain, lease 1 + ack 1": {
                "jobq": 3332.0,
                "reference": 3548.0,
                "ratio": 0.939,
                "unit": "jobs/s",
                "reference_is": "raw claim + ack",
                "target": ">= 0.8",
                "scenario": "drain_single",
            },
            "pickup latency": {
                "jobq": {"p50_ms": 3.61, "n": 200},
                "target": "p50 <= 10 ms",
                "scenario": "pickup",
            },
        },
    }
    tables = hooks.bench_tables(run)
    assert "Recorded 2026-11-28 at commit `abc1234` on 2 cores" in tables
    assert (
        "| drain, lease 1 + ack 1 | 3,332 jobs/s | 3,548 jobs/s: raw claim + ack | **0.939** | >= 0.8 "
        "| `make bench BENCH_ARGS=--only=drain_single` |"
    ) in tables
    assert (
        "| pickup latency | jobq: p50 (ms) 3.61, n 200 | p50 <= 10 ms "
        "| `make bench BENCH_ARGS=--only=pickup` |" in tables
    )


def test_peers_tables_and_chart():
    def row(system, scenario, variant, value, ratio, ok=True):
        return {"system": system, "scenario": scenario, "variant": variant, "label": variant, "value": value,
                "ratio": ratio, "ok": ok}  # fmt: skip

    run = {
        "meta": META | {"n": 20000, "repeat": 3, "versions": {"bullmq": "6.7.0", "jobq_commit": "abc1234"}},
        "rows": [
            row("jobq", "D", "lease100", 20000.0, 1.0),
            row("bullmq", "D", "c100", 15000.0, 0.75),
            row("bullmq", "D", "c50", 30000.0, 1.5, ok=False),
            row("jobq", "L", "longpoll", 3.5, 1.0),
            row("jobq", "D", "lease100@end", 19000.0, 0.95),
        ],
    }
    tables = hooks.peers_tables(run)
    assert "20,000 no-op jobs per drain, 3 round(s)" in tables and "bullmq 6.7.0" in tables
    assert "| bullmq | c100 | 15,000 | 0.75 |" in tables and "| bullmq | c50 | failed |  |" in tables
    assert "| jobq | longpoll | 3.5 | 1 |" in tables and "A row marked failed" in tables
    assert "lease100@end" in tables.split("<svg")[-1]  # the control is told after the tables, not in them
    chart = tables[tables.index("<svg") : tables.index("</svg>")]
    # A failed variant draws no bar; jobq's bar is the full width, bullmq's three quarters of it.
    assert chart.index(">jobq<") < chart.index(">bullmq<")
    assert (
        'width="420" height="22" fill="#3f51b5"' in chart
        and 'width="315" height="22" fill="#9e9e9e"' in chart
    )


def test_chaos_runs_in_scenario_order_with_their_promotions():
    run = {
        "date": "2026-12-07",
        "seed": 7,
        "seconds": 60.2,
        "faults": {},
        "promotions": [],
        "jobs": 1200,
        "operations": 9000,
        "outcomes": {"ok": 8000, "fail": 990, "info": 10},
        "violations": 0,
    }
    failover = {
        **run,
        "faults": {"switchover": 1, "failover": 1},
        "promotions": [
            {"fault": "switchover", "seconds": 2.2, "serving_after": 0.01},
            {"fault": "failover", "seconds": 13.3, "serving_after": None},
        ],
    }
    table = hooks.chaos_table({"patroni": failover, "none": run})
    lines = table.splitlines()
    assert lines[2].startswith("| `none` | none | 60 | 9,000 (8,000 / 990 / 10) | 1,200 | **0** |")
    assert lines[3].startswith("| `patroni` | switchover ×1, failover ×1 |")
    assert "| `patroni` | switchover | 2.2 s | 0.01 s |" in lines
    assert "| `patroni` | failover | 13.3 s | not seen |" in lines
