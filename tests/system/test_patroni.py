"""A switchover and a failover under load on Patroni (three etcd members, two nodes in synchronous mode:
chaos/patroni.py), checked from the clients' own ledgers, as tests/system/test_failover.py does on
pg_auto_failover."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import httpx
import pytest

from app.db import migrations
from chaos.patroni import PatroniCluster, missing_packages
from tests.fixtures import tool_missing
from tests.service_process import free_port
from tests.system.test_failover import HA_SETTINGS, Ledger
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
    service = start_service(database_url=patroni.dsn, listen_url=patroni.dsn, **HA_SETTINGS)
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
        switch_serving = await until(ledger.serving_after(switched_at), timeout=60, every=0.05)
        await asyncio.sleep(3)  # more load on the new primary, while the old one comes back as its standby
        await patroni.wait_replicating(timeout=120)
        between = len(ledger.enqueued), len(ledger.acked)

        lost_at = time.monotonic()
        patroni.lose(second)
        third, promoted_at = await timed(patroni.wait_primary(second, timeout=120))
        fail_serving = await until(ledger.serving_after(promoted_at), timeout=60, every=0.05)
        await asyncio.sleep(3)  # more load on the last node, alone
        statuses = await ledger.drain(patroni.dsn, tasks)
    assert (second, third) == (next(n for n in ("node1", "node2") if n != first), first)
    assert before[0] > 0 and before[1] > 0, "load ran before the switchover"
    assert between[0] > before[0] and between[1] > before[1], "load ran between the switchover and the loss"
    ledger.check(statuses)
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
