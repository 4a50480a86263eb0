"""Dependencies, workflows and debounce (API part 6) through the Python client, against a real service:
`enqueue(depends_on=, run_if=, debounce=)`, the workflow calls of both clients, `jobq.Flow` (and chain,
group, chord) built from tasks and run by a Worker whose handlers read their parents' results, and the
`jobq workflows` commands."""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import pytest

import jobq
from jobq import AsyncClient, Client, Conflict, Tasks, ValidationError, Worker
from jobq.types import (
    Debounce,
    JobStatus,
    Parent,
    RunIf,
    Workflow,
    WorkflowMade,
    WorkflowStatus,
)
from tests.command_line import invoke
from tests.waiting import until

pytestmark = pytest.mark.anyio


async def run_until(tasks: Tasks, url: str, done: int, **options: Any) -> jobq.worker.Stats:
    """Run a Worker over `tasks` until `done` jobs have finished (done or failed), then stop it."""
    async with AsyncClient(url) as client:
        worker = Worker(tasks, client=client, concurrency=4, wait=1, **options)
        run = asyncio.create_task(worker.run())
        try:
            await until(lambda: run.done() or worker.stats.done + worker.stats.failed >= done)
        finally:
            worker.stop()
        return await asyncio.wait_for(run, 15)


# --- dependencies and debounce on enqueue ------------------------------------------------------------


def test_enqueue_with_parents_shows_them_and_the_lease_carries_their_results(service):
    with Client(service.url) as client:
        first = client.enqueue("deps", {"n": 1}, kind="first")
        second = client.enqueue("deps", {"n": 2})
        child = client.enqueue("kids", {"n": 3}, depends_on=[first, second.id])
        assert (child.status, child.depends_on, child.run_if) == (
            JobStatus.WAITING,
            [first.id, second.id],
            RunIf.COMPLETED,
        )
        assert child.workflow_id is None and not child.debounced
        # A job run only if a parent failed is cancelled once they all completed.
        cleanup = client.enqueue("kids", None, depends_on=[first.id], run_if="failed")
        assert cleanup.run_if is RunIf.FAILED
        (batched,) = client.enqueue_many([{"queue": "kids", "payload": 4, "depends_on": [second]}])
        assert (batched.status, batched.depends_on) == (JobStatus.WAITING, [second.id])
        assert client.worker.lease("kids") == []  # waiting jobs are never leased

        leased = client.worker.lease("deps", max_jobs=2)
        assert [job.parents for job in leased] == [None, None]
        client.worker.ack_many([(job, {"got": job.payload["n"]}) for job in leased])
        (child_leased,) = client.worker.lease("kids", wait=5)
        assert child_leased.id == child.id
        assert child_leased.parents == [
            Parent(first.id, "first", JobStatus.COMPLETED, {"got": 1}),
            Parent(second.id, None, JobStatus.COMPLETED, {"got": 2}),
        ]
        page = client.job_parents(child.id, limit=1)
        assert ([p.id for p in page.parents], page.next_after_id) == ([first.id], first.id)
        page = client.job_parents(child.id, limit=1, after_id=page.next_after_id)
        assert ([p.result for p in page.parents], page.next_after_id) == ([{"got": 2}], None)
        assert client.job_parents(first.id).parents == []
        cancelled = client.get_job(cleanup.id)
        assert cancelled.status == JobStatus.CANCELLED and str(first.id) in (cancelled.last_error or "")
        with pytest.raises(ValidationError):
            client.enqueue("kids", None, depends_on=[987_654_321])


async def test_debounce_through_both_clients(service):
    with Client(service.url) as client:
        first = client.enqueue("typing", {"text": "h"}, debounce=Debounce("doc:1", 60))
        again = client.enqueue("typing", {"text": "hi"}, debounce=Debounce("doc:1", 60, max_seconds=120))
        other = client.enqueue("typing", {"text": "x"}, debounce=Debounce("doc:2", 60))
    assert (first.debounced, again.debounced, other.debounced) == (False, True, False)
    assert again.id == first.id != other.id
    assert again.payload == {"text": "hi"} and again.run_at > first.run_at
    async with AsyncClient(service.url) as client:
        third = await client.enqueue("typing", {"text": "hi!"}, debounce=Debounce("doc:1", 0.2))
        assert (third.id, third.debounced) == (first.id, True)
        (batched,) = await client.enqueue_many(
            [{"queue": "typing", "payload": {"text": "y"}, "debounce": Debounce("doc:2", 60)}]
        )
        assert (batched.id, batched.debounced) == (other.id, True)
        # The burst of doc:1 runs once, with its last payload, once it paused for 0.2 s.
        (leased,) = await until(lambda: client.worker.lease("typing"))
        assert (leased.id, leased.payload) == (first.id, {"text": "hi!"})
        with pytest.raises(ValidationError):
            await client.enqueue("typing", 1, delay=5, debounce=Debounce("doc:3", 1))


# --- workflow calls ----------------------------------------------------------------------------------

ORDER = [
    {"ref": "charge", "queue": "payments", "kind": "charge", "payload": {"order": 7}, "max_attempts": 1},
    {"ref": "render", "queue": "pdf", "payload": {"order": 7}},
    {"ref": "send", "queue": "emails", "payload": {"order": 7}, "depends_on": ["charge", "render"]},
]


def test_workflow_calls_of_the_blocking_client(service):
    with Client(service.url) as client:
        made = client.create_workflow(ORDER, name="order-7")
        assert isinstance(made, WorkflowMade)
        assert (made.name, made.status) == ("order-7", WorkflowStatus.RUNNING)
        assert [(j.ref, j.status) for j in made.jobs] == [
            ("charge", JobStatus.PENDING),
            ("render", JobStatus.PENDING),
            ("send", JobStatus.WAITING),
        ]
        workflow = client.get_workflow(made.id)
        assert workflow.ids == made.ids
        send = workflow.job("send")
        assert (send.queue, send.kind, send.status, send.depends_on) == (
            "emails",
            None,
            JobStatus.WAITING,
            ["charge", "render"],
        )
        assert workflow.counts == {"pending": 2, "waiting": 1} and workflow.finished_at is None
        assert client.get_job(made.ids["send"]).workflow_id == made.id

        # The charge fails: the send is cancelled, the workflow failed; a retry resumes it.
        (charge,) = client.worker.lease("payments")
        client.worker.nack(charge, "declined")
        (render,) = client.worker.lease("pdf")
        client.worker.ack(render, {"pdf": "7.pdf"})
        failed = client.wait_workflow(made.id, 10)
        assert failed.status == WorkflowStatus.FAILED and failed.finished_at is not None
        assert failed.job("send").status == JobStatus.CANCELLED
        with pytest.raises(jobq.NotFound):
            client.retry_workflow(987_654)


def test_retry_cancel_and_list_workflows(service):
    with Client(service.url) as client:
        made = client.create_workflow(ORDER, name="order-7")
        (charge,) = client.worker.lease("payments")
        client.worker.nack(charge, "declined")
        (render,) = client.worker.lease("pdf")
        client.worker.ack(render, {"queue": "pdf"})
        assert client.wait_workflow(made.id, 10).status == WorkflowStatus.FAILED
        resumed = client.retry_workflow(made.id)
        assert resumed.status == WorkflowStatus.RUNNING
        assert resumed.job("charge").status == JobStatus.PENDING
        assert resumed.job("send").status == JobStatus.WAITING
        with pytest.raises(Conflict):
            client.retry_workflow(made.id)  # only a failed workflow is retried
        (charge,) = client.worker.lease("payments")
        client.worker.ack(charge, {"queue": "payments"})
        (send,) = client.worker.lease("emails", wait=5)
        assert [p.result for p in send.parents or []] == [{"queue": "payments"}, {"queue": "pdf"}]
        client.worker.ack(send)
        assert client.wait_workflow(made.id, 10).status == WorkflowStatus.COMPLETED
        with pytest.raises(Conflict):
            client.cancel_workflow(made.id)  # only a running workflow is cancelled

        other = client.create_workflow([{"ref": "a", "queue": "q", "payload": None}], name="other")
        cancelled = client.cancel_workflow(other.id)
        assert cancelled.status == WorkflowStatus.CANCELLED
        assert cancelled.job("a").status == JobStatus.CANCELLED

        assert [w.id for w in client.workflows().workflows] == [other.id, made.id]
        assert [w.id for w in client.workflows(name="order-7").workflows] == [made.id]
        assert [w.id for w in client.workflows(status="cancelled").workflows] == [other.id]
        page = client.workflows(limit=1)
        assert ([w.id for w in page.workflows], page.next_before_id) == ([other.id], other.id)
        page = client.workflows(limit=1, before_id=page.next_before_id)
        assert [(w.id, w.name, w.status) for w in page.workflows] == [
            (made.id, "order-7", WorkflowStatus.COMPLETED)
        ]


async def test_workflow_calls_of_the_async_client_and_refusals(service):
    async with AsyncClient(service.url) as client:
        made = await client.create_workflow(ORDER, idempotency_key="order-7")
        again = await client.create_workflow(ORDER, idempotency_key="order-7")
        assert again.id == made.id and made.name is None
        waited = await client.wait_workflow(made.id, 0.2)  # nothing ran: as it is after the timeout
        assert waited.status == WorkflowStatus.RUNNING
        assert isinstance(await client.get_workflow(made.id), Workflow)
        assert (await client.workflows(status="running")).workflows[0].id == made.id
        assert (await client.cancel_workflow(made.id)).status == WorkflowStatus.CANCELLED
        cycle = [
            {"ref": "a", "queue": "q", "payload": 1, "depends_on": ["b"]},
            {"ref": "b", "queue": "q", "payload": 2, "depends_on": ["a"]},
        ]
        with pytest.raises(ValidationError, match="cycle"):
            await client.create_workflow(cycle)
        with pytest.raises(jobq.NotFound):
            await client.get_workflow(987_654)
        with pytest.raises(ValueError, match="take no dedup_key"):
            await client.create_workflow([{"ref": "a", "queue": "q", "payload": 1, "dedup_key": "k"}])
        with pytest.raises(ValueError, match="needs a ref"):
            await client.create_workflow([{"queue": "q", "payload": 1}])


# --- Flow, chain, group, chord ----------------------------------------------------------------------


def checkout_tasks(url: str) -> Tasks:
    return Tasks(queue="shop", client=Client(url), async_client=AsyncClient(url))


def test_a_flow_is_the_request_of_a_workflow():
    tasks = Tasks(queue="shop")

    @tasks.task
    def charge(order: int) -> dict[str, int]:
        return {"order": order}

    @tasks.task(queue="mail", priority=3)
    def invoice(order: int, copy: bool = False) -> None: ...

    flow = jobq.Flow("checkout")
    a = flow.add(charge.s(order=7))
    b = flow.add(charge.using(delay=5, queue="slow").s(8), ref="late")
    c = flow.add(invoice.s(order=7), after=[a, b, 123], run_if="finished")
    d = flow.add({"queue": "audit", "payload": None}, after=c)
    assert (a, b, c, d) == ("charge-1", "late", "invoice-1", "audit-1")
    assert flow.jobs() == [
        {"ref": "charge-1", "queue": "shop", "kind": "charge", "payload": {"order": 7}},
        {"ref": "late", "queue": "slow", "kind": "charge", "payload": {"order": 8}, "delay": 5},
        {
            "ref": "invoice-1",
            "queue": "mail",
            "kind": "invoice",
            "payload": {"order": 7},
            "priority": 3,
            "depends_on": ["charge-1", "late", 123],
            "run_if": "finished",
        },
        {"ref": "audit-1", "queue": "audit", "payload": None, "depends_on": ["invoice-1"]},
    ]
    assert flow.leaves() == ["audit-1"] and len(flow) == 4
    with pytest.raises(ValueError, match="no job of this flow has ref 'nope'"):
        flow.add(charge.s(1), after=["nope"])
    with pytest.raises(ValueError, match="taken"):
        flow.add(charge.s(1), ref="late")
    with pytest.raises(ValueError, match="no dedup_key"):
        flow.add(charge.using(dedup_key="k").s(1))
    with pytest.raises(ValueError, match="run_if goes with parents"):
        flow.add(charge.s(1), run_if="failed")
    with pytest.raises(TypeError):
        invoice.s(order=7, nope=1)  # type: ignore[call-arg]

    chained = jobq.chain(charge.s(1), charge.s(2), invoice.s(3), name="c")
    assert [(j["ref"], j.get("depends_on")) for j in chained.jobs()] == [
        ("charge-1", None),
        ("charge-2", ["charge-1"]),
        ("invoice-1", ["charge-2"]),
    ]
    assert chained.name == "c"
    grouped = jobq.group(charge.s(1), charge.s(2))
    assert [j.get("depends_on") for j in grouped.jobs()] == [None, None]
    chord = jobq.chord(grouped, invoice.s(9), name="sum")
    assert chord.jobs()[-1]["depends_on"] == ["charge-1", "charge-2"] and chord.name == "sum"
    assert len(grouped) == 2  # the chord copied the group
    listed = jobq.chord([charge.s(1), charge.s(2)], invoice.s(9))
    assert listed.jobs() == chord.jobs()


async def test_a_diamond_runs_each_job_after_its_parents_and_passes_results_on(service):
    tasks = checkout_tasks(service.url)
    ran: list[str] = []
    seen: dict[str, Any] = {}

    @tasks.task
    def start(order: int) -> dict[str, int]:
        ran.append("start")
        return {"order": order}

    @tasks.task
    def left(factor: int) -> int:  # a plain handler, on a thread
        (parent,) = jobq.parent_results()
        time.sleep(0.1)
        ran.append("left")
        return int(parent["order"]) * factor

    @tasks.task
    async def right(factor: int) -> int:  # an async handler, on the loop
        (parent,) = await jobq.aparent_results("start")
        await asyncio.sleep(0.2)
        ran.append("right")
        return int(parent["order"]) * factor

    @tasks.task
    def join() -> int:
        seen["parents"] = jobq.parents()
        seen["by kind"] = (jobq.parent_results(left), jobq.parent_results("right"))
        ran.append("join")
        return sum(jobq.parent_results())

    flow = jobq.Flow("diamond")
    a = flow.add(start.s(order=7))
    b = flow.add(left.s(factor=2), after=[a])
    c = flow.add(right.s(factor=3), after=a)
    d = flow.add(join.s(), after=[b, c])
    made = await flow.asubmit()  # through the first task's registry's AsyncClient
    assert list(made.ids) == [a, b, c, d]

    stats = await run_until(tasks, service.url, 4)
    assert (stats.done, stats.failed) == (4, 0)
    assert ran[0] == "start" and ran[-1] == "join" and set(ran[1:3]) == {"left", "right"}
    assert [(p.id, p.kind, p.status, p.result) for p in seen["parents"]] == [
        (made.ids[b], "left", JobStatus.COMPLETED, 14),
        (made.ids[c], "right", JobStatus.COMPLETED, 21),
    ]
    assert seen["by kind"] == ([14], [21])
    async with AsyncClient(service.url) as client:
        workflow = await client.wait_workflow(made.id, 10)
        assert workflow.status == WorkflowStatus.COMPLETED
        assert workflow.job(d).depends_on == [b, c]
        assert (await client.get_job(made.ids[d])).result == 35


async def test_chain_and_chord_submitted_through_a_blocking_client(service):
    tasks = checkout_tasks(service.url)

    @tasks.task
    def add(x: int, y: int = 0) -> int:
        previous = jobq.parent_results()  # a chain's job: the one before's result
        return x + y + sum(previous)

    @tasks.task
    def total() -> list[int]:
        return list(jobq.parent_results())

    with Client(service.url) as client:
        chained = jobq.chain(add.s(1), add.s(10), add.s(100), name="sums").submit(client)
        chorded = jobq.chord(jobq.group(add.s(1, 2), add.s(3, 4), add.s(5, 6)), total.s()).submit()
    await run_until(tasks, service.url, 7)
    with Client(service.url) as client:
        assert client.wait_workflow(chained.id, 10).status == WorkflowStatus.COMPLETED
        assert client.get_job(chained.ids["add-3"]).result == 111
        assert client.wait_workflow(chorded.id, 10).status == WorkflowStatus.COMPLETED
        assert client.get_job(chorded.ids["total-1"]).result == [3, 7, 11]


async def test_parents_are_paged_when_the_lease_does_not_carry_them(service):
    """A job with more than 100 parents is leased without them: `parents()` pages them (a plain handler
    waits for that on its thread; an async one awaits `aparents()`, its `parents()` saying so)."""
    tasks = checkout_tasks(service.url)
    seen: dict[str, Any] = {}

    @tasks.task
    def many() -> None:
        seen["sync"] = [p.result for p in jobq.parents()]
        seen["sync again"] = jobq.parent_results()  # read once per job

    @tasks.task
    async def amany() -> None:
        try:
            jobq.parents()
        except RuntimeError as exc:
            seen["refused"] = str(exc)
        seen["async"] = await jobq.aparent_results()

    @tasks.task
    def orphan() -> None:
        seen["orphan"] = jobq.parents()

    with Client(service.url) as client:
        parents = client.enqueue_many([{"queue": "many", "payload": n} for n in range(101)])
        leased = client.worker.lease("many", max_jobs=101)
        client.worker.ack_many([(job, job.payload) for job in leased])
        orphan.enqueue()
        client.enqueue("shop", {}, kind="many", depends_on=parents)
        client.enqueue("shop", {}, kind="amany", depends_on=parents)
    stats = await run_until(tasks, service.url, 3)
    assert (stats.done, stats.failed) == (3, 0)
    assert seen["sync"] == seen["async"] == list(range(101))
    assert seen["sync again"] == list(range(101))
    assert "await jobq.aparents()" in seen["refused"]
    assert seen["orphan"] == []


def test_parents_outside_a_handler_say_so():
    with pytest.raises(LookupError, match="only known inside a handler"):
        jobq.parents()
    with pytest.raises(LookupError, match="only known inside a handler"):
        jobq.parent_results()


# --- the command line --------------------------------------------------------------------------------


def test_the_workflows_commands(service):
    url = ["--url", service.url]
    with Client(service.url) as client:
        made = client.create_workflow(ORDER, name="order-7")
        other = client.create_workflow([{"ref": "only", "queue": "solo", "payload": 1}])

    done = invoke(["workflows", "list", *url])
    assert done.exit_code == 0, done.output
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["ID", "NAME", "STATUS", "CREATED", "FINISHED"]
    assert [line.split()[:3] for line in lines[1:]] == [[str(other.id), "-", "running"]] + [
        [str(made.id), "order-7", "running"]
    ]
    done = invoke(["workflows", "list", "--name", "order-7", "--limit", "1", "--json", *url])
    assert [w["id"] for w in json.loads(done.stdout)["workflows"]] == [made.id]
    done = invoke(["workflows", "list", "--status", "completed", *url])
    assert done.stdout == "no workflows\n"
    done = invoke(["workflows", "list", "--limit", "1", *url])
    assert done.stdout.endswith(f"more: add --before-id {other.id}\n")

    done = invoke(["workflows", "show", str(made.id), *url])
    assert done.exit_code == 0, done.output
    assert done.stdout.startswith(f"workflow {made.id} order-7: running\n")
    assert "jobs: pending 2, waiting 1" in done.stdout
    send = next(line for line in done.stdout.splitlines() if line.startswith("send "))
    assert send.split() == ["send", str(made.ids["send"]), "emails", "-", "waiting", "charge,", "render"]
    done = invoke(["workflows", "show", str(made.id), "--json", *url])
    shown = json.loads(done.stdout)
    assert shown["status"] == "running" and shown["jobs"][2]["depends_on"] == ["charge", "render"]
    done = invoke(["workflows", "show", str(made.id), "--wait", "0.1", *url])
    assert done.exit_code == 124  # not finished in time, as `jobq job --wait`

    with Client(service.url) as client:
        (charge,) = client.worker.lease("payments")
        client.worker.nack(charge, "declined")
        (render,) = client.worker.lease("pdf")
        client.worker.ack(render)
    done = invoke(["workflows", "show", str(made.id), "--wait", "10", *url])
    assert done.exit_code == 1 and done.stdout.startswith(f"workflow {made.id} order-7: failed\n")
    done = invoke(["workflows", "retry", str(made.id), *url])
    assert done.exit_code == 0 and done.stdout.startswith(f"workflow {made.id} order-7: running\n")
    done = invoke(["workflows", "retry", str(made.id), *url])
    assert done.exit_code == 1 and "only a failed workflow can be retried" in done.stderr
    done = invoke(["workflows", "cancel", str(other.id), "--json", *url])
    assert json.loads(done.stdout)["status"] == "cancelled"
    done = invoke(["workflows", "show", str(other.id), "--wait", "5", *url])
    assert done.exit_code == 1
    assert re.search(r"^only\s+\d+\s+solo\s+-\s+cancelled\s+-$", done.stdout, re.M), done.stdout
    done = invoke(["workflows", "show", "987654", *url])
    assert done.exit_code == 1 and "does not exist" in done.stderr

    done = invoke(["job", str(made.ids["send"]), *url])
    assert f"  workflow       {made.id}\n" in done.stdout
    assert f"  depends on     {made.ids['charge']}, {made.ids['render']} (runs if completed)\n" in done.stdout
