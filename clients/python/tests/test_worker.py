"""The worker runner (jobq/worker.py) and `jobq worker`, against a real service and database: acks and nacks,
the concurrency limit, lease extension for long jobs, graceful stops, outages, signals and the status."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import pty
import re
import select
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from jobq import AsyncClient, ValidationError, Worker
from jobq.client import AsyncWorkerCalls, RetryPolicy
from jobq.worker import ERROR_CHARS, describe
from tests.command_line import invoke
from tests.helpers import assert_nothing_stranded
from tests.sent import recording
from tests.service_process import JOBQ, jobq_env
from tests.waiting import equals, states, until

pytestmark = pytest.mark.anyio


class Gauge:
    """How many handlers run at once, at most."""

    def __init__(self) -> None:
        self.now = self.peak = 0
        self.lock = threading.Lock()

    def enter(self) -> None:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)

    def leave(self) -> None:
        with self.lock:
            self.now -= 1


@pytest.mark.parametrize("kind", ["plain", "async"])
async def test_acks_successes_and_nacks_failures_with_their_error(service, db, kind):
    gauge = Gauge()

    def plain_handler(job):
        gauge.enter()
        time.sleep(0.02)
        gauge.leave()
        if "fail" in job.payload:
            raise ValueError(job.payload["fail"])

    async def async_handler(job):
        gauge.enter()
        await asyncio.sleep(0.02)
        gauge.leave()
        if "fail" in job.payload:
            raise ValueError(job.payload["fail"])

    async with AsyncClient(service.url) as client:
        await client.admin.configure_queue("q", backoff_base=3600)  # a failed job waits: each runs once here
        payloads = [{"n": i, "fail": f"bad {i}"} if i % 10 == 0 else {"n": i} for i in range(60)]
        await client.enqueue_many([{"queue": "q", "payload": p} for p in payloads])
        worker = Worker(
            plain_handler if kind == "plain" else async_handler, "q", client=client, concurrency=8, wait=0.2
        )
        run = asyncio.create_task(worker.run())
        await until(lambda: worker.stats.done + worker.stats.failed == 60)
        worker.stop()
        stats = await asyncio.wait_for(run, 5)

    assert (stats.done, stats.failed, stats.lost, stats.released, stats.in_flight) == (54, 6, 0, 0, 0)
    assert gauge.peak == 8
    assert await states(db, "q")() == {"completed": 54, "pending": 6}
    failed = await db.fetch(
        "SELECT payload->>'fail' AS fail, attempts, last_error FROM jobq.all_jobs WHERE status = 'pending'"
    )
    for row in failed:
        error = row["last_error"]
        assert row["attempts"] == 1
        assert error.startswith(f"ValueError: {row['fail']}\n")
        assert "Traceback (innermost last):" in error and f"in {kind}_handler" in error
        assert "jobq/worker.py" not in error  # the runner's own frames are left out


async def test_extends_the_lease_of_a_long_job(service, db):
    finish = threading.Event()
    async with AsyncClient(service.url) as client:
        job = await client.enqueue("slow", "work")

        def slow(job):
            finish.wait(30)

        worker = Worker(slow, "slow", client=client, visibility_timeout=0.6, wait=0.2)
        run = asyncio.create_task(worker.run())
        try:
            first = await until(
                lambda: db.fetchval("SELECT lease_expires_at FROM jobq.all_jobs WHERE status = 'running'")
            )
            # Past the first deadline, by more than the service's expiry interval (0.2 s), the job is still
            # running, on a later one: it was extended, not expired.
            await until(lambda: db.fetchval("SELECT now() > $1::timestamptz + interval '0.25 s'", first))
            row = await db.fetchrow(
                "SELECT status, lease_expires_at FROM jobq.all_jobs WHERE id = $1", job.id
            )
            assert row["status"] == "running" and row["lease_expires_at"] > first
        finally:
            finish.set()
        await until(lambda: worker.stats.done == 1)
        worker.stop()
        await run
    row = await db.fetchrow("SELECT status, attempts, last_error FROM jobq.all_jobs WHERE id = $1", job.id)
    assert dict(row) == {"status": "completed", "attempts": 1, "last_error": None}


@pytest.mark.parametrize("kind", ["plain", "async"])
async def test_stop_lets_running_jobs_finish_within_grace_and_releases_the_rest(service, db, kind):
    unblock = threading.Event()

    def plain_handler(job):
        if job.payload == "stuck":
            unblock.wait(30)
        else:
            time.sleep(0.05 if job.payload == "quick" else 0.3)

    async def async_handler(job):
        if job.payload == "stuck":
            await asyncio.sleep(30)
        else:
            await asyncio.sleep(0.05 if job.payload == "quick" else 0.3)

    async with AsyncClient(service.url) as client:
        await client.admin.configure_queue("g", visibility_timeout=7)
        jobs = await client.enqueue_many([{"queue": "g", "payload": p} for p in ("quick", "medium", "stuck")])
        handler = plain_handler if kind == "plain" else async_handler
        worker = Worker(handler, "g", client=client, concurrency=3, grace=0.8, wait=0.2)
        run = asyncio.create_task(worker.run())
        await until(lambda: worker.stats.done == 1 and worker.stats.in_flight == 2)
        # Leases last the queue's visibility timeout, read when the worker started.
        left = await db.fetchval(
            "SELECT min(lease_expires_at - now()) FROM jobq.all_jobs WHERE status = 'running'"
        )
        assert 5 < left.total_seconds() <= 7

        stopped = time.monotonic()
        worker.stop()
        late = await client.enqueue("g", "late")
        stats = await asyncio.wait_for(run, 5)
        took = time.monotonic() - stopped
        unblock.set()

    assert 0.75 < took < 2.0, took
    assert (stats.done, stats.failed, stats.released, stats.in_flight) == (2, 0, 1, 0)
    rows = {
        r["id"]: r
        for r in await db.fetch(
            "SELECT id, status, attempts, run_at <= now() AS due, last_error FROM jobq.all_jobs"
        )
    }
    assert [rows[j.id]["status"] for j in jobs] == ["completed", "completed", "pending"]
    stuck = rows[jobs[2].id]
    assert stuck["attempts"] == 1 and stuck["due"]  # released to run again at once
    assert stuck["last_error"] == "released: the worker stopped; the job ran past the 0.8s grace period"
    assert (rows[late.id]["status"], rows[late.id]["attempts"]) == ("pending", 0)  # no lease after stop()


async def test_a_job_released_on_its_last_attempt_goes_dead(service, db):
    """A job that ran past the grace period is nacked: it ran, so the attempt counts, as the README says."""

    async def forever(job):
        await asyncio.sleep(30)

    async with AsyncClient(service.url) as client:
        job = await client.enqueue("last", "long", max_attempts=1)
        worker = Worker(forever, "last", client=client, grace=0.1, wait=0.2)
        run = asyncio.create_task(worker.run())
        await until(lambda: worker.stats.in_flight == 1)
        worker.stop()
        assert (await run).released == 1
    row = await db.fetchrow("SELECT status, attempts, last_error FROM jobq.all_jobs WHERE id = $1", job.id)
    assert (row["status"], row["attempts"]) == ("dead", 1) and row["last_error"].startswith("released: ")


async def test_an_ack_after_the_lease_moved_on_counts_as_lost(service, db):
    async with AsyncClient(service.url) as client:

        async def gives_its_job_away(job):
            await client.worker.nack(job, "taken away", retry_after=3600)  # the lease ends under the worker

        job = await client.enqueue("away", 1)
        worker = Worker(gives_its_job_away, "away", client=client, wait=0.2)
        run = asyncio.create_task(worker.run())
        await until(lambda: worker.stats.lost == 1)
        worker.stop()
        stats = await run
    assert (stats.done, stats.failed, stats.lost) == (0, 0, 1)
    row = await db.fetchrow("SELECT status, attempts, last_error FROM jobq.all_jobs WHERE id = $1", job.id)
    assert tuple(row) == ("pending", 1, "taken away")


async def test_a_worker_token_is_enough(start_service, db, caplog):
    """A worker token reads its queue's settings: the worker leases for the queue's visibility timeout."""
    service = start_service(tokens={"w": "worker", "p": "producer", "a": "admin"})
    caplog.set_level(logging.WARNING, logger="jobq.worker")
    async with AsyncClient(service.url, token="a") as operator:
        await operator.admin.configure_queue("tokens", visibility_timeout=45)
    async with AsyncClient(service.url, token="p") as producer:
        job = await producer.enqueue("tokens", "x")
    async with AsyncClient(service.url, token="w") as client:
        leases = []

        async def handler(job):
            leases.append(
                await db.fetchval("SELECT lease_expires_at - now() FROM jobq.all_jobs WHERE id = $1", job.id)
            )

        worker = Worker(handler, "tokens", client=client, wait=0.2)
        run = asyncio.create_task(worker.run())
        await until(lambda: worker.stats.done == 1)
        worker.stop()
        await run
    assert 40 < leases[0].total_seconds() <= 45
    assert "cannot read the settings" not in caplog.text
    assert await db.fetchval("SELECT status FROM jobq.all_jobs WHERE id = $1", job.id) == "completed"


async def test_keeps_going_through_an_outage(start_service, db, caplog):
    service = start_service(statement_timeout=0.3)
    caplog.set_level(logging.WARNING, logger="jobq.worker")
    async with AsyncClient(service.url, retry=RetryPolicy(attempts=1)) as client:
        await client.enqueue("o", "before")
        transaction = db.transaction()
        await transaction.start()
        await db.execute("LOCK TABLE jobq.jobs IN ACCESS EXCLUSIVE MODE")  # the service answers 503 now
        worker = Worker(lambda job: None, "o", client=client, visibility_timeout=30, wait=0.2)
        run = asyncio.create_task(worker.run())
        await until(lambda: "cannot lease from o" in caplog.text)
        await transaction.rollback()
        await until(lambda: worker.stats.done == 1)
        worker.stop()
        await run
    assert await states(db, "o")() == {"completed": 1}


async def test_a_refusal_ends_the_run(service):
    async with AsyncClient(service.url) as client:
        with pytest.raises(ValidationError):
            await Worker(lambda job: None, "not a queue!", client=client, visibility_timeout=5).run()


POLL_WAIT = 20  # seconds the stopping tests' long-polls wait: the worker must exit well before that


async def test_stop_ends_a_waiting_long_poll_and_strands_nothing(start_service, db):
    service = start_service(wakeup_safety_interval=0.5)  # a gone client's long-poll ends within 0.5 s
    async with AsyncClient(service.url) as client:
        worker = Worker(lambda job: None, "idle", client=client, wait=POLL_WAIT, visibility_timeout=30)
        run = asyncio.create_task(worker.run())
        await until(lambda: service.app.state.runtime.wakeups.waiter_count() == 1)  # in its long-poll
        worker.stop()
        stats = await asyncio.wait_for(run, POLL_WAIT / 2)  # the poll was cut short, not waited out
        assert (stats.done, stats.released, stats.in_flight) == (0, 0, 0)
        await assert_nothing_stranded(service, db, "idle")  # the client still open: the poll's request ended


async def test_stop_as_the_long_poll_starts_strands_nothing(start_service, db):
    """stop() after 0 to 7 turns of the event loop: before its first lease request, and as it goes out."""
    service = start_service(wakeup_safety_interval=0.5)
    async with AsyncClient(service.url) as client:
        for steps in range(8):
            worker = Worker(lambda job: None, "idle", client=client, wait=POLL_WAIT, visibility_timeout=30)
            run = asyncio.create_task(worker.run())
            for _ in range(steps):
                await asyncio.sleep(0)
            worker.stop()
            await asyncio.wait_for(run, POLL_WAIT / 2)
        await assert_nothing_stranded(service, db, "idle")


async def test_jobq_worker_stopped_in_its_long_poll_strands_nothing(start_service, db, tmp_path):
    service = start_service(wakeup_safety_interval=0.5)
    process = _worker_process(tmp_path, service.url, "--wait", str(POLL_WAIT), stderr=subprocess.DEVNULL)
    try:
        await until(lambda: service.app.state.runtime.wakeups.waiter_count() == 1)  # in its long-poll
        process.send_signal(signal.SIGTERM)
        assert process.wait(POLL_WAIT / 2) == 0  # the poll was cut short, not waited out
    finally:
        if process.poll() is None:
            process.kill()
    await assert_nothing_stranded(service, db, "cli")


def test_describe_keeps_type_message_and_the_innermost_frames():
    class Boom(Exception):
        pass

    def nested(depth: int) -> None:
        if depth == 0:
            raise Boom("the disk is full")
        nested(depth - 1)

    try:
        nested(7)
    except Boom as exc:
        text = describe(exc)
    head, title, *frames = text.splitlines()
    assert head.endswith("Boom: the disk is full") and head.startswith("test_worker.")
    assert title == "Traceback (innermost last, 4 more above):"
    assert sum(1 for line in frames if line.lstrip().startswith("File ")) == 5
    assert 'raise Boom("the disk is full")' in text

    assert len(describe(RuntimeError("x" * 10_000))) == ERROR_CHARS
    assert describe(KeyError()) == "KeyError"


HANDLERS = """
import threading

never = threading.Event()


def run(job):
    if job.payload == "fail":
        raise RuntimeError("no luck")
    if job.payload == "block":
        never.wait()
"""


def _worker_process(tmp_path: Path, url: str, *args: str, **popen) -> subprocess.Popen:
    (tmp_path / "handlers.py").write_text(HANDLERS)
    command = [*JOBQ, "worker", "handlers:run", "--queue", "cli", "--wait", "0.2", *args]
    return subprocess.Popen(command, cwd=tmp_path, env=jobq_env(JOBQ_URL=url), **popen)


async def test_jobq_worker_command_logs_status_and_stops_on_signals(service, db, tmp_path):
    async with AsyncClient(service.url) as client:
        await client.admin.configure_queue("cli", backoff_base=3600)
        await client.enqueue_many([{"queue": "cli", "payload": p} for p in ["ok"] * 20 + ["fail", "block"]])
    process = _worker_process(
        tmp_path, service.url, "-c", "4", "--status-interval", "0.2", stderr=subprocess.PIPE, text=True
    )
    said: list[str] = []  # its log, read as it goes
    try:
        by_payload = "SELECT array_agg(DISTINCT status) FROM jobq.all_jobs WHERE payload = $1::jsonb"
        await until(equals(states(db, "cli"), {"completed": 20, "pending": 1, "running": 1}), 20)
        await until(equals(lambda: db.fetchval(by_payload, '"fail"'), ["pending"]))
        await until(equals(lambda: db.fetchval(by_payload, '"block"'), ["running"]))
        process.send_signal(signal.SIGTERM)
        # The blocked job holds it, within the 30 s grace: it says so, and has not exited; its status, every
        # 0.2 s, counts the blocked job in flight.
        waiting, status = "stopping: 1 jobs running, waiting up to 30s", "status: cli: 20 done, 1 failed, 1/4"
        while not (any(waiting in line for line in said) and any(status in line for line in said)):
            said.append(await asyncio.wait_for(asyncio.to_thread(process.stderr.readline), 15))
            assert said[-1], "".join(said)  # the end of its output: it exited
        assert process.poll() is None
        process.send_signal(signal.SIGTERM)  # again: release it now
        assert process.wait(5) == 0
    finally:
        if process.poll() is None:
            process.kill()
    log = "".join(said) + process.stderr.read()
    assert await states(db, "cli")() == {"completed": 20, "pending": 2}
    blocked = await db.fetchrow("SELECT attempts, last_error FROM jobq.all_jobs WHERE payload = '\"block\"'")
    assert blocked["attempts"] == 1 and blocked["last_error"].startswith("released: the worker stopped")
    assert "status: cli: 20 done, 1 failed, 1/4 in flight" in log
    assert "failed (attempt 1 of 5, now pending): RuntimeError: no luck" in log
    assert "SIGTERM: no more leases" in log and "SIGTERM again: releasing running jobs now" in log
    assert re.search(
        r"worker stopped after [\d.]+s \([\d.]+ jobs/s on average\): "
        r"cli: 20 done, 1 failed, 0/4 in flight, 1 released\n",
        log,
    )


async def test_jobq_worker_draws_a_status_line_on_a_terminal(service, db, tmp_path):
    async with AsyncClient(service.url) as client:
        await client.enqueue("cli", "ok")
    controller, terminal = pty.openpty()
    process = _worker_process(tmp_path, service.url, stdin=subprocess.DEVNULL, stderr=terminal)
    os.close(terminal)
    screen = b""
    try:
        deadline = time.monotonic() + 15
        while b"\r\x1b[Kcli: 1 done, 0 failed, 0/1 in flight" not in screen:
            assert time.monotonic() < deadline, screen
            if select.select([controller], [], [], 0.1)[0]:
                screen += os.read(controller, 4096)
        process.send_signal(signal.SIGINT)
        assert process.wait(5) == 0
    finally:
        if process.poll() is None:
            process.kill()
        os.close(controller)
    assert await states(db, "cli")() == {"completed": 1}


def test_jobq_worker_reports_a_handler_it_cannot_load(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    done = invoke(["worker", "no_such_module:run", "--queue", "q"])
    assert done.exit_code == 2
    assert "cannot load no_such_module:run: No module named 'no_such_module'" in done.stderr


# --- the buffer, batching, and exactly-once ------------------------------------------------------------


class Requests:
    """Counts the requests a client sends, by path."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.client_options = recording(self.sent)

    @property
    def paths(self) -> list[str]:
        return [line.partition(" ")[2] for line in self.sent]

    def clear(self) -> None:
        self.sent.clear()

    def count(self, path: str) -> int:
        return self.paths.count(path)


async def test_prefetched_jobs_are_given_back_on_stop_their_attempt_not_counted(service, db):
    go_on = asyncio.Event()

    async def handler(job):
        await go_on.wait()

    async with AsyncClient(service.url) as client:
        await client.enqueue_many([{"queue": "pre", "payload": n} for n in range(10)])
        worker = Worker(handler, "pre", client=client, concurrency=4, wait=0.2, visibility_timeout=30)
        run = asyncio.create_task(worker.run())
        # 4 running and as many buffered: the worker holds 8 of the 10.
        await until(equals(states(db, "pre"), {"running": 8, "pending": 2}))
        assert worker.stats.in_flight == 4
        worker.stop()
        go_on.set()  # the running ones finish within the grace period
        stats = await asyncio.wait_for(run, 5)
    assert (stats.done, stats.failed, stats.released, stats.lost, stats.in_flight) == (4, 0, 4, 0, 0)
    rows = await db.fetch("SELECT status, attempts, count(*) AS n FROM jobq.all_jobs GROUP BY 1, 2")
    assert {(r["status"], r["attempts"]): r["n"] for r in rows} == {("completed", 1): 4, ("pending", 0): 6}


class HeldAnswers(AsyncWorkerCalls):
    """Leases carried out by the service at once, but whose answers, after the first lease's, reach the
    worker only once `answer` is set: on their way when stop() comes, as on a loaded machine when SIGTERM
    and the answer arrive together."""

    def __init__(self, client: AsyncClient) -> None:
        super().__init__(client)
        self.waits: list[float] = []  # each lease's `wait`, once the service has carried it out
        self.held = asyncio.Event()  # an answer is held
        self.answer = asyncio.Event()  # set: the held answers go on to the worker
        self.cancelled = 0  # held answers whose lease the worker cancelled

    async def lease(self, queue, **options):  # type: ignore[no-untyped-def, override]
        jobs = await super().lease(queue, **options)
        self.waits.append(options["wait"])
        if len(self.waits) > 1:
            self.held.set()
            try:
                await self.answer.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        return jobs


class HeldAnswersClient(AsyncClient):
    """A client whose `worker` calls are `HeldAnswers`."""

    @functools.cached_property
    def worker(self) -> HeldAnswers:
        return HeldAnswers(self)


async def test_a_short_lease_answered_as_stop_comes_has_its_jobs_given_back_not_left_claimed(service, db):
    """stop() lets a short lease (wait 0) on its way finish: the service may have leased its jobs already,
    and only for a long-poll whose client left does it hand them back itself."""
    go_on = asyncio.Event()
    started: list[int] = []

    async def handler(job):
        started.append(job.id)
        await go_on.wait()

    async with HeldAnswersClient(service.url) as client:
        await client.enqueue_many([{"queue": "held", "payload": n} for n in range(6)])
        worker = Worker(handler, "held", client=client, concurrency=2, wait=POLL_WAIT, visibility_timeout=30)
        run = asyncio.create_task(worker.run())
        # Two running (the first lease, a long-poll, found them at once), and the second lease's two jobs
        # leased by the service, its answer held.
        await until(lambda: len(started) == 2 and client.worker.held.is_set())
        assert await states(db, "held")() == {"running": 4, "pending": 2}
        assert client.worker.waits == [POLL_WAIT, 0]
        worker.stop()
        go_on.set()
        await until(lambda: worker.stats.done == 2)  # the running jobs acked: the stop is well under way
        client.worker.answer.set()  # the held answer reaches the stopping worker
        stats = await asyncio.wait_for(run, 5)
    assert client.worker.cancelled == 0, "stop() cancelled a short lease the service had carried out"
    assert (stats.done, stats.failed, stats.released, stats.lost, stats.in_flight) == (2, 0, 2, 0, 0)
    # The held answer's jobs are pending again at once, their attempt not counted.
    rows = await db.fetch("SELECT id, status, attempts FROM jobq.all_jobs")
    assert {r["id"]: (r["status"], r["attempts"]) for r in rows} == {
        r["id"]: ("completed", 1) if r["id"] in started else ("pending", 0) for r in rows
    }


async def test_a_second_stop_cuts_a_short_lease_on_its_way_short(service, db):
    """A second stop() does not wait for a short lease's answer (nor for the running handlers)."""

    async def handler(job):
        await asyncio.Event().wait()  # runs until released

    async with HeldAnswersClient(service.url) as client:
        await client.enqueue_many([{"queue": "cut", "payload": n} for n in range(6)])
        worker = Worker(handler, "cut", client=client, concurrency=2, wait=POLL_WAIT, visibility_timeout=30)
        run = asyncio.create_task(worker.run())
        await until(lambda: worker.stats.in_flight == 2 and client.worker.held.is_set())
        worker.stop()
        worker.stop()
        stats = await asyncio.wait_for(run, 5)  # the answer is held for ever: only the second stop ends it
    assert client.worker.cancelled == 1
    assert (stats.done, stats.failed, stats.released, stats.lost, stats.in_flight) == (0, 0, 2, 0, 0)
    rows = await db.fetch("SELECT status, attempts, count(*) AS n FROM jobq.all_jobs GROUP BY 1, 2")
    # The running jobs released (they ran: the attempt counts); the cut lease's jobs claimed until their
    # visibility timeout, the price of a second stop.
    assert {(r["status"], r["attempts"]): r["n"] for r in rows} == {
        ("pending", 1): 2,
        ("running", 1): 2,
        ("pending", 0): 2,
    }


class AskingCalls(AsyncWorkerCalls):
    """Records how many jobs each lease asks for."""

    def __init__(self, client: AsyncClient) -> None:
        super().__init__(client)
        self.asked: list[int] = []

    async def lease(self, queue, **options):  # type: ignore[no-untyped-def, override]
        self.asked.append(options["max_jobs"])
        return await super().lease(queue, **options)


class AskingClient(AsyncClient):
    """A client whose `worker` calls are `AskingCalls`."""

    @functools.cached_property
    def worker(self) -> AskingCalls:
        return AskingCalls(self)


@pytest.mark.parametrize("seconds", [0.0, 0.2])
async def test_the_buffer_grows_for_fast_handlers_and_stays_small_for_slow_ones(service, db, seconds):
    """Fast handlers get leases of hundreds; slow ones no more than they finish in PREFETCH_SECONDS."""
    count = 3000 if seconds == 0 else 12

    async def handler(job):
        await asyncio.sleep(seconds)

    async with AskingClient(service.url) as client:
        for start in range(0, count, 1000):
            await client.enqueue_many(
                [{"queue": "buf", "payload": n} for n in range(start, min(count, start + 1000))]
            )
        worker = Worker(handler, "buf", client=client, concurrency=2, wait=0.2)
        run = asyncio.create_task(worker.run())
        await until(lambda: worker.stats.done == count, timeout=60)
        worker.stop()
        await run
    asked = client.worker.asked
    if seconds == 0:
        assert max(asked) >= 300, asked  # a no-op takes microseconds: full half-leases
    else:
        assert max(asked) <= 2, asked  # 2 running and 2 buffered, asked for half at a time
    assert await states(db, "buf")() == {"completed": count}


async def test_a_job_buffered_too_long_is_given_back_rather_than_started_late(service, db):
    started: dict[object, float] = {}
    finished: dict[object, float] = {}
    let_go = asyncio.Event()

    async def handler(job):
        started[job.payload] = time.monotonic()
        if job.payload == "long":
            await let_go.wait()  # holds the one slot until "short" has been given back
        finished[job.payload] = time.monotonic()

    async with AsyncClient(service.url) as client:
        long, short = await client.enqueue_many([{"queue": "stale", "payload": p} for p in ("long", "short")])
        worker = Worker(handler, "stale", client=client, concurrency=1, wait=0.2, visibility_timeout=0.9)
        run = asyncio.create_task(worker.run())
        # Leased with "long", "short" waits in the buffer; past 0.3 s it is given back, not started.
        await until(lambda: worker.stats.released == 1)
        row = await db.fetchrow("SELECT status, attempts FROM jobq.all_jobs WHERE id = $1", short.id)
        assert "long" not in finished and tuple(row) == ("pending", 0)
        let_go.set()
        await until(lambda: worker.stats.done == 2)
        worker.stop()
        stats = await run
    assert (stats.done, stats.released, stats.lost) == (2, 1, 0)
    assert started["short"] >= finished["long"]  # run after the slot freed, once
    rows = await db.fetch(
        "SELECT status, attempts FROM jobq.all_jobs WHERE id = ANY($1)", [long.id, short.id]
    )
    assert [tuple(r) for r in rows] == [("completed", 1)] * 2


async def test_acks_and_nacks_go_in_batches(service, db):
    requests = Requests()

    async def handler(job):
        if job.payload % 10 == 0:
            raise ValueError("bad")

    async with AsyncClient(service.url, **requests.client_options) as client:
        await client.admin.configure_queue("b", backoff_base=3600)
        await client.enqueue_many([{"queue": "b", "payload": n} for n in range(300)])
        requests.clear()
        worker = Worker(handler, "b", client=client, concurrency=16, wait=0.2, visibility_timeout=30)
        run = asyncio.create_task(worker.run())
        await until(lambda: worker.stats.done + worker.stats.failed == 300)
        worker.stop()
        stats = await run
    assert (stats.done, stats.failed, stats.lost) == (270, 30, 0)
    assert requests.count("/ack") == requests.count("/nack") == 0
    assert 1 <= requests.count("/ack/batch") <= 270 // 10
    assert 1 <= requests.count("/nack/batch") <= 30 // 3
    assert requests.count("/lease") <= 300 // 8  # leased in batches too
    assert await states(db, "b")() == {"completed": 270, "pending": 30}


async def test_runners_never_run_a_job_twice(service, db):
    """Two runners, plain and async, 16 slots each, on one queue: every job runs exactly once."""
    seen: list[int] = []
    threads: set[str] = set()

    def plain(job):
        threads.add(threading.current_thread().name)
        seen.append(job.id)  # list.append is atomic
        time.sleep(0.001)

    async def coroutine(job):
        seen.append(job.id)
        await asyncio.sleep(0.001)

    async with AsyncClient(service.url) as client:
        await client.enqueue_many([{"queue": "once", "payload": n} for n in range(1000)])
        workers = [Worker(h, "once", client=client, concurrency=16, wait=0.2) for h in (plain, coroutine)]
        runs = [asyncio.create_task(w.run()) for w in workers]
        await until(lambda: sum(w.stats.done for w in workers) == 1000, 60)
        for worker in workers:
            worker.stop()
        stats = await asyncio.gather(*runs)
    assert len(seen) == len(set(seen)) == 1000
    assert sum(s.lost + s.failed + s.released for s in stats) == 0
    assert len(threads) <= 16  # the plain handler ran on the runner's 16 threads, not a thread per job
    attempts = await db.fetch("SELECT status, attempts, count(*) AS n FROM jobq.all_jobs GROUP BY 1, 2")
    assert [tuple(r) for r in attempts] == [("completed", 1, 1000)]


async def test_an_idle_queue_does_not_crowd_out_a_busy_one(service, db):
    """One runner on two queues: while it long-polls the empty one, the other's jobs keep all its slots
    busy; a job arriving on the empty one is picked up too."""
    gauge = Gauge()
    ran: list[str] = []

    async def handler(job):
        gauge.enter()
        ran.append(job.queue)
        await asyncio.sleep(0.005)
        gauge.leave()

    async with AsyncClient(service.url) as client:
        await client.enqueue_many([{"queue": "busy", "payload": n} for n in range(300)])
        # A long-poll of the idle queue holding all the room would hold it for its whole minute.
        worker = Worker(handler, ["idle", "busy"], client=client, concurrency=8, wait=60)
        run = asyncio.create_task(worker.run())
        await until(lambda: worker.stats.done == 300, 20)
        await client.enqueue("idle", "late")
        await until(lambda: worker.stats.done == 301)
        worker.stop()
        stats = await asyncio.wait_for(run, 10)
    assert (stats.done, stats.failed, stats.lost, stats.released) == (301, 0, 0, 0)
    assert gauge.peak == 8
    assert ran.count("busy") == 300 and ran[-1] == "idle"
    assert await states(db, "busy")() == {"completed": 300}
    assert await states(db, "idle")() == {"completed": 1}


# --- a queue that does not exist ---------------------------------------------------------------------


async def test_warns_at_start_of_a_queue_that_does_not_exist_naming_those_that_do(start_service, caplog):
    """A typo in a queue name would idle for ever: the worker says so at start, with the queues there are
    (as many as the token may list), and works on (the queue may yet get its first job)."""
    service = start_service(tokens={"w": "worker", "v": {"roles": ["worker", "viewer"]}, "a": "admin"})
    caplog.set_level(logging.INFO, logger="jobq.worker")
    async with AsyncClient(service.url, token="a") as operator:
        await operator.enqueue("emails", {"to": "ada@example.com"})
        await operator.admin.configure_queue("reports", visibility_timeout=60)  # settings, no jobs
        for n in range(30):
            await operator.enqueue(f"other-{n:02}", {})

    async def started(token: str, *queues: str, **options) -> str:
        caplog.clear()
        async with AsyncClient(service.url, token=token) as client:
            worker = Worker(lambda job: None, list(queues), client=client, wait=0.2, **options)
            run = asyncio.create_task(worker.run())
            await until(lambda: any(" up to " in r.getMessage() for r in caplog.records))  # started
            worker.stop()
            await run
        return "\n".join(r.getMessage() for r in caplog.records if r.name == "jobq.worker")

    said = await started("v", "emials", "emails")
    (line,) = [line for line in said.splitlines() if "does not exist" in line]
    assert "queue emials does not exist yet (no jobs, no settings)" in line
    assert "did you mean emails?" in line
    assert "queues that exist: emails, other-00, " in line and "other-18, and 12 more" in line  # 20 named
    assert "emails does not exist" not in said
    # Told whether the worker reads the queue's lease length from the service or is given it.
    assert "emials does not exist yet" in await started("v", "emials", visibility_timeout=30)
    # A token that may not list queues still hears of the missing one.
    said = await started("w", "emials")
    assert "queue emials does not exist yet" in said and "this token may not list the queues" in said
    assert "does not exist" not in await started("w", "emails", "reports")


async def test_jobq_worker_warns_of_a_queue_that_does_not_exist(service, tmp_path):
    async with AsyncClient(service.url) as client:
        await client.enqueue("emails", {"to": "ada@example.com"})
    process = _worker_process(tmp_path, service.url, "--queue", "emials", stderr=subprocess.PIPE, text=True)
    try:
        line = await asyncio.to_thread(process.stderr.readline)
        while "emials" not in line and line:
            line = await asyncio.to_thread(process.stderr.readline)
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 0
    finally:
        if process.poll() is None:
            process.kill()
    assert "WARNING jobq.worker: queue emials does not exist yet" in line
    assert "did you mean emails? queues that exist: emails" in line
