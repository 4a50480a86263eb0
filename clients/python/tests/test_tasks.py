"""Tasks (jobq/tasks.py) and a worker serving them, against a real service and database: enqueue by task
with arguments as the payload, routing by kind across queues, Retry and Fail, unknown kinds, payloads that
do not fit, per-task settings, and `jobq worker module`."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
import types
from datetime import UTC, datetime

import pytest

import jobq
from jobq import AsyncClient, Client, Tasks, Worker, current_job
from jobq.worker import Stats
from tests.sent import recording
from tests.service_process import JOBQ, jobq_env
from tests.waiting import equals, states, until

pytestmark = pytest.mark.anyio


def registry(url: str) -> tuple[Tasks, list[tuple[str, object]]]:
    """Two tasks on two queues, one plain and one async, recording what they were called with."""
    tasks = Tasks(client=Client(url), async_client=AsyncClient(url))
    calls: list[tuple[str, object]] = []

    @tasks.task(queue="emails", max_attempts=3, priority=2)
    def send_email(to: str, subject: str = "Hello", **headers: str) -> None:
        calls.append(("send_email", (to, subject, headers, current_job().id)))

    @tasks.task(queue="reports")
    async def build_report(day: str) -> None:
        await asyncio.sleep(0)
        calls.append(("build_report", (day, current_job().id)))

    return tasks, calls


async def test_one_worker_runs_the_tasks_of_two_queues_by_kind(service, db):
    tasks, calls = registry(service.url)
    send_email, build_report = tasks["send_email"], tasks["build_report"]
    first = send_email.enqueue("ada@example.com", subject="Hi", reply_to="bob@example.com")
    second = await build_report.aenqueue(day="2026-11-23")
    assert (first.queue, first.kind, first.payload) == (
        "emails",
        "send_email",
        {"to": "ada@example.com", "subject": "Hi", "reply_to": "bob@example.com"},
    )
    assert (first.max_attempts, first.priority) == (3, 2)  # the task's settings
    assert (second.queue, second.kind, second.payload) == ("reports", "build_report", {"day": "2026-11-23"})

    async with AsyncClient(service.url) as client:
        # Without the task's code: any producer sends the same JSON, and the defaults apply when it runs.
        third = await client.enqueue("emails", {"to": "eve@example.com"}, kind="send_email")
        worker = Worker(tasks, client=client, concurrency=4, wait=0.2)
        assert worker.queues == ["emails", "reports"]
        run = asyncio.create_task(worker.run())
        await until(lambda: worker.stats.done == 3)
        worker.stop()
        stats = await asyncio.wait_for(run, 5)
    assert (stats.done, stats.failed, stats.lost) == (3, 0, 0)
    assert sorted(calls, key=str) == sorted(
        [
            ("send_email", ("ada@example.com", "Hi", {"reply_to": "bob@example.com"}, first.id)),
            ("send_email", ("eve@example.com", "Hello", {}, third.id)),
            ("build_report", ("2026-11-23", second.id)),
        ],
        key=str,
    )
    assert await states(db, "emails")() == {"completed": 2}
    assert await states(db, "reports")() == {"completed": 1}
    tasks.client.close()
    await tasks.async_client.aclose()


def test_enqueue_checks_the_arguments_against_the_function_before_sending():
    tasks = Tasks(client=Client("http://127.0.0.1:9"))  # nothing listens: nothing may be sent

    @tasks.task
    def resize(path: str, width: int = 100) -> None: ...

    assert resize.payload("a.png", width=50) == {"path": "a.png", "width": 50}
    assert resize.payload(path="a.png") == {"path": "a.png"}  # defaults are applied when it runs
    with pytest.raises(TypeError, match="missing a required argument: 'path'"):
        resize.enqueue(width=3)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected keyword argument 'height'"):
        resize.enqueue("a.png", height=3)  # type: ignore[call-arg]
    assert resize("x") is None  # calling the task calls the function
    job = resize.using(delay=60, dedup_key="a.png").job("a.png")
    assert job == {
        "queue": "default",
        "kind": "resize",
        "payload": {"path": "a.png"},
        "delay": 60,
        "dedup_key": "a.png",
    }
    assert resize.job("a.png") == {"queue": "default", "kind": "resize", "payload": {"path": "a.png"}}

    def positional(x, /): ...

    with pytest.raises(TypeError, match="cannot be passed by name"):
        tasks.task(positional)
    with pytest.raises(ValueError, match="registered already"):
        tasks.task(name="resize")(lambda: None)


async def run_until(worker: Worker, condition) -> Stats:
    run = asyncio.create_task(worker.run())
    await until(condition)
    worker.stop()
    return await asyncio.wait_for(run, 5)


async def test_retry_after_fail_and_unknown_kinds(service, db):
    tasks = Tasks(queue="q")

    @tasks.task
    def later(n: int) -> None:
        raise jobq.Retry("the mail server is busy", after=300)

    @tasks.task
    async def never(n: int) -> None:
        raise jobq.Fail("the address does not exist")

    async with AsyncClient(service.url) as client:
        await client.admin.configure_queue("q", backoff_base=3600)
        await client.enqueue_many(
            [
                later.job(1),
                never.job(2),
                {"queue": "q", "kind": "nosuch", "payload": {}},
                {"queue": "q", "payload": {}},  # no kind at all
                {"queue": "q", "kind": "later", "payload": [1, 2]},  # not arguments by name
                {"queue": "q", "kind": "later", "payload": {"m": 1}},  # not its arguments
            ]
        )
        started = datetime.now(UTC)
        worker = Worker(tasks, client=client, concurrency=2, wait=0.2)
        stats = await run_until(worker, lambda: worker.stats.failed == 6)
    assert (stats.done, stats.failed) == (0, 6)
    rows = {
        (r["kind"], r["payload"]): r
        for r in await db.fetch(
            "SELECT kind, payload, status, attempts, run_at, last_error FROM jobq.all_jobs"
        )
    }
    retried = rows[("later", '{"n": 1}')]
    assert retried["status"] == "pending" and retried["attempts"] == 1
    assert 290 < (retried["run_at"] - started).total_seconds() < 310  # after=300, not the queue's hour
    assert retried["last_error"].startswith("jobq.tasks.Retry: the mail server is busy")
    failed = rows[("never", '{"n": 2}')]
    assert (failed["status"], failed["attempts"]) == ("dead", 1)  # dead at once, 4 attempts left unused
    assert failed["last_error"].startswith("jobq.tasks.Fail: the address does not exist")
    unknown, kindless = rows[("nosuch", "{}")], rows[(None, "{}")]
    assert unknown["status"] == kindless["status"] == "pending"  # retried: a newer worker may know them
    assert "no task is named 'nosuch' in this worker (it knows: later, never)" in unknown["last_error"]
    assert "the job has no kind to name its task (this worker knows: later, never)" in kindless["last_error"]
    listed = rows[("later", "[1, 2]")]
    assert listed["status"] == "dead" and "takes its arguments by name" in listed["last_error"]
    unfit = rows[("later", '{"m": 1}')]
    assert unfit["status"] == "dead"
    assert "the payload does not fit its arguments: missing a required argument: 'n'" in unfit["last_error"]


async def test_a_task_s_visibility_timeout_is_its_lease_while_it_runs(service, db):
    tasks = Tasks(queue="slow")
    release = asyncio.Event()

    @tasks.task(visibility_timeout=120)
    async def crunch() -> None:
        await release.wait()

    async with AsyncClient(service.url) as client:
        # The worker looks at its leases every tenth of the shortest (at most every second): with 5 s, the
        # task's own timeout is set half a second after it starts.
        await client.admin.configure_queue("slow", visibility_timeout=5)
        job = await client.enqueue("slow", None, kind="crunch")
        worker = Worker(tasks, client=client, wait=0.2)
        run = asyncio.create_task(worker.run())
        remaining = "SELECT extract(epoch FROM lease_expires_at - now()) FROM jobq.all_jobs WHERE id = $1"
        # Leased for the queue's 5 s, then extended to the task's 120 s as soon as it runs.
        await until(lambda: _over(db, remaining, job.id, 90))
        release.set()
        await until(lambda: worker.stats.done == 1)
        worker.stop()
        await asyncio.wait_for(run, 5)


async def _over(db, query: str, job_id: int, seconds: float) -> bool:
    value = await db.fetchval(query, job_id)
    return value is not None and value > seconds


TASKS_MODULE = """
import jobq

def shout(text):
    print(text.upper(), flush=True)

async def whisper(text):
    print(text.lower(), flush=True)

def _helper():
    pass
"""


async def test_jobq_worker_runs_the_functions_of_a_module_as_tasks(service, db, tmp_path):
    (tmp_path / "chores.py").write_text(TASKS_MODULE)
    async with AsyncClient(service.url) as client:
        await client.enqueue_many(
            [
                {"queue": "a", "kind": "shout", "payload": {"text": "Hello"}},
                {"queue": "b", "kind": "whisper", "payload": {"text": "Hello"}},
                {"queue": "b", "kind": "_helper", "payload": None},
            ]
        )
        await client.admin.configure_queue("b", backoff_base=3600)
    command = [*JOBQ, "worker", "chores", "--queue", "a", "--queue", "b", "--wait", "0.2", "-c", "2"]
    process = subprocess.Popen(
        command, cwd=tmp_path, env=jobq_env(JOBQ_URL=service.url), stdout=subprocess.PIPE, text=True
    )
    try:
        await until(equals(states(db, "a"), {"completed": 1}))
        await until(equals(states(db, "b"), {"completed": 1, "pending": 1}))
        process.send_signal(signal.SIGTERM)
        assert process.wait(5) == 0
    finally:
        if process.poll() is None:
            process.kill()
    assert sorted(process.stdout.read().split()) == ["HELLO", "hello"]
    helper = await db.fetchval("SELECT last_error FROM jobq.all_jobs WHERE kind = '_helper'")
    assert "no task is named '_helper' in this worker (it knows: shout, whisper)" in helper


def test_the_tasks_of_a_module():
    module = types.ModuleType("mod")
    exec("import jobq\ntasks = jobq.Tasks(queue='x')\n@tasks.task\ndef one(): pass\n", module.__dict__)
    assert Tasks.of_module(module) is module.tasks
    exec("other = jobq.Tasks()\n", module.__dict__)
    with pytest.raises(ValueError, match="has 2 task registries"):
        Tasks.of_module(module)
    empty = types.ModuleType("empty")
    with pytest.raises(ValueError, match="no task registry and no functions"):
        Tasks.of_module(empty)


async def test_a_handler_s_return_value_is_the_job_s_result(start_service, db, caplog):
    service = start_service(max_result_bytes=200)
    tasks = Tasks(queue="r")

    @tasks.task
    def add(a: int, b: int) -> dict[str, int]:
        return {"sum": a + b}

    @tasks.task
    async def odd() -> object:
        return object()  # JSON cannot hold it

    @tasks.task
    def big() -> str:
        return "x" * 500  # past the service's 200 bytes

    @tasks.task
    def nothing() -> None:
        return None

    async with AsyncClient(service.url) as client:
        jobs = await client.enqueue_many([add.job(2, 3), odd.job(), big.job(), nothing.job()])
        worker = Worker(tasks, client=client, concurrency=4, wait=0.2)
        await run_until(worker, lambda: worker.stats.done == 4)
        results = [(await client.get_job(job.id)).result for job in jobs]
    assert results == [{"sum": 5}, None, None, None]
    assert await states(db, "r")() == {"completed": 4}
    assert f"job {jobs[1].id}: its handler returned what JSON cannot hold" in caplog.text
    assert f"job {jobs[2].id}: its result is larger than the service keeps; done without it" in caplog.text


@pytest.mark.parametrize("kind", ["plain", "async"])
async def test_progress_goes_with_the_lease_s_extensions_not_a_request_per_call(service, db, kind):
    tasks = Tasks(queue="p")
    release = threading.Event()

    def plain() -> None:
        for step in range(1, 101):
            jobq.progress({"step": step})
        release.wait(10)

    async def coroutine() -> None:
        for step in range(1, 101):
            jobq.progress({"step": step})
        while not release.is_set():
            await asyncio.sleep(0.01)

    tasks.task(name="work")(plain if kind == "plain" else coroutine)
    sent: list[str] = []
    async with AsyncClient(service.url, **recording(sent)) as client:
        job = await client.enqueue("p", None, kind="work")
        # Leases of 5 s: the worker looks at them, and sends the progress, every half second.
        worker = Worker(tasks, client=client, wait=0.2, visibility_timeout=5)
        run = asyncio.create_task(worker.run())
        shown = "SELECT progress FROM jobq.all_jobs WHERE id = $1"
        await until(equals(lambda: db.fetchval(shown, job.id), '{"step": 100}'), 10)
        release.set()
        await until(lambda: worker.stats.done == 1)
        worker.stop()
        await asyncio.wait_for(run, 5)
    assert 1 <= sent.count("POST /extend") <= 3  # 100 reports, the last one sent


def test_progress_and_current_job_outside_a_handler_say_so():
    with pytest.raises(LookupError, match=r"jobq.progress\(\) is only known inside a handler"):
        jobq.progress(1)
    with pytest.raises(LookupError, match=r"jobq.current_job\(\) is only known inside a handler"):
        current_job()
