"""The clients of a chaos run: producers, workers and an event sender, each talking to one replica and
recording every request in the run's history (chaos/history.py).

What they do covers each promise the checker (chaos/checker.py) holds jobq to:

- queue `plain`: jobs some of which record two durable steps before their ack, some of which wait for an
  event (`POST /jobs/{id}/await`) before they are acked, and some of which have a child (`depends_on`);
- queue `keyed`: `key_concurrency` 1 and `fair`, eight keys, each key's jobs enqueued one after another
  by one producer, so their order is known;
- queue `limited`: a rate of 20 leases a second, and `key_concurrency` 2;
- schedule `tick`: a job every second into queue `scheduled`, catching up every missed slot.

Workers ack most jobs, and nack, release, extend, or hold a job past its deadline (then ack, which must
be refused) now and then. Producers send every enqueue with an `Idempotency-Key` (its uid, also in the
payload), and send an enqueue whose answer is unknown again under the same key. All visibility timeouts
are 2 s, so that leases expire within the faults.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import httpx

from chaos.history import INFO, History, Op, Recorder

VISIBILITY = 2.0
EVENTS = [f"ev-{n}" for n in range(4)]
QUEUES: dict[str, dict[str, Any]] = {
    "plain": {"visibility_timeout": VISIBILITY, "max_attempts": 25},
    "keyed": {"visibility_timeout": VISIBILITY, "max_attempts": 25, "key_concurrency": 1, "fair": True},
    "limited": {
        "visibility_timeout": VISIBILITY,
        "max_attempts": 25,
        "key_concurrency": 2,
        "rate": {"limit": 20, "period": 1},
    },
    "scheduled": {"visibility_timeout": VISIBILITY, "max_attempts": 25},
}
SCHEDULE = {"cron": "* * * * * *", "queue": "scheduled", "payload": {"tick": True}, "catch_up": "all"}
SCHEDULES = {"tick": 1.0}  # name -> seconds between slots, for the checker


@dataclass
class Mix:
    """How many clients, and how often a worker does something other than ack."""

    producers: int = 3
    workers: int = 12
    nack: float = 0.08
    release: float = 0.04
    extend: float = 0.06
    overstay: float = 0.02  # hold a job past its deadline, then ack it (which must be refused)
    steps: float = 0.25  # of `plain` jobs: record two steps before the ack
    awaits: float = 0.05  # of `plain` jobs: wait for an event first
    children: float = 0.1  # of `plain` jobs: enqueue a child that depends on it


class Workload:
    def __init__(self, history: History, urls: Callable[[int], str], mix: Mix, seed: int = 0) -> None:
        """`urls(n)`: the replica the n-th client talks to."""
        self.history = history
        self.urls = urls
        self.mix = mix
        self.random = random.Random(seed)
        self.producing = asyncio.Event()
        self.working = asyncio.Event()
        self.recorders: list[Recorder] = []

    def _recorder(self, name: str, n: int) -> Recorder:
        recorder = Recorder(self.history, name, self.urls(n))
        self.recorders.append(recorder)
        return recorder

    async def configure(self) -> None:
        """The queues' settings and the schedule (not part of the history), sent until they are taken."""
        async with httpx.AsyncClient(base_url=self.urls(0), timeout=10) as http:
            for queue, settings in QUEUES.items():
                await _until_ok(lambda q=queue, s=settings: http.patch(f"/queues/{q}", json=s))
            await _until_ok(lambda: http.put("/schedules/tick", json=SCHEDULE))

    async def pause_schedule(self) -> None:
        async with httpx.AsyncClient(base_url=self.urls(0), timeout=10) as http:
            await _until_ok(lambda: http.post("/schedules/tick/pause"))

    def start(self) -> list[asyncio.Task]:
        self.producing.set()
        self.working.set()
        tasks = [asyncio.create_task(self._produce(n)) for n in range(self.mix.producers)]
        queues = ["plain", "plain", "keyed", "limited"]
        tasks += [
            asyncio.create_task(self._work(n, queues[n % len(queues)])) for n in range(self.mix.workers)
        ]
        tasks.append(asyncio.create_task(self._work(self.mix.workers, "scheduled")))
        tasks.append(asyncio.create_task(self._send_events()))
        return tasks

    async def stop(self, tasks: list[asyncio.Task]) -> None:
        self.producing.clear()
        self.working.clear()
        await asyncio.gather(*tasks, return_exceptions=True)
        for recorder in self.recorders:
            await recorder.close()

    async def _produce(self, n: int) -> None:
        http = self._recorder(f"producer-{n}", n)
        count = 0
        while self.producing.is_set():
            count += 1
            queue = self.random.choice(["plain", "plain", "keyed", "limited"])
            uid = str(uuid.uuid4())
            body: dict[str, Any] = {"queue": queue, "payload": {"uid": uid}}
            if queue == "keyed":
                body["key"] = f"p{n}-k{count % 8}"  # each key is this producer's alone: its order is known
            elif queue == "limited":
                body["key"] = f"k{count % 3}"
            elif self.random.random() < self.mix.awaits:
                body["payload"]["await"] = self.random.choice(EVENTS)
            elif self.random.random() < self.mix.steps:
                body["payload"]["steps"] = True
            op = await self._enqueue(http, body)
            if op.ok and queue == "plain" and self.random.random() < self.mix.children:
                child = {
                    "queue": "plain",
                    "payload": {"uid": str(uuid.uuid4())},
                    "depends_on": [op.body["id"]],
                }
                await self._enqueue(http, child)
            await asyncio.sleep(0.03 if op.ok else 0.3)

    async def _enqueue(self, http: Recorder, body: dict[str, Any]) -> Op:
        """An enqueue, sent again under the same key while its answer is unknown (at most 5 times)."""
        for _ in range(5):
            op = await http.call(
                "enqueue", "/jobs", body, headers={"Idempotency-Key": body["payload"]["uid"]}
            )
            if op.outcome != INFO:
                break
            await asyncio.sleep(0.2)
        return op

    async def _work(self, n: int, queue: str) -> None:
        http = self._recorder(f"worker-{n}", n)
        while self.working.is_set():
            body = {"queue": queue, "max_jobs": self.random.randint(1, 4), "visibility_timeout": VISIBILITY}
            op = await http.call("lease", "/lease", {**body, "wait": 1})
            if not op.ok:
                await asyncio.sleep(0.3)
                continue
            for job in op.body["jobs"]:
                await self._handle(http, job)

    async def _handle(self, http: Recorder, job: dict[str, Any]) -> None:
        held = {"id": job["id"], "lease_token": job["lease_token"]}
        token = {"lease_token": job["lease_token"]}  # for the calls that name the job in their path
        payload = job["payload"]
        event = payload.get("await")
        if event and not job.get("events"):
            body = {**token, "event": event, "timeout": 20}
            await http.call("await", f"/jobs/{job['id']}/await", body, job=job["id"])
            return
        if payload.get("steps"):
            done = job.get("steps") or {}
            for name in ("charge", "ship"):
                if name not in done:
                    result = {"by": http.process, "token": job["lease_token"][-8:]}
                    step = await http.call(
                        "step",
                        f"/jobs/{job['id']}/steps",
                        {**token, "name": name, "result": result},
                        job=job["id"],
                    )
                    if not step.ok:
                        return  # the lease is gone or in doubt: the job comes back
        roll = self.random.random()
        mix = self.mix
        if roll < mix.nack:
            await http.call("nack", "/nack", {**held, "error": "chaos", "retry_after": 0.2})
        elif roll < mix.nack + mix.release:
            delay = self.random.choice([0, 0.3])
            await http.call("release", "/release", {"items": [{**held, "delay": delay}]})
        elif roll < mix.nack + mix.release + mix.extend:
            extended = await http.call("extend", "/extend", {**held, "visibility_timeout": VISIBILITY})
            if extended.ok:
                await asyncio.sleep(0.5)
            await http.call("ack", "/ack", held)
        elif roll < mix.nack + mix.release + mix.extend + mix.overstay:
            await asyncio.sleep(VISIBILITY + 0.5)
            await http.call("ack", "/ack", held)
        else:
            await http.call("ack", "/ack", held)

    async def _send_events(self) -> None:
        http = self._recorder("events", 0)
        while self.working.is_set():
            await http.call("event", "/events", {"name": self.random.choice(EVENTS)})
            await asyncio.sleep(0.5)


async def _until_ok(send: Callable[[], Any], tries: int = 100) -> None:
    for _ in range(tries):
        with contextlib.suppress(httpx.HTTPError):
            response = await send()
            if response.is_success:
                return
        await asyncio.sleep(0.2)
    raise RuntimeError("the service did not take the run's settings")


FINAL_STATE = """
SELECT j.id, j.queue, j.key, j.status::text AS status, j.payload->>'uid' AS uid, j.schedule,
       to_char(j.schedule_slot AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"') AS schedule_slot,
       r.steps::text AS steps, j.depends_on
FROM jobq.all_jobs j LEFT JOIN jobq.job_journal r ON r.job_id = j.id
WHERE j.queue = ANY($1::text[])
"""


async def final_state(dsn: str) -> dict[int, dict[str, Any]]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(FINAL_STATE, list(QUEUES))
    finally:
        await conn.close()
    return {
        row["id"]: {
            **dict(row),
            "steps": json.loads(row["steps"]) if row["steps"] else None,
            "depends_on": list(row["depends_on"]) if row["depends_on"] else None,
        }
        for row in rows
    }


async def unfinished(dsn: str) -> int:
    conn = await asyncpg.connect(dsn, timeout=5)
    try:
        return await conn.fetchval(
            "SELECT count(*) FROM jobq.jobs WHERE queue = ANY($1::text[]) AND status NOT IN "
            "('completed', 'dead', 'cancelled')",
            list(QUEUES),
        )
    finally:
        await conn.close()
