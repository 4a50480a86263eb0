"""Rollups for the dashboard's charts (app/service/rollups.py): what every replica counts, added to the
minute's rows each metrics interval, and on the way out; drawn on the queue's page."""

import re

import httpx
import pytest

from tests.helpers import enqueue, lease_one, make_dead
from tests.waiting import until

pytestmark = pytest.mark.anyio

TOTALS = "SELECT sum(enqueued), sum(completed), sum(failed), sum(dead) FROM jobq.rollups WHERE queue = $1"


async def _totals(db, queue: str) -> tuple:
    return tuple(int(v or 0) for v in await db.fetchrow(TOTALS, queue))


async def _work(http: httpx.AsyncClient, queue: str) -> None:
    """4 enqueued: 2 completed, 1 nacked back to pending (failed), 1 dead (failed and dead)."""
    await make_dead(http, queue, error="boom")
    for _ in range(2):
        job = await enqueue(http, queue)
        held = await lease_one(http, queue, job["id"])
        token = {"id": job["id"], "lease_token": held["lease_token"]}
        assert (await http.post("/ack", json=token)).is_success
    job = await enqueue(http, queue)
    held = await lease_one(http, queue, job["id"])
    body = {"id": job["id"], "lease_token": held["lease_token"], "retry_after": 3600}
    assert (await http.post("/nack", json=body)).is_success


async def test_two_replicas_add_up_in_the_minute_rows(start_service, db):
    a, b = start_service(metrics_interval=0.1), start_service(metrics_interval=0.1)
    async with httpx.AsyncClient(base_url=a.url) as one, httpx.AsyncClient(base_url=b.url) as two:
        await _work(one, "q")
        await _work(two, "q")
    # enqueued, completed, failed (two nacks and two dead), dead: both replicas' counts.
    await until(lambda: _equal(db, "q", (8, 4, 4, 2)))
    await until(lambda: _lag(db, "q"))


async def _equal(db, queue, expected) -> bool:
    return await _totals(db, queue) == expected


async def _lag(db, queue) -> bool:
    """Whether some row of the queue has a lag (the gauges read it on their own loop, maybe a write
    after the counts)."""
    return await db.fetchval("SELECT max(lag) >= 0 FROM jobq.rollups WHERE queue = $1", queue) is True


async def test_a_replica_writes_its_last_counts_as_it_stops(start_service, db):
    service = start_service(metrics_interval=3600)  # its loop will not write again before it stops
    async with httpx.AsyncClient(base_url=service.url) as http:
        await _work(http, "q")
    service.stop()
    assert await _totals(db, "q") == (4, 2, 2, 1)


async def test_the_queue_page_draws_them(start_service, db):
    service = start_service(metrics_interval=0.1)
    async with httpx.AsyncClient(base_url=service.url) as http:
        await _work(http, "q")
        await until(lambda: _equal(db, "q", (4, 2, 2, 1)))
        await until(lambda: _lag(db, "q"))  # without a lag yet, the page draws no lag line
        for span in ("1h", "1d", "7d"):
            page = (await http.get(f"/ui/queues/q?span={span}")).text
            totals = dict(re.findall(r'data-series="(\w+)" data-total="([\d.]+)"', page))
            assert totals.pop("lag") is not None
            assert totals == {"enqueued": "4", "completed": "2", "failed": "2", "dead": "1"}
            charts = re.findall(r"<figure.*?</figure>", page)
            assert len(charts) == 2 and not [c for c in charts if "http" in c or "<script" in c]
        assert (await http.get("/ui/queues/q?span=2y")).status_code == 422
        queues = (await http.get("/ui")).text
        assert re.search(r'<tr data-queue="q".*?<td class="num completed">2</td>', queues)
