"""A switchover and a failover under load on Patroni (three etcd members, two nodes in synchronous mode:
chaos/patroni.py), checked from the clients' own ledgers, as tests/system/test_failover.py does on
pg_auto_failover."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import asyncpg
import httpx
import pytest

from app.db import migrations
from chaos.patroni import PatroniCluster, missing_packages
from tests.fixtures import tool_missing
from tests.service_process import free_port
from tests.system.test_failover import Ledger
from tests.waiting import until

# The cluster is the test's own, whichever server or pooler the other tests use: once in CI (.ci/run).
pytestmark = [pytest.mark.anyio, pytest.mark.any_server]

SERVING_WITHIN = 15.0  # seconds from the new primary taking writes to the service's first 201


@pytest.fixture
async def patroni() -> AsyncIterator[PatroniCluster]:
    missing = missing_packages()
    if missing:
        tool_missing(f"Patroni's cluster needs {', '.join(missing)} (apt-get install {' '.join(missing)})")
    # Not under pytest's own temporary directory, which only its owner may enter.
    with tempfile.TemporaryDirectory(prefix="jobq-test-patroni-", ignore_cleanup_errors=True) as root:
        os.chmod(root, 0o777)
        made = PatroniCluster(Path(root), port=free_port)
        try:
            await made.up()
            yield made
        finally:
            await asyncio.to_thread(made.down)


def first_201_after(ledger: Ledger, moment: float) -> Callable[[], float | None]:
    """A predicate: when the first enqueue answered 201 after `moment` was answered."""
    return lambda: next((t for t, s in ledger.enqueue_times if t > moment and s == 201), None)


async def timed(fault: Awaitable[str]) -> tuple[str, float]:
    """The new primary's name, and when it took writes."""
    name = await fault
    return name, time.monotonic()


@pytest.mark.slow
async def test_switchover_and_failover_lose_no_acknowledged_enqueue_or_ack(patroni, start_service):
    """Mixed load (2 producers, 16 workers long-polling), then (a) a switchover to the standby, load
    continuing, then (b) the new primary's machine lost (SIGKILL to its Patroni and PostgreSQL) and
    Patroni promoting the old one, now its synchronous standby. From the producers' and workers' own
    ledgers: every enqueue answered 201 exists, every ack answered 200 stays completed, no job is acked
    under two leases, none is lost; the service answers 503 with Retry-After in the gaps, never 500, and
    serves enqueues again within 15 s of the new primary taking writes, after each."""
    await asyncio.to_thread(migrations.upgrade, patroni.dsn)
    service = start_service(
        database_url=patroni.dsn,
        listen_url=patroni.dsn,
        database_pool_mode="session",
        pool_acquire_timeout=1.0,
        statement_timeout=5.0,
        wakeup_safety_interval=1.0,
    )
    ledger = Ledger()
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        r = await client.patch("/queues/ha", json={"visibility_timeout": 5})
        assert r.status_code == 200, r.text

        tasks = ledger.load(client, "ha")
        await asyncio.sleep(3)
        before = len(ledger.enqueued), len(ledger.acked)

        first = await patroni.primary()
        switch_at = time.monotonic()
        second, switched_at = await timed(patroni.switchover())
        switch_serving = await until(first_201_after(ledger, switched_at), timeout=60, every=0.05)
        await asyncio.sleep(3)  # more load on the new primary, while the old one comes back as its standby
        await patroni.wait_replicating(timeout=120)
        between = len(ledger.enqueued), len(ledger.acked)

        lost_at = time.monotonic()
        patroni.lose(second)
        third, promoted_at = await timed(patroni.wait_primary(second, timeout=120))
        fail_serving = await until(first_201_after(ledger, promoted_at), timeout=60, every=0.05)
        await asyncio.sleep(3)  # more load on the last node, alone
        ledger.producing.clear()
        # The workers drain what is left (jobs held by leases lost with the old primary come back as their
        # leases expire).
        db = await asyncpg.connect(patroni.dsn)
        try:
            await until(
                lambda: db.fetchval("SELECT count(*) = 0 FROM jobq.all_jobs WHERE status <> 'completed'"),
                timeout=60,
            )
            ledger.working.clear()
            await asyncio.gather(*tasks)
            # Every job, also those whose enqueue was answered 503 after its commit: workers lease and ack
            # those too.
            rows = await db.fetch("SELECT id, status FROM jobq.all_jobs WHERE queue = 'ha'")
        finally:
            await db.close()
    statuses = {row["id"]: row["status"] for row in rows}
    assert (second, third) == (next(n for n in ("node1", "node2") if n != first), first)
    assert before[0] > 0 and before[1] > 0, "load ran before the switchover"
    assert between[0] > before[0] and between[1] > before[1], "load ran between the switchover and the loss"
    assert ledger.problems == []
    assert set(ledger.statuses) <= {200, 201, 409, 503}, ledger.statuses
    assert ledger.statuses[503] > 0, "a gap was seen"
    assert set(ledger.enqueued) <= set(statuses), "every enqueue answered 201 exists"
    assert {statuses.get(job) for job, _ in ledger.acked} == {"completed"}
    acked = Counter(job for job, _ in ledger.acked)
    assert max(acked.values()) == 1, "no job acked under two leases"
    assert set(statuses.values()) == {"completed"}, "none lost"
    print(
        f"\npatroni switchover {first} -> {second}: taking writes {switched_at - switch_at:.1f} s after it "
        f"was asked for, serving enqueues again {switch_serving - switched_at:.1f} s after that"
        f"\npatroni failover {second} lost -> {third}: taking writes {promoted_at - lost_at:.1f} s after the "
        f"loss, serving enqueues again {fail_serving - promoted_at:.1f} s after that"
        f"\n{len(ledger.enqueued)} enqueues, {len(ledger.acked)} acks "
        f"({len(set(statuses) - set(ledger.enqueued))} jobs committed under a 503), "
        f"answers {dict(ledger.statuses)}"
    )
    assert switch_serving - switched_at <= SERVING_WITHIN, "serving again soon after the switchover"
    assert fail_serving - promoted_at <= SERVING_WITHIN, "serving again soon after the failover"
