"""Durable execution in a task (jobq/tasks.py `Context`), run by the worker against a real service: a step
runs its function once across retries and answers its recorded result afterwards; `ctx.sleep` and
`ctx.wait_for_event` end the handler and it runs again from the top; the client's calls behind them; and a
job that uses none of it costs no request more than before."""

from __future__ import annotations

import asyncio
import time

import pytest

import jobq
from jobq import AsyncClient, Client, Tasks, Worker
from jobq.types import JobStatus
from tests.sent import recording
from tests.waiting import until

pytestmark = pytest.mark.anyio


async def _run_until(worker: Worker, done) -> None:
    """Run `worker` until `done()` holds, then stop it."""
    running = asyncio.create_task(worker.run())
    try:
        await until(done, timeout=20)
    finally:
        worker.stop()
        await running


def _tasks(url: str) -> Tasks:
    return Tasks(queue="orders", client=Client(url), async_client=AsyncClient(url))


@pytest.mark.parametrize("kind", ["plain", "async"])
async def test_a_step_runs_once_across_retries(service, kind):
    tasks = _tasks(service.url)
    effects: list[str] = []

    def effect(name: str, order: int) -> dict:
        effects.append(name)
        return {"step": name, "order": order}

    if kind == "plain":

        @tasks.task(name="place")
        def place(order: int, ctx: jobq.Context) -> list:
            charged = ctx.step("charge", effect, "charge", order)
            shipped = ctx.step("ship", effect, "ship", order)
            if ctx.job.attempts == 1:
                raise RuntimeError("the mail server is down")
            ctx.step("email", effect, "email", order)
            return [charged, shipped]

    else:

        @tasks.task(name="place")
        async def place(order: int, ctx: jobq.Context) -> list:
            charged = await ctx.astep("charge", effect, "charge", order)

            async def ship() -> dict:
                return effect("ship", order)

            shipped = await ctx.astep("ship", ship)
            if ctx.job.attempts == 1:
                raise RuntimeError("the mail server is down")
            await ctx.astep("email", effect, "email", order)
            return [charged, shipped]

    async with AsyncClient(service.url) as client:
        await client.admin.configure_queue("orders", backoff_base=0.1, backoff_cap=0.1)
        job = await place.aenqueue(order=7)
        worker = Worker(tasks, client=client, wait=0.2)
        await _run_until(worker, lambda: worker.stats.done == 1)
        done = await client.get_job(job.id)
    assert effects == ["charge", "ship", "email"]  # each once, though the job ran twice
    assert done.status == JobStatus.COMPLETED and done.attempts == 2
    assert done.result == [{"step": "charge", "order": 7}, {"step": "ship", "order": 7}]
    assert done.steps == {
        "charge": {"step": "charge", "order": 7},
        "ship": {"step": "ship", "order": 7},
        "email": {"step": "email", "order": 7},
    }


async def test_a_sleep_ends_the_handler_and_it_resumes_after(service):
    tasks = _tasks(service.url)
    runs: list[float] = []

    @tasks.task
    def remind(user: str, ctx: jobq.Context) -> str:
        runs.append(time.monotonic())
        ctx.step("first", lambda: "sent")
        ctx.sleep(1)
        return ctx.step("second", lambda: "sent again")

    async with AsyncClient(service.url) as client:
        job = await remind.aenqueue(user="ada")
        worker = Worker(tasks, client=client, wait=5)
        await _run_until(worker, lambda: worker.stats.done == 1)
        done = await client.get_job(job.id)
    assert len(runs) == 2 and runs[1] - runs[0] >= 0.9
    assert worker.stats.suspended == 1 and worker.stats.failed == 0
    assert done.result == "sent again" and done.attempts == 1  # the sleep counted no attempt
    assert set(done.steps) == {"first", "jobq.sleep:0", "second"}


async def test_a_wait_for_an_event_parks_the_job_until_it_is_sent(service):
    tasks = _tasks(service.url)
    seen: list[object] = []

    @tasks.task
    async def checkout(order: int, ctx: jobq.Context) -> object:
        paid = ctx.wait_for_event(f"paid:{order}", timeout=60)
        late = ctx.wait_for_event(f"shipped:{order}", timeout=1)
        seen.extend([paid.payload, late])
        return paid.payload

    async with AsyncClient(service.url) as client:
        job = await checkout.aenqueue(order=7)
        worker = Worker(tasks, client=client, wait=1)
        running = asyncio.create_task(worker.run())
        try:
            parked = await until(lambda: _status(client, job.id, "waiting"))
            assert parked.waiting_for.event == "paid:7"
            sent = await client.send_event("paid:7", {"amount": 42})
            assert sent.woken == 1
            await until(lambda: worker.stats.done == 1, timeout=20)
        finally:
            worker.stop()
            await running
        done = await client.get_job(job.id)
    assert seen == [{"amount": 42}, None]  # the second wait ran out
    assert done.result == {"amount": 42} and done.attempts == 1
    assert [(e.name, e.timed_out) for e in done.events] == [("paid:7", False), ("shipped:7", True)]


async def _status(client: AsyncClient, job_id: int, status: str):
    job = await client.get_job(job_id)
    return job if job.status == status else None


async def test_a_job_without_steps_makes_no_request_more(service):
    tasks = _tasks(service.url)

    @tasks.task
    def plain(n: int) -> int:
        return n

    sent: list[str] = []
    async with AsyncClient(service.url, **recording(sent)) as client:
        await plain.aenqueue(n=1)
        worker = Worker(tasks, client=client, wait=0.2)
        await _run_until(worker, lambda: worker.stats.done == 1)
    assert {line.split()[1] for line in sent} <= {
        "/jobs/batch",
        "/jobs",
        "/queues/orders",
        "/lease",
        "/ack/batch",
    }


def test_the_client_records_steps_and_sends_events(service):
    with Client(service.url) as client:
        client.enqueue("q", None)
        (job,) = client.worker.lease("q")
        client.worker.record_step(job, "a", {"n": 1})
        with pytest.raises(jobq.Conflict) as taken:
            client.worker.record_step(job, "a", {"n": 2})
        assert taken.value.problem["result"] == {"n": 1}
        awaited = client.worker.await_event(job, "go", 30)
        assert awaited.status == JobStatus.WAITING
        assert client.send_event("go", [1, 2]).woken == 1
        (again,) = client.worker.lease("q")
        assert again.steps == {"a": {"n": 1}}
        assert [(e.name, e.payload) for e in again.events] == [("go", [1, 2])]
        (released,) = client.worker.release([again], delay=3600)
        assert released.ok
        assert client.get_job(job.id).sleeping_until is not None
        assert [e.payload for e in client.admin.events("go").events] == [[1, 2]]
