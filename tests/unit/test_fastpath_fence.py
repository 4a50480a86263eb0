"""FastAPI's and uvicorn's internals (what they do not document as their API: a route's ``dependant`` and
``body_field``, a request's ``_body``, uvicorn's protocol classes) are used in app/http/fastpath alone, so
that an upgrade of either that changes them breaks one package, whose tests say so."""

import re
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app"
FENCED = APP / "http" / "fastpath"
INTERNALS = re.compile(
    r"\.dependant\b|\.body_field\b|\._body\b|uvicorn\.protocols|fastapi\.dependencies|fastapi\._compat"
)


def test_only_the_fast_path_reaches_into_fastapi_and_uvicorn():
    outside = [
        f"{path.relative_to(APP)}:{n}: {line.strip()}"
        for path in APP.rglob("*.py")
        if FENCED not in path.parents
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if INTERNALS.search(line) and not line.lstrip().startswith("#")
    ]
    assert not outside, "\n".join(outside)


def test_the_fence_sees_the_fast_path_s_own_uses():
    # The pattern must match what the fast path really does, or the test above proves nothing.
    inside = "".join(path.read_text() for path in FENCED.rglob("*.py"))
    assert INTERNALS.search(inside)
    for use in (".dependant", ".body_field", "._body", "uvicorn.protocols"):
        assert use in inside, use
