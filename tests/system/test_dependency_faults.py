"""Dependencies (API part 6) under concurrency and faults: a child is decided exactly once, by the
transaction that ends its last parent, however many clients on however many replicas ack its parents at
once, and across a SIGKILL of the service in the middle of it; a parent's attempt that ends without
ending the parent (an expired lease, a nack with attempts left) decides nothing.

What is checked, besides each child's status: the bookkeeping (jobq.job_edges, one row per parent not
yet ended and child; jobq.job_waits, a count row for a child of several parents or with a delay) read in
one snapshot with the jobs, so that it must agree with them at every moment; the NOTIFY of every child
made pending (app/db/functions.sql, jobq.decide()), counted per queue by a listener of the test's own:
a child made pending twice would be counted twice; and each child leased exactly once in the end. The
rules one by one: tests/service/test_dependencies.py; over HTTP: tests/http/test_dependencies.py."""

from __future__ import annotations

import asyncio
import json
import random
import signal
from collections import Counter
from collections.abc import Iterable

import asyncpg
import httpx
import pytest

from tests.service_process import ServiceProcess
from tests.waiting import until

pytestmark = pytest.mark.anyio

LEASE = 2.0  # seconds: short, so parents held by clients of a killed service come back soon


# --- what the database holds, read in one snapshot ---------------------------------------------------

# One statement, so one snapshot: the children of `queues` with their parents' statuses as they are
# now, and the bookkeeping beside them. Each count is of something that must never be: a child waiting
# though its parents have all ended (undecided), decided though one has not (early), an edge of a parent
# that ended (stale_edges), a parent not yet ended without its edge (missing_edges), a count row that is
# not its waiting child's number of parents left (bad_waits), a waiting child of several parents without
# one (missing_waits), a job both live and in the history (twice). A parent that is nowhere was deleted:
# ended, as cancelled.
INVARIANTS = """
WITH parent AS (
    SELECT k.id AS child, k.status AS child_status, d.pid, p.status AS pstatus
    FROM jobq.all_jobs k CROSS JOIN LATERAL unnest(k.depends_on) AS d(pid)
    LEFT JOIN jobq.all_jobs p ON p.id = d.pid
    WHERE k.queue = ANY($1::text[])
), per_child AS (
    SELECT child, child_status, count(*) AS parents,
           count(*) FILTER (WHERE pstatus NOT IN ('completed', 'dead', 'cancelled')) AS live
    FROM parent GROUP BY child, child_status
)
SELECT
    (SELECT count(*) FROM per_child WHERE live = 0 AND child_status = 'waiting') AS undecided,
    (SELECT count(*) FROM per_child WHERE live > 0 AND child_status <> 'waiting') AS early,
    (SELECT count(*) FROM jobq.job_edges e JOIN jobq.all_jobs p ON p.id = e.parent_id
     WHERE p.status IN ('completed', 'dead', 'cancelled')) AS stale_edges,
    (SELECT count(*) FROM parent x
     WHERE x.pstatus NOT IN ('completed', 'dead', 'cancelled')
       AND NOT EXISTS (SELECT 1 FROM jobq.job_edges e WHERE e.parent_id = x.pid AND e.child_id = x.child))
        AS missing_edges,
    (SELECT count(*) FROM jobq.job_waits w LEFT JOIN per_child c ON c.child = w.job_id
     WHERE c.child_status IS DISTINCT FROM 'waiting' OR w.parents_left <> c.live) AS bad_waits,
    (SELECT count(*) FROM per_child c
     WHERE c.child_status = 'waiting' AND c.parents > 1
       AND NOT EXISTS (SELECT 1 FROM jobq.job_waits w WHERE w.job_id = c.child)) AS missing_waits,
    (SELECT count(*) FROM jobq.jobs j JOIN jobq.jobs_history h ON h.id = j.id) AS twice
"""

SOUND = {
    "undecided": 0,
    "early": 0,
    "stale_edges": 0,
    "missing_edges": 0,
    "bad_waits": 0,
    "missing_waits": 0,
    "twice": 0,
}


async def invariants(db: asyncpg.Connection, queues: Iterable[str]) -> dict[str, int]:
    return dict(await db.fetchrow(INVARIANTS, list(queues)))


async def bookkeeping(db: asyncpg.Connection) -> tuple[int, int]:
    return (
        await db.fetchval("SELECT count(*) FROM jobq.job_edges"),
        await db.fetchval("SELECT count(*) FROM jobq.job_waits"),
    )


async def statuses(db: asyncpg.Connection, ids: Iterable[int]) -> dict[int, str]:
    rows = await db.fetch("SELECT id, status FROM jobq.all_jobs WHERE id = ANY($1::bigint[])", list(ids))
    return {r["id"]: r["status"] for r in rows}


class Watch:
    """INVARIANTS read ten times a second on a connection of its own, while `run` runs; what it saw
    that was not SOUND."""

    def __init__(self, database_url: str, queues: Iterable[str]) -> None:
        self.database_url, self.queues = database_url, list(queues)
        self.unsound: list[dict[str, int]] = []
        self.looks = 0

    async def run(self, stop: asyncio.Event) -> None:
        conn = await asyncpg.connect(self.database_url)
        try:
            while not stop.is_set():
                seen = await invariants(conn, self.queues)
                self.looks += 1
                if seen != SOUND:
                    self.unsound.append(seen)
                await asyncio.sleep(0.1)
        finally:
            await conn.close()


class Wakeups:
    """The NOTIFYs on the service's channel, `jobq` (app/db/sql/fragments.py), summed per queue: for a
    queue of children, listened to once they are all enqueued, how many of them were made pending
    (jobq.decide() sends one per statement and queue, with how many it made ready)."""

    def __init__(self) -> None:
        self.made_ready: Counter[str] = Counter()
        self.conn: asyncpg.Connection | None = None

    def heard(self, _conn, _pid, _channel, payload: str) -> None:
        message = json.loads(payload)
        self.made_ready[message["queue"]] += message["n"]

    async def listen(self, database_url: str) -> Wakeups:
        self.conn = await asyncpg.connect(database_url)
        await self.conn.add_listener("jobq", self.heard)
        return self

    async def settled(self) -> Counter[str]:
        """The sums, with every notification committed before this call heard (PostgreSQL delivers them to
        a listener at the end of its transactions: one round trip passes them all)."""
        assert self.conn is not None
        await self.conn.fetchval("SELECT 1")
        await asyncio.sleep(0)
        return self.made_ready

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()


def ack_items(jobs: list[dict]) -> list[dict]:
    return [{"id": j["id"], "lease_token": j["lease_token"]} for j in jobs]


async def lease_all(urls: list[str], expected: dict[str, int], clients: int = 8) -> Counter[int]:
    """Lease every ready job of the queues `expected` names from `clients` clients over `urls` (long
    leases, never acked: no job may come back), queue after queue, until as many as each queue should
    hand out were handed out and a look finds none; each id, and how many times it was handed out."""
    handed: Counter[int] = Counter()
    per_queue: Counter[str] = Counter()

    async def one(url: str) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            for queue, n in expected.items():
                while True:
                    r = await http.post(
                        "/lease",
                        json={"queue": queue, "max_jobs": 50, "visibility_timeout": 300, "wait": 0.2},
                    )
                    assert r.status_code == 200, r.text
                    jobs = r.json()["jobs"]
                    handed.update(j["id"] for j in jobs)
                    per_queue[queue] += len(jobs)
                    if not jobs and per_queue[queue] >= n:
                        break

    await asyncio.wait_for(asyncio.gather(*(one(urls[i % len(urls)]) for i in range(clients))), 30)
    return handed


# --- 1. a thousand parents acked at once -------------------------------------------------------------


async def test_a_thousand_parents_acked_at_once_over_two_replicas_decide_each_child_once(
    start_service, database_url, db
):
    """1,000 parents; one child of all of them, one child of each, a hundred children of one parent
    with a delay (a count row each), and 300 children of 2-5 parents. Four parents (queue `slow`) are
    held leased while 32 clients over two replicas lease the others 1-10 at a time and ack them (/ack
    and /ack/batch) as fast as they can: every child of those alone is then pending, every child of a
    slow one still waiting with the edges and counts of the slow parents alone. The slow ones acked at
    the same moment on both replicas, every child is pending, made so once, and leased once."""
    rng = random.Random()
    a, b = start_service(), start_service()
    urls = [a.url, b.url]
    wakeups = Wakeups()
    async with httpx.AsyncClient(base_url=a.url, timeout=60) as http:
        slow_places = {0, 333, 666, 999}
        r = await http.post(
            "/jobs/batch",
            json={
                "jobs": [{"queue": "slow" if n in slow_places else "p", "payload": n} for n in range(1000)]
            },
        )
        assert r.status_code == 201, r.text
        parents = [j["id"] for j in r.json()["jobs"]]
        slow = {parents[n] for n in slow_places}

        singles = [{"queue": "c_one", "payload": n, "depends_on": [p]} for n, p in enumerate(parents)]
        delayed = [
            {"queue": "c_delay", "payload": n, "depends_on": [parents[n]], "delay": 0.05} for n in range(100)
        ]
        fan_in = []
        others, slow_ones = [p for p in parents if p not in slow], sorted(slow)
        for n in range(300):
            chosen = rng.sample(others, rng.randint(2, 5))
            if n < 6:  # some surely wait for one slow parent (n < 4) or two (n = 4, 5)
                chosen[: 1 + n // 4] = [slow_ones[n % 4], slow_ones[(n + 1) % 4]][: 1 + n // 4]
            fan_in.append({"queue": "c_few", "payload": n, "depends_on": chosen})
        made: dict[int, list[int]] = {}  # child -> its parents
        queue_of: dict[int, str] = {}
        for batch in (singles, delayed + fan_in, [{"queue": "c_all", "payload": 0, "depends_on": parents}]):
            r = await http.post("/jobs/batch", json={"jobs": batch})
            assert r.status_code == 201, r.text
            for job, asked in zip(r.json()["jobs"], batch, strict=True):
                assert (job["status"], job["depends_on"]) == ("waiting", asked["depends_on"]), job
                made[job["id"]], queue_of[job["id"]] = asked["depends_on"], asked["queue"]
        child_queues = {"c_one": 1000, "c_delay": 100, "c_few": 300, "c_all": 1}
        assert Counter(queue_of.values()) == child_queues

        # The slow parents, held by a worker until the end.
        r = await http.post("/lease", json={"queue": "slow", "max_jobs": 10, "visibility_timeout": 300})
        held = r.json()["jobs"]
        assert {j["id"] for j in held} == slow

    await wakeups.listen(database_url)
    try:
        assert await invariants(db, child_queues) == SOUND
        delivered: Counter[int] = Counter()
        refused: list[dict] = []

        async def worker(url: str) -> None:
            async with httpx.AsyncClient(base_url=url, timeout=60) as http:
                while True:
                    r = await http.post(
                        "/lease",
                        json={
                            "queue": "p",
                            "max_jobs": rng.randint(1, 10),
                            "visibility_timeout": 120,
                            "wait": 0.1,
                        },
                    )
                    assert r.status_code == 200, r.text
                    jobs = r.json()["jobs"]
                    if not jobs:
                        return
                    delivered.update(j["id"] for j in jobs)
                    if rng.random() < 0.5:
                        answers = await asyncio.gather(
                            *(http.post("/ack", json=item) for item in ack_items(jobs))
                        )
                        refused.extend(x.json() for x in answers if x.status_code != 200)
                    else:
                        x = await http.post("/ack/batch", json={"items": ack_items(jobs)})
                        assert x.status_code == 200, x.text
                        refused.extend(y for y in x.json()["results"] if not y["ok"])

        watch, stop = Watch(database_url, child_queues), asyncio.Event()
        watching = asyncio.create_task(watch.run(stop))
        try:
            await asyncio.wait_for(asyncio.gather(*(worker(urls[i % 2]) for i in range(32))), 60)
        finally:
            stop.set()
            await watching
        assert watch.unsound == [] and watch.looks > 0, (watch.looks, watch.unsound[:3])
        assert refused == []
        assert set(delivered) == set(parents) - slow and set(delivered.values()) == {1}, "a parent twice"

        # Every child of the acked parents alone is pending; every child of a slow one waits, with the
        # edges of the slow parents and the counts of what is left, and nothing else.
        waiting = {child for child, ps in made.items() if slow & set(ps)}
        now = await statuses(db, made)
        assert {c for c, s in now.items() if s == "waiting"} == waiting
        assert {s for c, s in now.items() if c not in waiting} == {"pending"}
        edges = {(r["parent_id"], r["child_id"]) for r in await db.fetch("SELECT * FROM jobq.job_edges")}
        assert edges == {(p, c) for c, ps in made.items() for p in ps if p in slow}
        counts = {r["job_id"]: r["parents_left"] for r in await db.fetch("SELECT * FROM jobq.job_waits")}
        counted = {c for c, ps in made.items() if len(ps) > 1 or queue_of[c] == "c_delay"}
        assert counts == {c: len(slow & set(made[c])) for c in waiting & counted}
        assert await invariants(db, child_queues) == SOUND

        # The four slow parents end at the same moment, two on each replica.
        async with (
            httpx.AsyncClient(base_url=a.url, timeout=60) as on_a,
            httpx.AsyncClient(base_url=b.url, timeout=60) as on_b,
        ):
            answers = await asyncio.gather(
                on_a.post("/ack", json=ack_items(held)[0]),
                on_b.post("/ack", json=ack_items(held)[1]),
                on_a.post("/ack/batch", json={"items": ack_items(held)[2:3]}),
                on_b.post("/ack/batch", json={"items": ack_items(held)[3:]}),
            )
        assert [x.status_code for x in answers] == [200] * 4

        assert set((await statuses(db, made)).values()) == {"pending"}
        assert await bookkeeping(db) == (0, 0)
        assert await invariants(db, child_queues) == SOUND
        await until(lambda: sum(wakeups.made_ready[q] for q in child_queues) >= len(made), timeout=5)
        heard = await wakeups.settled()
        assert {q: heard[q] for q in child_queues} == child_queues, "a child made pending twice, or never"

        handed = await lease_all(urls, child_queues)
        assert set(handed) == set(made) and set(handed.values()) == {1}, "a child leased twice, or never"
        cancelled = await db.fetchval(
            "SELECT count(*) FROM jobq.all_jobs WHERE queue = ANY($1::text[]) AND status = 'cancelled'",
            list(child_queues),
        )
        assert cancelled == 0
    finally:
        await wakeups.close()


# --- 2. SIGKILL in the middle of acking parents ------------------------------------------------------


def decision(run_if: str, ended: list[str]) -> str:
    """What a child with `run_if` becomes once its parents ended as `ended` (API part 6)."""
    failed = any(s != "completed" for s in ended)
    runs = {"completed": not failed, "finished": True, "failed": failed}[run_if]
    return "pending" if runs else "cancelled"


async def test_a_sigkill_while_parents_are_acked_loses_no_decision_and_makes_none_twice(
    database_url, tmp_path, db
):
    """Workers lease the parents of 800 children of one parent, 300 of 2-5, 12 of 50 and one of all
    800 (run_if of every kind) from a service process, and ack them, or nack some dead, or drop some
    (their leases expire), when the service is killed with SIGKILL mid-stream and started again. The
    jobs and their bookkeeping, read in one snapshot ten times a second all along, never disagree: no
    child waits whose parents all ended, none is decided before they have, no edge or count is stale or
    missing; just after the restart too. The parents whose leases the kill lost come back after their
    visibility timeout and end; then every child has been decided once, as its run_if says, and is
    leased once if it runs."""
    rng = random.Random()
    env = {"JOBQ_DATABASE_URL": database_url, "JOBQ_SWEEP_INTERVAL": "0.2"}
    current = [ServiceProcess(tmp_path, **env).wait_ready()]
    run_ifs = ("completed", "finished", "failed")
    async with httpx.AsyncClient(base_url=current[0].url, timeout=60) as http:
        r = await http.post("/jobs/batch", json={"jobs": [{"queue": "p", "payload": n} for n in range(800)]})
        assert r.status_code == 201, r.text
        parents = [j["id"] for j in r.json()["jobs"]]
        asked = [
            {"queue": "c_one", "payload": n, "depends_on": [p], "run_if": run_ifs[n % 3]}
            for n, p in enumerate(parents)
        ]
        asked += [
            {
                "queue": "c_few",
                "payload": n,
                "depends_on": rng.sample(parents, rng.randint(2, 5)),
                "run_if": run_ifs[n % 3],
            }
            for n in range(300)
        ]
        # Children of many parents, whose ends meet at their counts: of 50 each, and of all 800.
        asked += [
            {"queue": "c_many", "payload": n, "depends_on": rng.sample(parents, 50), "run_if": run_ifs[n % 3]}
            for n in range(12)
        ]
        asked.append({"queue": "c_many", "payload": "all", "depends_on": parents, "run_if": "finished"})
        made: dict[int, dict] = {}
        for start in range(0, len(asked), 1000):
            batch = asked[start : start + 1000]
            r = await http.post("/jobs/batch", json={"jobs": batch})
            assert r.status_code == 201, r.text
            for job, request in zip(r.json()["jobs"], batch, strict=True):
                assert job["status"] == "waiting", job
                made[job["id"]] = request
    child_queues = {"c_one", "c_few", "c_many"}
    assert len(made) == 1113

    wakeups = await Wakeups().listen(database_url)
    watch = Watch(database_url, child_queues)
    acked: set[int] = set()
    nacked_dead: set[int] = set()
    stop = asyncio.Event()

    async def work() -> None:
        async with httpx.AsyncClient(base_url=current[0].url, timeout=10) as http:
            while not stop.is_set():
                try:
                    r = await http.post(
                        "/lease",
                        json={
                            "queue": "p",
                            "max_jobs": rng.randint(1, 10),
                            "visibility_timeout": LEASE,
                            "wait": 0.2,
                        },
                    )
                    if r.status_code != 200:
                        await asyncio.sleep(0.05)
                        continue
                    to_ack, to_kill = [], []
                    for job in r.json()["jobs"]:
                        draw = rng.random()
                        if draw < 0.05:
                            continue  # this worker "crashes" on the job: it comes back after its lease
                        (to_kill if draw < 0.15 else to_ack).append(job)
                    if to_kill:
                        items = [{**item, "dead": True, "error": "no"} for item in ack_items(to_kill)]
                        x = await http.post("/nack/batch", json={"items": items})
                        if x.status_code == 200:
                            nacked_dead.update(y["id"] for y in x.json()["results"] if y["ok"])
                    if rng.random() < 0.5:
                        for item in ack_items(to_ack):
                            x = await http.post("/ack", json=item)
                            if x.status_code == 200:
                                acked.add(item["id"])
                    elif to_ack:
                        x = await http.post("/ack/batch", json={"items": ack_items(to_ack)})
                        if x.status_code == 200:
                            acked.update(y["id"] for y in x.json()["results"] if y["ok"])
                except httpx.TransportError:
                    await asyncio.sleep(0.05)
                    http.base_url = current[0].url  # the service may be back on another port

    async def parents_left() -> int:
        return await db.fetchval(
            "SELECT count(*) FROM jobq.jobs WHERE queue = 'p' AND status IN ('pending', 'running')"
        )

    async def none_left() -> bool:
        return await parents_left() == 0

    async def sound() -> bool:
        return await invariants(db, child_queues) == SOUND

    load = [asyncio.create_task(work()) for _ in range(8)]
    load.append(asyncio.create_task(watch.run(stop)))
    try:
        await until(lambda: len(acked) + len(nacked_dead) >= 250, timeout=30)
        current[0].process.send_signal(signal.SIGKILL)
        current[0].process.wait()
        ended_before = len(acked) + len(nacked_dead)
        assert await parents_left() > 0, "the kill came after the last parent"
        current[0] = ServiceProcess(tmp_path, **env)
        await asyncio.to_thread(current[0].wait_ready)
        # Nothing is left to a restart: every decision was made, or not, with the parent's end.
        await until(sound, timeout=1.0)
        await until(lambda: len(acked) + len(nacked_dead) > ended_before, timeout=20)  # the load resumes
        # ...and the parents the kill left running come back after their lease and end too.
        await until(none_left, timeout=30)
    finally:
        stop.set()
        ran = await asyncio.gather(*load, return_exceptions=True)
    try:
        assert [x for x in ran if x is not None] == [], "a worker or the watch failed"
        assert watch.unsound == [] and watch.looks > 10, (watch.looks, watch.unsound[:3])
        assert await invariants(db, child_queues) == SOUND
        assert await bookkeeping(db) == (0, 0)
        ended = await statuses(db, parents)
        assert set(ended.values()) <= {"completed", "dead"}
        assert all(ended[p] == "completed" for p in acked), "an ack that got a 200 is not completed"
        assert all(ended[p] == "dead" for p in nacked_dead)

        rows = await db.fetch(
            "SELECT id, status, last_error FROM jobq.all_jobs WHERE queue = ANY($1::text[])",
            list(child_queues),
        )
        assert len(rows) == len(made) and {r["id"] for r in rows} == set(made), "a child lost or made twice"
        runs: Counter[str] = Counter()
        for row in rows:
            request = made[row["id"]]
            their = [ended[p] for p in request["depends_on"]]
            assert row["status"] == decision(request["run_if"], their), (row, request, their)
            if row["status"] == "pending":
                runs[request["queue"]] += 1
            elif request["run_if"] == "completed":
                dead_ones = [p for p in request["depends_on"] if ended[p] == "dead"]
                assert any(
                    row["last_error"] == f"cancelled: parent job {p} is dead (run_if completed)"
                    for p in dead_ones
                ), row
            else:
                assert row["last_error"].startswith(
                    "cancelled: no parent failed (run_if failed; the last was job "
                )
        assert {"pending", "cancelled"} <= {r["status"] for r in rows}
        await until(lambda: sum(wakeups.made_ready[q] for q in child_queues) >= sum(runs.values()), timeout=5)
        heard = await wakeups.settled()
        assert {q: heard[q] for q in child_queues} == {q: runs[q] for q in child_queues}, "made pending twice"
        handed = await lease_all([current[0].url], dict(runs))
        pending = {r["id"] for r in rows if r["status"] == "pending"}
        assert set(handed) == pending and set(handed.values()) == {1}, "a child leased twice, or never"
        assert 0 < ended_before < len(parents)
    finally:
        await wakeups.close()
        current[0].kill()


# --- 3. an attempt that fails with attempts left ---------------------------------------------------


async def test_an_expired_lease_or_a_nack_with_attempts_left_decides_nothing(start_service, db):
    """Parents A and B (3 attempts each) and C (1): A's lease expires, B is nacked with retry_after 0,
    on two replicas. A and B are pending again, so their children (of A, of B, of both, and of A, B
    and C) keep waiting, with their edges and counts; C's lease expiring ends it (dead), which decides
    its own children at once. A late ack under A's expired token, once A was leased again, is refused
    and decides nothing. A and B then complete at the same moment on the two replicas, and their
    children become pending, each once."""
    a, b = start_service(), start_service()
    async with (
        httpx.AsyncClient(base_url=a.url, timeout=30) as on_a,
        httpx.AsyncClient(base_url=b.url, timeout=30) as on_b,
    ):

        async def enqueue(http: httpx.AsyncClient, queue: str, **fields) -> int:
            r = await http.post("/jobs", json={"queue": queue, "payload": queue, **fields})
            assert r.status_code == 201, r.text
            return r.json()["id"]

        async def lease_one(http: httpx.AsyncClient, queue: str, **fields) -> dict:
            r = await http.post("/lease", json={"queue": queue, **fields})
            assert r.status_code == 200, r.text
            (job,) = r.json()["jobs"]
            return job

        pa, pb = await enqueue(on_a, "pa", max_attempts=3), await enqueue(on_b, "pb", max_attempts=3)
        pc = await enqueue(on_a, "pc", max_attempts=1)
        of_a = await enqueue(on_a, "c", depends_on=[pa])
        of_b = await enqueue(on_b, "c", depends_on=[pb])
        of_ab = await enqueue(on_a, "c", depends_on=[pa, pb])
        of_abc = await enqueue(on_b, "c", depends_on=[pc, pb, pa], run_if="finished")
        c_done = await enqueue(on_a, "cc", depends_on=[pc])
        c_failed = await enqueue(on_b, "cc", depends_on=[pc], run_if="failed")
        children = [of_a, of_b, of_ab, of_abc]

        first_a = await lease_one(on_a, "pa", visibility_timeout=0.5)
        lease_c = await lease_one(on_a, "pc", visibility_timeout=0.5)
        first_b = await lease_one(on_b, "pb", visibility_timeout=30)
        assert [j["id"] for j in (first_a, first_b, lease_c)] == [pa, pb, pc]
        r = await on_b.post("/nack", json={**ack_items([first_b])[0], "error": "again", "retry_after": 0})
        assert r.status_code == 200 and r.json()["status"] == "pending", r.text

        async def expired() -> bool:
            rows = await db.fetch(
                "SELECT id, status, last_error FROM jobq.all_jobs WHERE id = ANY($1::bigint[])", [pa, pc]
            )
            now = {r["id"]: r for r in rows}
            return (now[pa]["status"], now[pc]["status"]) == ("pending", "dead") and all(
                "lease expired" in now[p]["last_error"] for p in (pa, pc)
            )

        await until(expired, timeout=10)
        now = await statuses(db, [pa, pb, pc, *children, c_done, c_failed])
        assert [now[p] for p in (pa, pb, pc)] == ["pending", "pending", "dead"]
        assert [now[c] for c in children] == ["waiting"] * 4
        # C's end decided its own children, and nothing else.
        assert (now[c_done], now[c_failed]) == ("cancelled", "pending")
        reason = await db.fetchval("SELECT last_error FROM jobq.all_jobs WHERE id = $1", c_done)
        assert reason == f"cancelled: parent job {pc} is dead (run_if completed)"
        edges = {(r["parent_id"], r["child_id"]) for r in await db.fetch("SELECT * FROM jobq.job_edges")}
        assert edges == {(pa, of_a), (pb, of_b), (pa, of_ab), (pb, of_ab), (pa, of_abc), (pb, of_abc)}
        waits = {
            r["job_id"]: (r["parents_left"], r["failed_parent"], r["failed_status"])
            for r in await db.fetch("SELECT * FROM jobq.job_waits")
        }
        assert waits == {of_ab: (2, None, None), of_abc: (2, pc, "dead")}
        assert await invariants(db, ["c", "cc"]) == SOUND
        # C's worker acks late, under its expired lease: accepted (the work was done; API, precise
        # points), C completed; its children, decided already, are not decided again.
        late = await on_b.post("/ack", json=ack_items([lease_c])[0])
        assert late.status_code == 200, late.text
        assert (await statuses(db, [pc, c_done, c_failed])) == {
            pc: "completed",
            c_done: "cancelled",
            c_failed: "pending",
        }
        assert await bookkeeping(db) == (6, 2)

        # Leased again, each on the other replica; the expired lease's token is no longer A's.
        again_a = await lease_one(on_b, "pa", visibility_timeout=30)
        again_b = await lease_one(on_a, "pb", visibility_timeout=30)
        assert (again_a["id"], again_a["attempts"], again_b["id"], again_b["attempts"]) == (pa, 2, pb, 2)
        late = await on_a.post("/ack", json=ack_items([first_a])[0])
        assert late.status_code == 409 and late.json()["code"] == "lease_lost", late.text
        assert set((await statuses(db, children)).values()) == {"waiting"}
        assert await bookkeeping(db) == (6, 2)

        answers = await asyncio.gather(
            on_a.post("/ack", json=ack_items([again_a])[0]),
            on_b.post("/ack", json=ack_items([again_b])[0]),
        )
        assert [x.status_code for x in answers] == [200, 200], [x.text for x in answers]
        assert set((await statuses(db, children)).values()) == {"pending"}
        assert await bookkeeping(db) == (0, 0)
        assert await invariants(db, ["c", "cc"]) == SOUND
        handed = await lease_all([a.url, b.url], {"c": 4, "cc": 1}, clients=4)
        assert set(handed) == {*children, c_failed} and set(handed.values()) == {1}
