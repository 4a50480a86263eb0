"""Keyed flow control (app/service/flow.py): per-key concurrency and order, fair turns, rates and per-key
overrides, enforced by the lease across replicas, over HTTP against real services and a real database."""

from __future__ import annotations

import asyncio
import bisect
import importlib
import itertools
import os
import time
from urllib.parse import quote

import asyncpg
import httpx
import pytest

from app.db import sql as q
from tests.helpers import ADVISORY_LOCKS_HERE, STATUS_HISTORY, assert_problem, front_claim_statements

pytestmark = pytest.mark.anyio

# With the safety poll a minute away, only a notification or a rate timer can wake a long-poll in time.
QUIET = {"wakeup_safety_interval": 60.0}


@pytest.fixture
def replicas(start_service):
    return start_service(**QUIET), start_service(**QUIET)


@pytest.fixture
async def a(replicas):
    async with httpx.AsyncClient(base_url=replicas[0].url, timeout=60) as http:
        yield http


@pytest.fixture
async def b(replicas):
    async with httpx.AsyncClient(base_url=replicas[1].url, timeout=60) as http:
        yield http


async def configure(http, queue="f", **settings):
    r = await http.patch(f"/queues/{queue}", json=settings)
    assert r.status_code == 200, r.text
    return r.json()["settings"]


async def enqueue(http, jobs: list[dict], queue="f") -> list[int]:
    r = await http.post("/jobs/batch", json={"jobs": [{"queue": queue, "payload": None} | j for j in jobs]})
    assert r.status_code == 201, r.text
    return [j["id"] for j in r.json()["jobs"]]


async def lease(http, n=1, queue="f", **body) -> list[dict]:
    r = await http.post("/lease", json={"queue": queue, "max_jobs": n} | body)
    assert r.status_code == 200, r.text
    return r.json()["jobs"]


async def ack(http, job, **body):
    r = await http.post("/ack", json={"id": job["id"], "lease_token": job["lease_token"]} | body)
    return r


async def running_per_key(db, queue="f") -> dict[str, int]:
    rows = await db.fetch(
        "SELECT key, count(*) AS n FROM jobq.all_jobs WHERE queue = $1 AND status = 'running' GROUP BY key",
        queue,
    )
    return {r["key"]: r["n"] for r in rows}


# --- settings ------------------------------------------------------------------------------------------


async def test_settings_are_set_kept_and_cleared(a):
    settings = await configure(a, key_concurrency=2, fair=True, rate={"limit": 10, "period": 1.5})
    assert (settings["key_concurrency"], settings["fair"], settings["rate"], settings["key_rate"]) == (
        2,
        True,
        {"limit": 10, "period": 1.5},
        None,
    )
    # Absent keeps; null clears.
    settings = await configure(a, key_rate={"limit": 5, "period": 60}, visibility_timeout=10)
    assert (settings["key_concurrency"], settings["fair"], settings["key_rate"]) == (
        2,
        True,
        {"limit": 5, "period": 60},
    )
    settings = await configure(a, key_concurrency=None, fair=None, rate=None, key_rate=None)
    assert (settings["key_concurrency"], settings["fair"], settings["rate"], settings["key_rate"]) == (
        None,
        False,
        None,
        None,
    )
    assert settings["visibility_timeout"] == 10


@pytest.mark.parametrize(
    "body",
    [
        {"key_concurrency": 0},
        {"key_concurrency": "two"},
        {"rate": {"limit": 0, "period": 1}},
        {"rate": {"limit": 5, "period": 0}},
        {"rate": {"limit": 5}},
        {"key_rate": {"limit": 5, "period": 86401}},
        {"fair": "sometimes"},
    ],
)
async def test_bad_settings_are_refused_and_change_nothing(a, body):
    await configure(a, key_concurrency=3)
    r = await a.patch("/queues/f", json=body)
    assert_problem(r, 422, "validation_error")
    assert (await a.get("/queues/f")).json()["settings"]["key_concurrency"] == 3


async def test_a_queue_without_settings_takes_the_plain_lease(a, db):
    await enqueue(a, [{"key": "k"}] * 3)
    assert len(await lease(a, 3)) == 3
    assert await db.fetchval("SELECT flow FROM jobq.queues WHERE name = 'f'") is False


# --- concurrency -----------------------------------------------------------------------------------------


async def test_key_concurrency_holds_across_replicas_under_concurrent_leases(a, b, db):
    await configure(a, key_concurrency=2)
    # Jobs without a key first: they are taken from the front of the queue only (app/service/flow.py).
    await enqueue(a, [{}] * 5 + [{"key": f"k{i % 10}"} for i in range(100)])
    leases = [lease(http, 3) for http in (a, b) for _ in range(20)]
    leased = [job for jobs in await asyncio.gather(*leases) for job in jobs]
    assert all(n <= 2 for key, n in (await running_per_key(db)).items() if key is not None)
    # A claim that passes over keys a claim of the other replica holds comes back short (a long-poll
    # looks again, a call without `wait` answers what it has): what the burst left, leases one after
    # the other take.
    for http in [a, b] * 10:
        if len(leased) >= 25:
            break
        leased += await lease(http, 3)
    per_key = await running_per_key(db)
    assert per_key == {f"k{i}": 2 for i in range(10)} | {None: 5}
    assert len(leased) == len({j["id"] for j in leased}) == 25
    assert all(j["key"] in (None, *(f"k{i}" for i in range(10))) for j in leased)


async def test_a_lease_looks_past_full_keys_for_keys_with_room(a, db):
    """Forty full keys come first in the walk; the ten keys with room after them are found by the same
    call (a claim that came back short with every key it walked to locked walks on from where it
    stopped), where a claim that walked its keys once answered nothing."""
    await configure(a, key_concurrency=1)
    await db.execute(
        """INSERT INTO jobq.jobs (queue, key, payload, status, attempts, lease_token, lease_expires_at)
           SELECT 'f', 'b' || lpad(g::text, 2, '0'), 'null', 'running', 1, gen_random_uuid(),
                  now() + interval '1 hour'
           FROM generate_series(0, 39) g"""
    )
    await enqueue(a, [{"key": f"b{i:02}"} for i in range(40)] + [{"key": f"c{i:02}"} for i in range(10)])
    leased = await lease(a, 10)
    assert sorted(j["key"] for j in leased) == [f"c{i:02}" for i in range(10)]
    assert set((await running_per_key(db)).values()) == {1}


async def test_under_key_concurrency_a_lease_follows_lease_order_across_keys(a):
    """Without `fair`, a queue under key concurrency hands out ready jobs in lease order (priority,
    run_at, id) across its keys, as a queue without limits does: the urgent jobs of the last keys go
    first, not the first keys' jobs (a claim takes the front of the queue, not a stretch of keys)."""
    await configure(a, key_concurrency=2)
    await enqueue(a, [{"key": f"k{i:02}"} for i in range(30)])
    urgent = await enqueue(a, [{"key": f"k{i:02}", "priority": -1} for i in (27, 28, 29)])
    assert [j["id"] for j in await lease(a, 3)] == urgent


async def test_a_key_with_a_backlog_at_the_front_holds_up_no_other_key(a, db):
    """The front of the queue is one key's backlog, full after its first job: the claim finds the other
    keys beyond it in the same call, and so do the claims after it."""
    await configure(a, key_concurrency=1)
    await enqueue(a, [{"key": "hot"}] * 200 + [{"key": f"k{i}"} for i in range(5)])
    leased = await lease(a, 6)
    assert sorted(j["key"] for j in leased) == ["hot", "k0", "k1", "k2", "k3", "k4"]
    for job in leased:
        assert (await ack(a, job)).status_code == 200
    await enqueue(a, [{"key": f"k{i}"} for i in range(5, 10)])
    leased = await lease(a, 6)
    assert sorted(j["key"] for j in leased) == ["hot", "k5", "k6", "k7", "k8", "k9"]
    assert set((await running_per_key(db)).values()) == {1}


async def test_an_ack_frees_the_slot_once_and_a_late_ack_frees_nothing(a, db):
    await configure(a, key_concurrency=1)
    first, second, third = await enqueue(a, [{"key": "k"}] * 3)
    (job,) = await lease(a, 5, visibility_timeout=0.2)
    assert job["id"] == first
    assert await lease(a, 5) == []
    # The lease expires: the job is back, first in line (its retry holds the key), leased again.
    await asyncio.sleep(0.3)
    await db.fetch(q.EXPIRE_LEASES.text, *q.EXPIRE_LEASES.args(batch=10, queue=None))
    (again,) = await lease(a, 5)
    assert again["id"] == first and again["attempts"] == 2
    # The late ack of the expired lease changes nothing (the job was leased again): the key stays held.
    r = await ack(a, job)
    assert_problem(r, 409, "lease_lost")
    assert await lease(a, 5) == []
    assert (await ack(a, again)).status_code == 200
    (next_job,) = await lease(a, 5)
    assert next_job["id"] == second
    assert await running_per_key(db) == {"k": 1}
    assert third


async def test_in_order_a_retry_holds_its_key_until_it_has_run(a):
    await configure(a, key_concurrency=1)
    ids = await enqueue(a, [{"key": "k", "payload": i} for i in range(4)])
    (job,) = await lease(a)
    r = await a.post("/nack", json={"id": job["id"], "lease_token": job["lease_token"], "retry_after": 0.5})
    assert r.status_code == 200, r.text
    assert await lease(a, 4) == []  # the retry waits, and holds the key: nothing overtakes it
    await asyncio.sleep(0.6)
    seen = []
    while len(seen) < 4:
        (job,) = await lease(a, 4)
        seen.append(job["id"])
        assert (await ack(a, job)).status_code == 200
    assert seen == ids


@pytest.mark.parametrize("fair", [False, True], ids=["in_order", "fair"])
async def test_in_order_a_sleeping_or_parked_job_holds_its_key_and_its_place(a, fair):
    """A job of an in-order key that has begun holds the key until it ends, also while it sleeps (a
    release with a delay) or waits for an event, and keeps its place once it wakes; a release without a
    delay keeps its place too (found by the chaos checker: released jobs let later ones of their key
    overtake them)."""
    await configure(a, key_concurrency=1, fair=fair)
    ids = await enqueue(a, [{"key": "k", "payload": i} for i in range(3)])

    async def only_the_first() -> dict:
        jobs = await lease(a, 3)
        assert [j["id"] for j in jobs] == ids[:1]
        return jobs[0]

    job = await only_the_first()
    held = {"id": job["id"], "lease_token": job["lease_token"]}
    r = await a.post("/release", json={"items": [{**held, "delay": 0.5}]})
    assert r.json()["results"] == [{"id": ids[0], "ok": True}]
    assert await lease(a, 3) == []  # asleep, and holding the key
    await asyncio.sleep(0.6)
    job = await only_the_first()
    held = {"id": job["id"], "lease_token": job["lease_token"]}
    await_body = {"lease_token": job["lease_token"], "event": "go", "timeout": 60}
    r = await a.post(f"/jobs/{ids[0]}/await", json=await_body)
    assert r.json()["status"] == "waiting", r.text
    assert await lease(a, 3) == []  # parked on its event, and holding the key
    assert (await a.post("/events", json={"name": "go"})).json()["woken"] == 1
    job = await only_the_first()  # woken, its run_at now later than the others': still first
    held = {"id": job["id"], "lease_token": job["lease_token"]}
    r = await a.post("/release", json={"items": [{**held, "delay": 0}]})
    assert r.json()["results"] == [{"id": ids[0], "ok": True}]
    seen = []
    while len(seen) < 3:
        (job,) = await lease(a, 3)
        seen.append(job["id"])
        assert (await ack(a, job)).status_code == 200
    assert seen == ids


async def test_dead_and_cancelled_jobs_do_not_hold_a_key(a):
    await configure(a, key_concurrency=1, max_attempts=1)
    first, second, third = await enqueue(a, [{"key": "k"}] * 3)
    (job,) = await lease(a)
    r = await a.post("/nack", json={"id": job["id"], "lease_token": job["lease_token"]})
    assert r.json()["status"] == "dead"
    assert (await a.delete(f"/jobs/{second}")).status_code == 200
    (job,) = await lease(a, 3)
    assert job["id"] == third


async def test_a_long_poll_blocked_by_a_key_wakes_when_a_job_of_it_ends(a, b):
    await configure(a, key_concurrency=1)
    await enqueue(a, [{"key": "k"}] * 2)
    (job,) = await lease(a)
    waiting = asyncio.create_task(lease(a, 1, wait=20))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    assert (await ack(b, job)).status_code == 200  # on the other replica
    started = time.monotonic()
    (woken,) = await waiting
    assert woken["key"] == "k" and time.monotonic() - started < 10


async def test_jobs_without_a_key_are_not_limited(a, db):
    await configure(a, key_concurrency=1)
    await enqueue(a, [{}] * 4 + [{"key": "k"}] * 2)
    leased = await lease(a, 10)
    assert sorted((j["key"] or "") for j in leased) == ["", "", "", "", "k"]


async def test_settings_reach_the_other_replica_by_notification(a, b, db):
    """b caches whether the queue is under flow control and drops it on the settings' notification, which
    may land a moment after a's PATCH answered. Until then b's claim leaves the queue alone (each claim
    statement checks the queue's row), so a limit always holds at once; jobs held back that way come with
    the notification's wake-up, which the long-poll of the last lease waits for."""
    await enqueue(a, [{"key": "k"}] * 3)
    assert len(await lease(b, 1)) == 1  # b has read the queue: no flow control
    await configure(a, key_concurrency=1)
    await enqueue(a, [{"key": "m"}])
    assert [j["key"] for j in await lease(b, 3, wait=10)] == ["m"]  # k holds its one slot
    await configure(a, key_concurrency=None)
    assert [j["key"] for j in await lease(b, 3, wait=10)] == ["k", "k"]


# --- overrides and the per-key view ------------------------------------------------------------------------


async def test_a_key_override_replaces_the_queue_setting(a, db):
    await configure(a, key_concurrency=1)
    r = await a.put("/queues/f/keys/big customer", json={"concurrency": 3})
    assert r.status_code == 200, r.text
    assert r.json() == {
        "queue": "f",
        "key": "big customer",
        "concurrency": 3,
        "rate": None,
        "pending": 0,
        "running": 0,
    }
    await enqueue(a, [{"key": "big customer"}] * 5 + [{"key": "small"}] * 5)
    await lease(a, 10)
    assert await running_per_key(db) == {"big customer": 3, "small": 1}
    view = (await a.get("/queues/f/keys/big customer")).json()
    assert (view["pending"], view["running"]) == (2, 3)
    listed = (await a.get("/queues/f/keys", params={"limit": 1})).json()["keys"]
    assert [k["key"] for k in listed] == ["small"]  # 4 waiting, the most
    deleted = await a.delete("/queues/f/keys/big customer")
    assert deleted.json() == {"queue": "f", "key": "big customer", "deleted": True}
    assert_problem(await a.delete("/queues/f/keys/big customer"), 404, "not_found")
    assert (await a.get("/queues/f/keys/big customer")).json()["concurrency"] is None


async def test_any_key_can_be_addressed_in_the_path(a, db):
    """A key is any text of 1-256 characters: a line break or a '/' in it still names the key."""
    for key in ("line\nbreak", "a/b", "tab\tand\r\n", "\n"):
        path = f"/queues/f/keys/{quote(key, safe='')}"
        r = await a.put(path, json={"concurrency": 2})
        assert r.status_code == 200, r.text
        assert r.json()["key"] == key
        assert (await a.get(path)).json()["concurrency"] == 2
        assert (await a.delete(path)).json()["deleted"] is True
        assert_problem(await a.get(path), 404, "not_found")  # no jobs, no overrides: no such key


async def test_an_override_alone_puts_a_queue_under_flow_control(a, db):
    await enqueue(a, [{"key": "k"}] * 3)
    await a.put("/queues/f/keys/k", json={"concurrency": 1})
    assert len(await lease(a, 3)) == 1
    await a.delete("/queues/f/keys/k")
    assert len(await lease(a, 3)) == 2
    assert await db.fetchval("SELECT flow FROM jobq.queues WHERE name = 'f'") is False


async def test_unknown_key_is_404_and_bad_bodies_are_422(a):
    assert_problem(await a.get("/queues/f/keys/nobody"), 404, "not_found")
    assert_problem(await a.put("/queues/f/keys/k", json={"concurrency": 0}), 422, "validation_error")
    assert_problem(await a.put("/queues/f/keys/" + "x" * 257, json={}), 422, "validation_error")
    assert_problem(await a.get("/queues/f/keys", params={"limit": 0}), 422, "validation_error")


# --- fairness and rates -------------------------------------------------------------------------------------


async def test_fair_hands_out_jobs_across_keys_in_turn(a):
    await configure(a, fair=True)
    await enqueue(a, [{"key": "big"}] * 300)
    small = await enqueue(a, [{"key": "small"}] * 3)
    leased = await lease(a, 6)
    assert [j["key"] for j in leased].count("small") == 3
    # Without `fair`, the backlog goes first.
    await configure(a, fair=None)
    await enqueue(a, [{"key": "late"}])
    assert {j["key"] for j in await lease(a, 6)} == {"big"}
    assert small


# One key's backlog, then a few jobs of another key: with `fair`, the few go in turn with the backlog, one
# of the backlog's jobs between two of theirs, whatever the size of the claims, across calls and replicas.
BACKLOG, FEW = 1000, 5


async def backlog_then_few(http, **limits) -> None:
    await configure(http, fair=True, **limits)
    await enqueue(http, [{"key": "big"}] * BACKLOG)
    await enqueue(http, [{"key": "small"}] * FEW)


def waits_of_small(keys: list[str]) -> list[int]:
    """For each of small's jobs in the order leased, how many of big's were leased since the one before."""
    waits, since = [], 0
    for key in keys:
        if key == "small":
            waits.append(since)
            since = 0
        else:
            since += 1
    return waits


@pytest.mark.parametrize(
    "max_jobs, limits",
    [
        (1, {}),
        (3, {}),
        (1, {"key_concurrency": 2}),
        (1, {"rate": {"limit": 100, "period": 60}}),
        (1, {"key_rate": {"limit": 100, "period": 60}}),
    ],
    ids=["one", "three", "key-concurrency", "rate", "key-rate"],
)
async def test_fair_turns_go_on_from_one_lease_to_the_next(a, max_jobs, limits):
    await backlog_then_few(a, **limits)
    keys: list[str] = []
    while len(keys) < 12:
        jobs = await lease(a, max_jobs)
        for job in jobs:
            assert (await ack(a, job)).status_code == 200
        keys += [j["key"] for j in jobs]
    assert waits_of_small(keys) == [1] * FEW, keys


async def test_fair_turns_hold_across_replicas(a, b):
    await backlog_then_few(a)
    keys = [j["key"] for n in range(12) for j in await lease((a, b)[n % 2])]
    assert waits_of_small(keys) == [1] * FEW, keys


@pytest.mark.slow
async def test_fair_turns_hold_under_concurrent_one_job_leases(a, b, db):
    """Workers on both replicas leasing one job at a time, at once: in the order the leases ran (the
    jobs' status history), small's jobs all go within the first twelve leases, at most two of big's
    between two of theirs (a claim that takes several calls' slots leases its jobs in one statement)."""
    await db.execute(STATUS_HISTORY)
    await backlog_then_few(a)
    tickets = iter(range(12))

    async def work(http) -> None:
        while next(tickets, None) is not None:
            (job,) = await lease(http, 1, wait=10)

    await asyncio.gather(*(work(http) for http in (a, b) for _ in range(3)))
    rows = await db.fetch("SELECT key FROM public.history WHERE new = 'running' ORDER BY seq")
    keys = [r["key"] for r in rows]
    assert len(keys) == 12
    waits = waits_of_small(keys)
    assert len(waits) == FEW and max(waits) <= 2, keys


async def test_a_key_rate_holds_and_a_blocked_long_poll_wakes_when_the_window_moves(a):
    await configure(a, key_rate={"limit": 3, "period": 1})
    await enqueue(a, [{"key": "k"}] * 10 + [{"key": "other"}])
    first = await lease(a, 10)
    assert sorted(j["key"] for j in first) == ["k", "k", "k", "other"]
    assert await lease(a, 10) == []
    started = time.monotonic()
    woken = await lease(a, 10, wait=20)
    assert [j["key"] for j in woken] == ["k"] * 3
    assert time.monotonic() - started < 10  # the window's timer, not the safety poll a minute away


async def test_a_queue_rate_counts_every_lease_of_the_queue(a, b):
    await configure(a, rate={"limit": 4, "period": 30})
    await enqueue(a, [{"key": f"k{i}"} for i in range(5)] + [{}] * 5)
    got = await asyncio.gather(lease(a, 3), lease(b, 3), lease(a, 3), lease(b, 3))
    assert sum(len(jobs) for jobs in got) == 4


# The rates' full size (a key at 100 leases a minute, and a queue, under ten minutes of backlog) is the
# next test at JOBQ_RATE_FULL=1; by default, 10 leases every 2 s for five windows.
RATE_LIMIT, RATE_PERIOD, RATE_WINDOWS = (100, 60.0, 10) if os.environ.get("JOBQ_RATE_FULL") else (10, 2.0, 5)


@pytest.mark.slow
async def test_rates_hold_window_after_window_under_a_backlog(a, b, db):
    """A queue with `key_rate` (two keys) and one with `rate`, each with more jobs than the windows let
    go, leased by long-polls on both replicas. From the history of leases: no `period` seconds hold more
    than `limit` leases (of a key; of the queue), and every window of `period` seconds from the first
    lease holds at least 95 % of `limit`: a long-poll blocked by a rate wakes when its window moves."""
    await db.execute(STATUS_HISTORY)
    limit, period = RATE_LIMIT, RATE_PERIOD
    await configure(a, "kr", key_rate={"limit": limit, "period": period})
    await configure(a, "qr", rate={"limit": limit, "period": period})
    backlog = 2 * limit * (RATE_WINDOWS + 2)
    for start in range(0, backlog, 1000):
        n = min(1000, backlog - start)
        await enqueue(a, [{"key": f"k{i % 2}"} for i in range(n)], queue="kr")
        await enqueue(a, [{"key": f"k{i % 5}"} for i in range(n)], queue="qr")
    stop = asyncio.Event()

    async def work(http: httpx.AsyncClient, queue: str) -> None:
        while not stop.is_set():
            for job in await lease(http, 5, queue, wait=period / 2):
                assert (await ack(http, job)).status_code == 200

    workers = [asyncio.create_task(work(http, queue)) for http in (a, b) for queue in ("kr", "qr") * 4]
    await asyncio.sleep(RATE_WINDOWS * period + period / 2)
    stop.set()
    await asyncio.gather(*workers)

    history = await db.fetch(
        "SELECT queue, key, extract(epoch FROM at)::float8 AS at FROM public.history WHERE new = 'running'"
    )
    leases: dict[tuple, list[float]] = {}
    for event in history:
        group = (event["queue"], event["key"] if event["queue"] == "kr" else None)
        leases.setdefault(group, []).append(event["at"])
    assert sorted(leases, key=str) == [("kr", "k0"), ("kr", "k1"), ("qr", None)]
    for group, times in leases.items():
        times.sort()
        most = max(bisect.bisect_left(times, t + period) - i for i, t in enumerate(times))
        assert most <= limit, f"{group}: {most} leases within {period} s"
        starts = [bisect.bisect_left(times, times[0] + k * period) for k in range(RATE_WINDOWS + 1)]
        per_window = [end - start for start, end in itertools.pairwise(starts)]
        assert min(per_window) >= 0.95 * limit, f"{group}: leases per window {per_window}"


# --- the claim's plans ------------------------------------------------------------------------------

FRONT, FRONT_LEASE = front_claim_statements()
KEYS_50 = [f"k{n}" for n in range(50)]
SLOTS_100 = {"worker_ids": ["w"] * 100, "visibility_timeouts": [30.0] * 100}
CLAIM_STATEMENTS = {
    "flow_keys": (q.FLOW_KEYS, {"queue": "q", "after": "", "scan": 52, "reach": 208}),
    "flow_keys_rated": (q.FLOW_KEYS_RATED, {"queue": "q", "after": "", "scan": 52, "reach": 208}),
    "lease_flow": (q.LEASE_FLOW, {"queue": "q", "keys": KEYS_50, "lookahead": 100, **SLOTS_100}),
    "lease_flow_rated": (q.LEASE_FLOW_RATED, {"queue": "q", "keys": KEYS_50, "lookahead": 100, **SLOTS_100}),
    "flow_front": (FRONT, {"queue": "q", "lookahead": 116}),
    "flow_front_lease": (
        FRONT_LEASE,
        {"queue": "q", "ids": list(range(1, 101)), "keys": [f"k{n}" for n in range(1, 101)], **SLOTS_100},
    ),
}


class _Planned(Exception):
    """Leaves the transaction a plan was read in (EXPLAIN of a statement that changes rows runs nothing,
    but its settings stay local to it)."""


def test_the_front_and_the_walk_lock_a_key_alike():
    """A claim from the front (jobq.lease_flow_front(), its statements frozen in alembic 0021) and a walk
    of the keys (FLOW_KEYS) exclude each other only if they take the same lock for a key: a change to one
    lock and not the other would let both lease the same key's jobs at once."""
    from app.db.sql.claim import _KEY_LOCK

    revision = importlib.import_module("app.db.alembic.versions.0021_lease_flow_front")
    assert _KEY_LOCK.format(key="key") in " ".join(revision.FRONT.split())


@pytest.mark.parametrize("name", sorted(CLAIM_STATEMENTS))
async def test_a_flow_claim_reads_by_index_whatever_the_estimates(name, db):
    """Estimates can make PostgreSQL prefer reading a whole table to walking an index: in service,
    statistics from a time the jobs had no keys made it walk the keys by reading and sorting the whole
    table, once per key. Here random_page_cost makes every index read look dear; the claim's settings
    (FLOW_PLANS) still read every table by index."""
    from app.service.flow import FLOW_PLANS

    await db.execute("INSERT INTO jobq.queues (name, key_concurrency, flow) VALUES ('q', 2, true)")
    await db.execute(
        "INSERT INTO jobq.jobs (queue, key, payload) SELECT 'q', 'k' || (g % 100), '{}'"
        " FROM generate_series(1, 5000) g"
    )
    await db.execute("ANALYZE jobq.jobs")
    query, args = CLAIM_STATEMENTS[name]

    async def plan(*settings: str) -> str:
        try:
            async with db.transaction():
                for setting in settings:
                    await db.execute(setting)
                explain = await db.prepare(f"EXPLAIN {query.text}")
                text = "\n".join(r[0] for r in await explain.fetch(*query.args(**args)))
                raise _Planned(text)
        except _Planned as planned:
            return str(planned)

    dear = "SET LOCAL random_page_cost = 100000"
    assert "Seq Scan on jobs" in await plan(dear)  # what these estimates alone would do
    claimed = await plan(dear, FLOW_PLANS)
    assert "Seq Scan" not in claimed and "Bitmap" not in claimed, claimed


async def test_a_claim_that_fails_rolls_back_and_frees_its_keys(database_url, db):
    """The claim's transaction (BEGIN with its settings in one round trip) is rolled back when a
    statement fails: no key lock outlives it, the connection goes back to the pool clean, and the next
    claim leases."""
    from app.service import flow
    from tests.helpers import open_runtime

    await db.execute("INSERT INTO jobq.queues (name, key_concurrency, flow) VALUES ('q', 1, true)")
    await db.execute("INSERT INTO jobq.jobs (queue, key, payload) VALUES ('q', 'a', '1'), ('q', 'b', '2')")
    async with open_runtime(database_url, pool_max_size=1) as runtime:
        settings = await flow.queue_flow(runtime, "q")
        with pytest.raises(asyncpg.DataError):  # a lease deadline past the end of time: interval out of range
            await flow.lease_flow(runtime, "q", settings, [1e300, 1e300], [None, None])
        async with runtime.db.acquire() as conn:
            assert not conn.is_in_transaction()
            assert await conn.fetchval(ADVISORY_LOCKS_HERE) == 0
            assert await conn.fetchval("SHOW enable_seqscan") == "on"
        claim = await flow.lease_flow(runtime, "q", settings, [30.0, 30.0], [None, None])
    assert sorted(r["key"] for r in claim.rows) == ["a", "b"]
    assert await db.fetchval("SELECT count(*) FROM jobq.jobs WHERE status = 'running'") == 2


async def test_per_key_leases_a_keys_next_jobs_in_order_and_holds_it_until_all_end(a, b):
    """`per_key`: several consecutive jobs of an in-order key in one lease (as an SQS FIFO receive takes
    several of a group); the key stays held until the last of them has ended."""
    await configure(a, key_concurrency=1)
    ids = await enqueue(a, [{"key": "k", "payload": i} for i in range(5)] + [{"key": "other"}])
    jobs = await lease(a, 4, per_key=3)
    assert [j["id"] for j in jobs] == ids[:3] + ids[5:]  # the key's first three, in order, and the other
    assert await lease(b, 5, per_key=5) == []
    for job in jobs[:2]:
        assert (await ack(a, job)).status_code == 200
    assert await lease(b, 5, per_key=5) == []  # the third still runs
    assert (await ack(a, jobs[2])).status_code == 200
    assert [j["id"] for j in await lease(b, 5, per_key=5)] == ids[3:5]


async def test_per_key_does_not_run_past_a_job_waiting_for_its_retry(a):
    await configure(a, key_concurrency=1)
    ids = await enqueue(a, [{"key": "k", "payload": i} for i in range(4)])
    jobs = await lease(a, 2, per_key=2)
    assert [j["id"] for j in jobs] == ids[:2]
    r = await a.post("/nack", json={"id": ids[0], "lease_token": jobs[0]["lease_token"], "retry_after": 0})
    assert r.status_code == 200, r.text
    assert (await ack(a, jobs[1])).status_code == 200
    # The retry comes first and alone, though its run_at is now later than the key's next jobs'.
    assert [j["id"] for j in await lease(a, 3, per_key=3)] == ids[:1]
