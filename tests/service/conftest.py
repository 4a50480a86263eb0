"""Fixtures of the service-layer tests."""

from collections.abc import AsyncIterator

import pytest

from app.service.runtime import Runtime
from tests.helpers import open_runtime


@pytest.fixture
async def runtime(database_url: str) -> AsyncIterator[Runtime]:
    """The process's state over a pool on the test's database, as the lifespan builds it (its background
    loops and wake-ups not started)."""
    async with open_runtime(database_url) as runtime:
        yield runtime
