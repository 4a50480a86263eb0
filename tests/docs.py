"""The documentation's pages (docs/, in the order of mkdocs.yml's nav) and the examples in them, for the
tests that run them. An example is a fenced block after a marker `<!-- <kind>: <name> -->`; each name is
in one place only."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _flatten(nav: list) -> list[str]:
    pages: list[str] = []
    for entry in nav:
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            pages += _flatten(value) if isinstance(value, list) else [value]
    return pages


@cache
def pages() -> tuple[Path, ...]:
    """The pages, in the order a reader meets them."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    return tuple(DOCS / page for page in _flatten(config["nav"]))


def text() -> str:
    """Every page, one after another."""
    return "\n".join(page.read_text() for page in pages())


def block(name: str, kind: str = "clients") -> str:
    """The block marked `<!-- <kind>: <name> -->`."""
    found = re.findall(rf"<!-- {kind}: {re.escape(name)} -->\s*```\w+\n(.*?)```", text(), re.S)
    assert len(found) == 1, f"the documentation has {len(found)} blocks marked {kind}: {name}, not one"
    return found[0]
