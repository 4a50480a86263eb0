"""Durable steps and events (API part 8) under faults: a worker process killed with SIGKILL between steps
resumes at the next step on the next lease, each step's side effect done exactly once (counted by an
HTTP endpoint of the test's own); a service killed with SIGKILL while jobs are parked on events loses none
of them; and two replicas sending the same events at the same moment wake each job once. The rules one
by one: tests/http/test_durable.py."""

from __future__ import annotations

import asyncio
import subprocess
import textwrap
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tests.service_process import JOBQ, ServiceProcess, jobq_env
from tests.waiting import until

pytestmark = pytest.mark.anyio

ORDERS = 6
STEPS = ("charge", "ship", "email")

# The worker's tasks: each step calls the test's endpoint (its side effect), then leaves a mark once the
# step is recorded; with HANG_AFTER set, the handler stops there for good (to be killed).
TASKS = """
import os, pathlib, time, urllib.request

import jobq

tasks = jobq.Tasks(queue="orders")
COUNTER = os.environ["COUNTER_URL"]
MARKS = pathlib.Path(os.environ["MARKS"])


def effect(name, order):
    urllib.request.urlopen(f"{COUNTER}/{name}/{order}", data=b"").read()
    return {"step": name, "order": order}


@tasks.task
def place(order: int, ctx: jobq.Context) -> list:
    done = []
    for name in ("charge", "ship", "email"):
        done.append(ctx.step(name, effect, name, order))
        (MARKS / f"{order}-{name}").touch()
        if os.environ.get("HANG_AFTER") == name:
            time.sleep(3600)
    return done
"""


class Effects:
    """An HTTP endpoint counting `POST /<step>/<order>`: the side effects of the steps."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, int]] = Counter()
        lock = threading.Lock()
        counts = self.counts

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
                _, step, order = self.path.split("/")
                with lock:
                    counts[(step, int(order))] += 1
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _worker(tmp_path: Path, url: str, effects: Effects, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [*JOBQ, "worker", "shop", "--queue", "orders", "--wait", "0.5", "-c", str(ORDERS)],
        cwd=tmp_path,
        env=jobq_env(JOBQ_URL=url, COUNTER_URL=effects.url, MARKS=str(tmp_path / "marks"), **env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def test_a_worker_killed_between_steps_resumes_at_the_next_step(service, tmp_path, db):
    (tmp_path / "shop.py").write_text(textwrap.dedent(TASKS))
    (tmp_path / "marks").mkdir()
    effects = Effects()
    async with httpx.AsyncClient(base_url=service.url) as http:
        await http.patch("/queues/orders", json={"visibility_timeout": 2})
        jobs = [{"queue": "orders", "kind": "place", "payload": {"order": n}} for n in range(ORDERS)]
        ids = [j["id"] for j in (await http.post("/jobs/batch", json={"jobs": jobs})).json()["jobs"]]
        first = _worker(tmp_path, service.url, effects, HANG_AFTER="ship")
        try:
            marks = [tmp_path / "marks" / f"{n}-ship" for n in range(ORDERS)]
            await until(lambda: all(mark.exists() for mark in marks), timeout=30)
        finally:
            first.kill()  # SIGKILL: no release, no nack; the leases run out
            first.wait()
        assert not any((tmp_path / "marks" / f"{n}-email").exists() for n in range(ORDERS))
        second = _worker(tmp_path, service.url, effects)
        try:
            await until(lambda: _completed(db, ids), timeout=30)
        finally:
            second.terminate()
            second.wait(10)
        effects.close()
        assert effects.counts == Counter({(step, n): 1 for step in STEPS for n in range(ORDERS)})
        for job_id in ids:
            job = (await http.get(f"/jobs/{job_id}")).json()
            assert job["status"] == "completed" and job["attempts"] == 2  # the expiry counted one
            assert set(job["steps"]) == set(STEPS)
            assert job["result"] == [job["steps"][step] for step in STEPS]


async def _completed(db, ids: list[int]) -> bool:
    done = await db.fetchval(
        "SELECT count(*) FROM jobq.all_jobs WHERE id = ANY($1::bigint[]) AND status = 'completed'", ids
    )
    return done == len(ids)


async def test_a_service_killed_with_jobs_parked_on_events_loses_none(database_url, tmp_path):
    env = {"JOBQ_DATABASE_URL": database_url}
    first = ServiceProcess(tmp_path, **env).wait_ready()
    parked = {}
    try:
        async with httpx.AsyncClient(base_url=first.url, timeout=30) as http:
            jobs = [{"queue": "q", "payload": n} for n in range(20)]
            await http.post("/jobs/batch", json={"jobs": jobs})
            leased = (await http.post("/lease", json={"queue": "q", "max_jobs": 20})).json()["jobs"]
            for job in leased:
                body = {"lease_token": job["lease_token"], "event": f"paid:{job['payload']}", "timeout": 3600}
                r = await http.post(f"/jobs/{job['id']}/await", json=body)
                assert r.json()["status"] == "waiting"
                parked[job["id"]] = job["payload"]
    finally:
        first.kill()
    second = ServiceProcess(tmp_path, **env).wait_ready()
    try:
        async with httpx.AsyncClient(base_url=second.url, timeout=30) as http:
            waiting = (await http.get("/jobs", params={"status": "waiting", "limit": 100})).json()["jobs"]
            assert sorted(j["id"] for j in waiting) == sorted(parked)
            for n in range(20):
                sent = await http.post("/events", json={"name": f"paid:{n}", "payload": {"n": n}})
                assert sent.json()["woken"] == 1
            woke = (await http.post("/lease", json={"queue": "q", "max_jobs": 50})).json()["jobs"]
            assert sorted(j["id"] for j in woke) == sorted(parked)
            for job in woke:
                (event,) = job["events"]
                assert event["name"] == f"paid:{parked[job['id']]}"
                assert event["payload"] == {"n": parked[job["id"]]}
                assert job["attempts"] == 1  # the wait counted no attempt
    finally:
        second.stop()


async def test_two_replicas_sending_the_same_events_at_once_wake_each_job_once(start_service, db):
    replicas = [start_service(), start_service()]
    names = [f"batch:{n}" for n in range(10)]
    async with (
        httpx.AsyncClient(base_url=replicas[0].url, timeout=30) as one,
        httpx.AsyncClient(base_url=replicas[1].url, timeout=30) as two,
    ):
        jobs = [{"queue": "q", "payload": n} for n in range(200)]
        await one.post("/jobs/batch", json={"jobs": jobs})
        leased = (await one.post("/lease", json={"queue": "q", "max_jobs": 200})).json()["jobs"]

        async def park(job: dict) -> None:
            body = {"lease_token": job["lease_token"], "event": names[job["payload"] % 10], "timeout": 3600}
            http = one if job["payload"] % 2 else two
            assert (await http.post(f"/jobs/{job['id']}/await", json=body)).json()["status"] == "waiting"

        await asyncio.gather(*(park(job) for job in leased))
        # Each event sent three times on each replica, all at once.
        sends = [http.post("/events", json={"name": name}) for name in names for http in (one, two) * 3]
        answers = await asyncio.gather(*sends)
        assert sum(r.json()["woken"] for r in answers) == 200
        woke = (await two.post("/lease", json={"queue": "q", "max_jobs": 500})).json()["jobs"]
    assert sorted(j["id"] for j in woke) == sorted(j["id"] for j in leased)
    for job in woke:
        (event,) = job["events"]  # reached by one event, once
        assert event["name"] == names[job["payload"] % 10]
    assert await db.fetchval("SELECT count(*) FROM jobq.events") == 60
