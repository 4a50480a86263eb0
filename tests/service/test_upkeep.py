"""Lease expiry (app/service/upkeep.py), called directly on a real database. What HTTP adds on top (status
codes, bodies, headers) is tested in tests/http/ under the same name."""

from __future__ import annotations

import pytest

from app import service
from tests.helpers import row, status_of
from tests.service.calls import ack, enqueue, expire, held, lease

pytestmark = pytest.mark.anyio

# --- background -----------------------------------------------------------------------------------


async def test_expire_leases_returns_expired_jobs_to_pending_or_dead(runtime, db):
    retried = await enqueue(runtime, payload=1)
    last = await enqueue(runtime, payload=2, max_attempts=1)
    kept = await enqueue(runtime, payload=3)
    first, _, _ = await lease(runtime, max_jobs=3)
    assert first["id"] == retried["id"]
    await expire(db, retried["id"])
    await expire(db, last["id"])
    changed = await service.expire_leases(runtime)
    assert sorted((r["id"], r["status"]) for r in changed) == [
        (retried["id"], "pending"),
        (last["id"], "dead"),
    ]
    assert await status_of(db, kept["id"]) == "running"
    assert (await row(db, retried["id"]))["last_error"].startswith("lease expired at ")
    # The late holder may still ack: its work was done.
    await ack(runtime, held(first))
    assert await status_of(db, retried["id"]) == "completed"
    assert await service.expire_leases(runtime) == []
