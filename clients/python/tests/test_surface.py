"""The client's public surface (jobq/__init__.py, the groups of jobq/client.py) and the spellings it
replaced, which work for one more release: `from jobq import` each name of old, with a DeprecationWarning
naming its module; each method of old on both clients, with one naming its group's method, doing what
that method does against a real service."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import importlib
import re
import warnings
from collections.abc import Callable, Generator
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

import pytest

import jobq
from jobq.client import AdminCalls, AsyncAdminCalls, AsyncWorkerCalls, WorkerCalls
from tests.command_line import invoke
from tests.waiting import until

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[3]

EVERYDAY = {
    "Client",
    "AsyncClient",
    "Tasks",
    "Task",
    "Retry",
    "Fail",
    "current_job",
    "progress",
    "Worker",
    "JobqError",
    "LeaseLost",
    "NotFound",
    "Conflict",
    "Unavailable",
    "ValidationError",
    "Flow",
    "chain",
    "group",
    "chord",
    "parents",
    "aparents",
    "parent_results",
    "aparent_results",
    "verify_push",
    "sign_push",
    "PushVerificationError",
    "Context",
    "context",
    "Suspend",
}

# What `jobq.__all__` was before, and the module each name now comes from.
BEFORE = {
    "jobq.client": {"Call", "Calls", "Completion", "Failure", "RetryPolicy"},
    "jobq.tasks": {"UnknownTask"},
    "jobq.worker": {"Stats"},
    "jobq.types": {
        "NO_LIMIT",
        "AckResult",
        "CatchUp",
        "DeadPage",
        "DeleteKeyResult",
        "DeleteScheduleResult",
        "ExtendResult",
        "Forbidden",
        "ItemResult",
        "Job",
        "JobPage",
        "JobStatus",
        "KeyView",
        "LeasedJob",
        "NackResult",
        "PayloadTooLarge",
        "PurgeResult",
        "QueueDetail",
        "QueueRow",
        "QueueSettings",
        "Rate",
        "RetryDeadResult",
        "Schedule",
        "Unauthorized",
        "Unreachable",
        "WorkerSeen",
    },
}
MOVED = {name: module for module, names in BEFORE.items() for name in names}


def deprecations(caught: list[warnings.WarningMessage]) -> list[str]:
    """The DeprecationWarnings caught, each as `file:message`; each must point at the line that used
    the old spelling, in this file."""
    return [f"{w.filename}:{w.message}" for w in caught if issubclass(w.category, DeprecationWarning)]


def test_all_is_the_everyday_names_and_each_imports_without_a_warning():
    assert set(jobq.__all__) == EVERYDAY and len(jobq.__all__) == len(EVERYDAY)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        namespace: dict[str, Any] = {}
        exec("from jobq import *", namespace)
        for name in EVERYDAY:
            assert namespace[name] is getattr(jobq, name)
    assert not set(namespace) & set(MOVED)  # * brings in nothing of old


@pytest.mark.parametrize("name", sorted(MOVED))
def test_each_name_of_old_imports_with_a_warning_naming_its_module(name):
    module = MOVED[name]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        namespace: dict[str, Any] = {}
        exec(f"from jobq import {name}", namespace)
        attribute = jobq.__dict__.get(name, None)  # not kept: each use warns again
        via_attribute = getattr(jobq, name)
    assert namespace[name] is via_attribute is getattr(importlib.import_module(module), name)
    assert attribute is None
    found = deprecations(caught)
    # The import statement's warnings point at its line (`<string>` here), the attribute's at this file.
    assert {message.split(":", 1)[0] for message in found} == {"<string>", __file__}, found
    assert all(f"from {module} import {name}" in message for message in found), found
    assert f"`{name}`" in (jobq.__doc__ or "")  # the package says where it lives


def test_the_moved_names_are_all_those_of_old_and_every_other_name_is_refused():
    assert not EVERYDAY & set(MOVED)
    assert set(MOVED) == set(jobq._MOVED) and all(jobq._MOVED[n] == m for n, m in MOVED.items())
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        jobq.Nothing  # noqa: B018
    with pytest.raises(ImportError):
        exec("from jobq import Nothing", {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from jobq import cli, types  # submodules import as before, without a warning

        assert types.LeasedJob and cli.main


def group_methods(cls: type) -> set[str]:
    return {name for name in vars(cls) if not name.startswith("_")}


# Calls added to a group after the groups were made: they never had a spelling on the client itself.
GROUPED_ONLY = {"record_step", "await_event", "events"}


def test_both_clients_group_the_same_methods_and_keep_each_old_spelling():
    worker, admin = group_methods(WorkerCalls), group_methods(AdminCalls)
    assert worker == {"lease", "ack", "ack_many", "nack", "nack_many", "extend", "release"} | {
        "record_step",
        "await_event",
    }
    assert (group_methods(AsyncWorkerCalls), group_methods(AsyncAdminCalls)) == (worker, admin)
    assert not worker & admin
    for client in (jobq.Client, jobq.AsyncClient):
        for group, names in (("worker", worker), ("admin", admin)):
            for name in names & GROUPED_ONLY:
                assert not hasattr(client, name), (client, name)
            for name in names - GROUPED_ONLY:
                old = getattr(client, name)
                assert old.__doc__.startswith(f"Deprecated: `client.{group}.{name}`"), (client, name)
    # A producer's calls stay on the client, undeprecated.
    for name in ("enqueue", "enqueue_many", "get_job", "wait", "cancel"):
        assert not (getattr(jobq.Client, name).__doc__ or "").startswith("Deprecated")


class Step(NamedTuple):
    """One call of the tour: a method of a group ("" for the client's own), and its arguments."""

    group: str
    name: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = {}


def tour(queue: str, schedule: str, key: str) -> Generator[Step, Any, list[tuple[str, Any]]]:
    """Every method of both groups once, each on what the calls before it made, in `queue`, `schedule`
    and `key` of the tour's own: yields the calls, gets their results, returns what each answered."""
    seen: list[tuple[str, Any]] = []

    def call(group: str, name: str, *args: Any, **kwargs: Any) -> Step:
        return Step(group, name, args, kwargs)

    seen.append(("configure_queue", (yield call("admin", "configure_queue", queue, backoff_base=3600))))
    yield call("", "enqueue_many", [{"queue": queue, "payload": n, "key": key} for n in range(6)])
    waiting = yield call("", "enqueue", queue, "later", delay=3600)
    leased = yield call("worker", "lease", queue, max_jobs=6, worker_id=f"w-{queue}")
    a, b, c, d, e, f = sorted(leased, key=lambda job: job.payload)
    seen.append(("lease", leased))
    seen.append(("ack", (yield call("worker", "ack", a, {"sum": 1}))))
    seen.append(("ack_many", (yield call("worker", "ack_many", [b]))))
    seen.append(("nack", (yield call("worker", "nack", c, "broke", dead=True))))
    seen.append(("nack_many", (yield call("worker", "nack_many", [(d, "broke too")], dead=True))))
    seen.append(("extend", (yield call("worker", "extend", e, 120, progress={"done": 1}))))
    seen.append(("record_step", (yield call("worker", "record_step", e, "step", {"n": 1}))))
    seen.append(("await_event", (yield call("worker", "await_event", e, queue, 60))))
    yield call("", "send_event", queue, {"n": 2})
    seen.append(("events", (yield call("admin", "events", queue))))
    seen.append(("release", (yield call("worker", "release", [f]))))
    seen.append(("run_now", (yield call("admin", "run_now", waiting.id))))
    seen.append(("jobs", (yield call("admin", "jobs", queue))))
    workers = yield call("admin", "workers")
    seen.append(("workers", [w for w in workers if w.worker_id == f"w-{queue}"]))
    seen.append(("dead_jobs", (yield call("admin", "dead_jobs", queue))))
    seen.append(("retry_dead", (yield call("admin", "retry_dead", [c.id]))))
    seen.append(("purge_dead", (yield call("admin", "purge_dead", d.id))))
    seen.append(("pause", (yield call("admin", "pause", queue))))
    seen.append(("resume", (yield call("admin", "resume", queue))))
    rows = yield call("admin", "queues")
    seen.append(("queues", [row for row in rows if row.queue == queue]))
    seen.append(("queue", (yield call("admin", "queue", queue))))
    seen.append(("set_key", (yield call("admin", "set_key", queue, key, concurrency=2))))
    seen.append(("keys", (yield call("admin", "keys", queue))))
    seen.append(("key", (yield call("admin", "key", queue, key))))
    seen.append(("delete_key", (yield call("admin", "delete_key", queue, key))))
    made = yield call("admin", "set_schedule", schedule, "0 0 1 1 *", queue, {"n": 1}, paused=True)
    seen.append(("set_schedule", made))
    schedules = yield call("admin", "schedules")
    seen.append(("schedules", [s for s in schedules if s.name == schedule]))
    seen.append(("resume_schedule", (yield call("admin", "resume_schedule", schedule))))
    seen.append(("pause_schedule", (yield call("admin", "pause_schedule", schedule))))
    seen.append(("trigger_schedule", (yield call("admin", "trigger_schedule", schedule))))
    seen.append(("schedule", (yield call("admin", "schedule", schedule))))
    seen.append(("delete_schedule", (yield call("admin", "delete_schedule", schedule))))
    return seen


# What differs between two tours that did the same: the ids and tokens of their jobs, ages, and the
# times a worker's row reads as text (`WorkerSeen` leaves them unparsed).
VARYING = {"id", "lease_token", "job_id", "last_job_id", "oldest_pending_age_seconds", "skipped"} | {
    "last_seen",
    "next_deadline",
}


def alike(value: Any, names: dict[str, str]) -> Any:
    """`value` with what differs between two tours taken out: ids, tokens and times, and the tour's own
    queue, schedule and key named as their roles."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return {f.name: alike(getattr(value, f.name), names) for f in fields if f.name not in VARYING}
    if isinstance(value, list | tuple):
        return [alike(item, names) for item in value]
    if isinstance(value, dict):
        return {k: alike(v, names) for k, v in value.items()}
    if isinstance(value, datetime):
        return "a time"
    if isinstance(value, str):
        return names.get(value, value)
    return value


class Spelling(NamedTuple):
    """How a tour's calls are made: by their groups' methods (`old` False), or by the client's methods of
    old; each then checked for the DeprecationWarnings it gave."""

    old: bool

    def method(self, client: Any, step: Step) -> Callable[..., Any]:
        if self.old and step.group and step.name not in GROUPED_ONLY:
            return getattr(client, step.name)
        return getattr(getattr(client, step.group), step.name) if step.group else getattr(client, step.name)

    def check(self, step: Step, caught: list[warnings.WarningMessage], kind: str) -> None:
        found = deprecations(caught)
        if self.old and step.group and step.name not in GROUPED_ONLY:
            assert found == [
                f"{__file__}:{kind}.{step.name}() is deprecated, call client.{step.group}.{step.name}() "
                "instead; the old spelling will be removed in the next release"
            ]
        else:
            assert found == [], found


def take_sync(client: jobq.Client, spelling: Spelling, steps: Generator[Step, Any, Any]) -> Any:
    result = None
    try:
        while True:
            step = steps.send(result)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                result = spelling.method(client, step)(*step.args, **step.kwargs)
            spelling.check(step, caught, "Client")
    except StopIteration as done:
        return done.value


async def take_async(client: jobq.AsyncClient, spelling: Spelling, steps: Generator[Step, Any, Any]) -> Any:
    result = None
    try:
        while True:
            step = steps.send(result)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                answer = spelling.method(client, step)(*step.args, **step.kwargs)
            spelling.check(step, caught, "AsyncClient")  # at the call, before it is awaited
            result = await answer
    except StopIteration as done:
        return done.value


@pytest.mark.parametrize("kind", ["Client", "AsyncClient"])
async def test_each_old_method_does_what_its_group_s_does_and_warns(service, db, kind):
    """The same tour twice, on a queue, schedule and key of its own: by the groups' methods, then by the
    old ones. Each answer is the same but for ids, tokens and times, and so is what each left behind."""
    answers = {}
    for spelling in (Spelling(old=False), Spelling(old=True)):
        prefix = "old" if spelling.old else "new"
        names = {
            f"{prefix}-q": "queue",
            f"{prefix}-s": "schedule",
            f"{prefix}-k": "key",
            f"w-{prefix}-q": "w",
        }
        steps = tour(f"{prefix}-q", f"{prefix}-s", f"{prefix}-k")
        if kind == "Client":
            with jobq.Client(service.url) as client:
                seen = take_sync(client, spelling, steps)
        else:
            async with jobq.AsyncClient(service.url) as client:
                seen = await take_async(client, spelling, steps)
        answers[spelling.old] = [(name, alike(value, names)) for name, value in seen]
        assert {name for name, _ in seen} == group_methods(WorkerCalls) | group_methods(AdminCalls)
    assert answers[True] == answers[False]

    left = await db.fetch(
        "SELECT queue, status, attempts, count(*) AS n FROM jobq.all_jobs GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"
    )
    by_queue: dict[str, list[tuple[str, int, int]]] = {"new-q": [], "old-q": []}
    for row in left:
        by_queue[row["queue"]].append((row["status"], row["attempts"], row["n"]))
    assert (
        by_queue["old-q"]
        == by_queue["new-q"]
        == [
            ("completed", 1, 2),  # acked, one by one and in a batch
            # released, retried from the dead, run now, the schedule's trigger, and (extended, a step
            # recorded) parked for an event, then woken by it
            ("pending", 0, 5),
        ]
    )  # and the other nacked dead, purged


async def test_the_runner_and_the_command_use_the_new_spellings(service):
    """Nothing of jobq warns an application about jobq's own calls: the worker runner (leases, acks,
    nacks, extensions, releases, the queue's settings) and the `jobq` command use the groups."""
    tasks = jobq.Tasks(queue="own")

    @tasks.task
    async def slow(n: int) -> None:
        if n == 0:
            raise jobq.Retry("again", after=3600)
        jobq.progress({"n": n})
        await asyncio.sleep(0.3)  # long enough for the progress to go with an extension

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with jobq.AsyncClient(service.url) as client:
            await client.enqueue_many([slow.job(n) for n in range(3)])
            worker = jobq.Worker(tasks, client=client, concurrency=2, wait=0.2, visibility_timeout=1)
            run = asyncio.create_task(worker.run())
            await until(lambda: worker.stats.done + worker.stats.failed == 3)
            worker.stop()
            stats = await asyncio.wait_for(run, 10)
        for command in (["stats"], ["queues", "pause", "own"], ["dead", "list"], ["workers"]):
            done = invoke([*command, "--url", service.url])
            assert done.exit_code == 0, done.output
    assert (stats.done, stats.failed) == (2, 1)
    assert deprecations(caught) == []


def python_blocks(readme: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", readme.read_text(), re.S)


@pytest.mark.parametrize("readme", ["README.md", "clients/python/README.md"])
def test_the_readmes_python_uses_the_new_spellings(readme):
    """No call of a grouped method but through its group, and no name of old imported from jobq."""
    grouped = group_methods(WorkerCalls) | group_methods(AdminCalls)
    blocks = python_blocks(ROOT / readme)
    assert blocks
    stale = []
    for block in blocks:
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                through_group = isinstance(owner, ast.Attribute) and owner.attr in ("worker", "admin")
                if node.func.attr in grouped and not through_group:
                    stale.append(ast.unparse(node))
            elif isinstance(node, ast.ImportFrom) and node.module == "jobq":
                stale += [alias.name for alias in node.names if alias.name in MOVED]
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                if node.value.id == "jobq" and node.attr in MOVED:
                    stale.append(ast.unparse(node))
    assert stale == []
