"""The Python client of the jobq HTTP API: `Client` (blocking) and `AsyncClient` (asyncio), both on aiohttp.

    with Client("http://127.0.0.1:8000") as jobq:
        jobq.enqueue("emails", {"to": "ada@example.com"})
        for job in jobq.worker.lease("emails", wait=5):
            ...
            jobq.worker.ack(job)
        print(jobq.admin.queue("emails").pending)

A client's own methods are a producer's: `enqueue`, `enqueue_many`, `get_job`, `wait` and `cancel`; and
those of workflows, jobs made together each after its parents: `create_workflow` (or a `jobq.Flow`),
`get_workflow`, `wait_workflow`, `workflows`, `cancel_workflow`, `retry_workflow`, and `job_parents`. The
other calls are in two groups, by who makes them: `client.worker` the lease protocol (`WorkerCalls`:
lease, ack, nack, extend, release, and the batch forms), which the worker runner makes for most
applications; `client.admin` operating the service (`AdminCalls`: jobs listed, dead jobs, queues, keys,
schedules, workers), for people, scripts and the `jobq` command. Methods are named as the calls were
before they were grouped, and the old spellings on the client itself still work, with a
DeprecationWarning (`_moved`), for one release.

Each API call is written once, in `Calls`: the request it sends and how its answer is read. The two
clients only send those calls, through one retry policy (`_exchange`, driven by both), and make each
attempt the same way (`_Aiohttp`: `Client` runs it on an event loop of its own, `_Loop`), so they cannot
drift apart. Problem answers become exceptions chosen by their `code` (`LeaseLost`, `NotFound`, ...),
all `JobqError`; results are the dataclasses of `jobq.types`. `Call`, `Calls`, `RetryPolicy`, and the
batch items `Completion` and `Failure` are imported from here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import json
import os
import random
import threading
import time
import urllib.request
import uuid
import warnings
import weakref
from collections.abc import Callable, Coroutine, Generator, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Concatenate, Generic, NamedTuple, ParamSpec, TypeAlias, TypeVar
from urllib.parse import quote, urlsplit

import aiohttp

try:
    import orjson
except ImportError:  # pragma: no cover - a dependency; without it answers are only read slower
    orjson = None  # type: ignore[assignment]

from jobq.types import (
    FINISHED,
    WORKFLOW_FINISHED,
    AckResult,
    Awaited,
    CatchUp,
    DeadPage,
    Debounce,
    DeleteKeyResult,
    DeleteScheduleResult,
    Event,
    EventPage,
    EventSent,
    ExtendResult,
    ItemResult,
    Job,
    JobPage,
    KeyView,
    LeasedJob,
    NackItemResult,
    NackResult,
    NoLimit,
    Parent,
    ParentPage,
    PurgeResult,
    QueueDetail,
    QueueRow,
    QueueSettings,
    Rate,
    RetryDeadResult,
    RunIf,
    Schedule,
    Unreachable,
    WorkerSeen,
    Workflow,
    WorkflowMade,
    WorkflowPage,
    error_from,
    load,
)

__all__ = [
    "AdminCalls",
    "AsyncAdminCalls",
    "AsyncClient",
    "AsyncWorkerCalls",
    "Call",
    "Calls",
    "Client",
    "Completion",
    "Failure",
    "RetryPolicy",
    "WorkerCalls",
]

DEFAULT_URL = "http://127.0.0.1:8000"
MAX_WAIT = 60.0  # seconds one long-poll may wait, at most (the service's limit)

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")


# --- reading answers -------------------------------------------------------------------------------

# Every digit becomes 0 and everything else a space: a run of 19 digits is then a plain substring.
_DIGITS_ONLY = bytes(0x30 if 0x30 <= byte <= 0x39 else 0x20 for byte in range(256))
_LONG_NUMBER = b"0" * 19


def _decode(data: bytes) -> Any:
    """An answer's JSON, as Python's json module reads it. orjson reads it in well under half the time
    (a worker reads a hundred jobs per lease), but reads an integer past 64 bits as a float; a payload
    may hold one (PostgreSQL keeps every digit), so an answer with a run of 19 digits anywhere, or
    anything else orjson refuses, is read by the json module instead."""
    if orjson is not None and _LONG_NUMBER not in data.translate(_DIGITS_ONLY):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)


def _job(data: Mapping[str, Any]) -> Job:
    return load(Job, data)


def _jobs(data: Mapping[str, Any]) -> list[Job]:
    return [load(Job, j) for j in data["jobs"]]


def _leased(data: Mapping[str, Any]) -> list[LeasedJob]:
    return [_leased_job(j) for j in data["jobs"]]


def _leased_job(j: Mapping[str, Any], time: Callable[[str], datetime] = datetime.fromisoformat) -> LeasedJob:
    """`load(LeasedJob, j)` written out: a worker reads hundreds of these per lease, and this is twice as
    fast (clients/python/tests/test_client.py checks that both agree)."""
    return LeasedJob(
        j["id"],
        j["queue"],
        j["payload"],
        j["priority"],
        j["attempts"],
        j["max_attempts"],
        time(j["run_at"]),
        time(j["created_at"]),
        j.get("last_error"),
        j["lease_token"],
        time(j["lease_expires_at"]),
        j.get("kind"),
        j.get("key"),
        j.get("traceparent"),
        j.get("tracestate"),
        None if (parents := j.get("parents")) is None else [_parent(p) for p in parents],
        j.get("steps"),
        None if (events := j.get("events")) is None else [load(Event, e) for e in events],
    )


def _parent(p: Mapping[str, Any]) -> Parent:
    return load(Parent, p)


def _nothing(data: Any) -> None:
    return None


def _item_results(data: Mapping[str, Any]) -> list[ItemResult]:
    # `load` written out, as for leased jobs: a worker reads one per job it acks.
    return [ItemResult(r["id"], r["ok"], r.get("code")) for r in data["results"]]


def _nack_item_results(data: Mapping[str, Any]) -> list[NackItemResult]:
    return [load(NackItemResult, r) for r in data["results"]]


def _job_page(data: Mapping[str, Any]) -> JobPage:
    return JobPage([load(Job, j) for j in data["jobs"]], data.get("next_before_id"))


def _queue_rows(rows: list[Mapping[str, Any]]) -> list[QueueRow]:
    return [load(QueueRow, r) for r in rows]


def _workers(data: Mapping[str, Any]) -> list[WorkerSeen]:
    return [load(WorkerSeen, w) for w in data["workers"]]


def _rate(data: Mapping[str, Any] | None) -> Rate | None:
    return None if data is None else load(Rate, data)


def _queue_detail(data: Mapping[str, Any]) -> QueueDetail:
    settings = data["settings"]
    rates = {name: _rate(settings.get(name)) for name in ("rate", "key_rate")}
    return load(QueueDetail, {**data, "settings": load(QueueSettings, {**settings, **rates})})


def _key_view(data: Mapping[str, Any]) -> KeyView:
    return load(KeyView, {**data, "rate": _rate(data.get("rate"))})


def _key_views(data: Mapping[str, Any]) -> list[KeyView]:
    return [_key_view(k) for k in data["keys"]]


def _limit(value: object) -> object:
    """A flow-control setting as PATCH takes it: NO_LIMIT is null, a Rate an object."""
    if isinstance(value, NoLimit):
        return None
    if isinstance(value, Rate):
        return {"limit": value.limit, "period": value.period}
    return value


def _schedules(data: Mapping[str, Any]) -> list[Schedule]:
    return [load(Schedule, s) for s in data["schedules"]]


def _reader(cls: type[T]) -> Callable[[Mapping[str, Any]], T]:
    return functools.partial(load, cls)


# --- calls -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One API call: the request, and how a 2xx answer's JSON becomes the result."""

    method: str
    path: str
    read: Callable[[Any], T]
    json: Any = None
    params: dict[str, Any] | None = None
    # Seconds the service may hold the request on purpose (a long-poll), added to the read timeout.
    wait: float = 0
    # Whether sending it again is harmless when an answer was lost in transit (the request may have
    # been carried out). Requests that never reached the service are always sent again.
    idempotent: bool = True
    # Sent with the request, the same on every try (an enqueue's Idempotency-Key).
    headers: dict[str, str] | None = None
    # What to send next, given this call's result (None: the result is the answer): a call of several
    # requests, such as a wait longer than one long-poll, or an enqueue that then waits for its job.
    then: Callable[[T], Call[T] | None] | None = None


def _compact(values: Mapping[str, Any]) -> dict[str, Any]:
    """Leave out unset options, so the service applies its defaults; times as RFC 3339."""
    return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in values.items() if v is not None}


def _new_job(job: Mapping[str, Any]) -> dict[str, Any]:
    if "queue" not in job or "payload" not in job:
        raise ValueError("each job needs a queue and a payload (null is a valid payload)")
    options = {k: v for k, v in job.items() if k not in ("queue", "payload")}
    if options.get("depends_on") is not None:
        options["depends_on"] = [_parent_ref(p) for p in options["depends_on"]]
    if isinstance(options.get("debounce"), Debounce):
        debounce: Debounce = options["debounce"]
        options["debounce"] = _compact(
            {"key": debounce.key, "seconds": debounce.seconds, "max_seconds": debounce.max_seconds}
        )
    return {"queue": job["queue"], "payload": job["payload"]} | _compact(options)


def _parent_ref(parent: int | str | Job) -> int | str:
    """A parent as depends_on names it: a job's id (a `Job` stands for its own), or in a workflow the ref
    of a sibling."""
    return parent.id if isinstance(parent, Job) else parent


def _lease_of(job: LeasedJob | int, lease_token: str | None) -> dict[str, Any]:
    if isinstance(job, LeasedJob):
        return {"id": job.id, "lease_token": lease_token or job.lease_token}
    if lease_token is None:
        raise ValueError("a job id needs its lease_token")
    return {"id": job, "lease_token": lease_token}


class Completion(NamedTuple):
    """One item of `ack_many` with a result: a job done, and what it produced (any JSON value, kept with
    the job; None: no result). A plain `(job, result)` tuple is the same item; a bare job has none."""

    job: LeasedJob
    result: Any = None


CompletionLike: TypeAlias = LeasedJob | Completion | tuple[LeasedJob, Any]


def _ack_item(item: CompletionLike) -> dict[str, Any]:
    """An ack_many item: the job's lease, and its result when it has one."""
    if isinstance(item, LeasedJob):
        return _lease_of(item, None)
    job, result = Completion(*item)
    if result is None:  # a worker's usual item, one per job it acks
        return _lease_of(job, None)
    return _lease_of(job, None) | _compact({"result": result})


class Failure(NamedTuple):
    """One item of `nack_many`: a job that failed, its error, and its own `retry_after` and `dead` where
    they differ from the call's (None: the call's). A plain tuple of its first two, three or four
    fields is the same item: `(job, error)`, `(job, error, 60)`, `(job, error, None, True)`."""

    job: LeasedJob
    error: str | None = None
    retry_after: float | None = None  # seconds; None: the call's retry_after
    dead: bool | None = None  # None: the call's dead


FailureLike: TypeAlias = (
    Failure
    | tuple[LeasedJob, str | None]
    | tuple[LeasedJob, str | None, float | None]
    | tuple[LeasedJob, str | None, float | None, bool | None]
)


def _nack_item(failure: FailureLike, retry_after: float | None, dead: bool) -> dict[str, Any]:
    """A nack_many item: the failure's own retry_after and dead where given, else the call's."""
    job, error, own_retry_after, own_dead = Failure(*failure)
    if own_retry_after is not None:
        retry_after = own_retry_after
    return (
        _lease_of(job, None)
        | _compact({"error": error, "retry_after": retry_after})
        | {"dead": dead if own_dead is None else own_dead}
    )


def _segment(name: str) -> str:
    return quote(name, safe="")


def _once(idempotency_key: str | None) -> dict[str, str]:
    """The header that makes an enqueue safe to send again: the service carries out a request with a
    given key once and answers its repeats with the first answer (for a few minutes), so a retry after
    a lost answer cannot enqueue twice. One key per call, the same on each of its tries."""
    return {"Idempotency-Key": idempotency_key or uuid.uuid4().hex}


def _wait_call(job_id: int, deadline: float) -> Call[Job]:
    left = max(0.0, min(MAX_WAIT, deadline - time.monotonic()))
    then = functools.partial(_wait_more, deadline=deadline)
    return Call("GET", f"/jobs/{job_id}", _job, params={"wait": round(left, 3)}, wait=left, then=then)


def _wait_more(job: Job, *, deadline: float) -> Call[Job] | None:
    """The next long-poll of a wait for `job`, while it is unfinished and time is left."""
    if job.status in FINISHED or deadline <= time.monotonic():
        return None
    return _wait_call(job.id, deadline)


def _workflow(data: Mapping[str, Any]) -> Workflow:
    return load(Workflow, data)


def _wait_workflow_call(workflow_id: int, deadline: float) -> Call[Workflow]:
    left = max(0.0, min(MAX_WAIT, deadline - time.monotonic()))
    then = functools.partial(_wait_workflow_more, deadline=deadline)
    path = f"/workflows/{workflow_id}"
    return Call("GET", path, _workflow, params={"wait": round(left, 3)}, wait=left, then=then)


def _wait_workflow_more(workflow: Workflow, *, deadline: float) -> Call[Workflow] | None:
    """The next long-poll of a wait for `workflow`, while it runs and time is left."""
    if workflow.status in WORKFLOW_FINISHED or deadline <= time.monotonic():
        return None
    return _wait_workflow_call(workflow.id, deadline)


_WORKFLOW_JOB_FIELDS = frozenset(
    {"ref", "queue", "payload", "kind", "key", "priority", "max_attempts", "delay", "run_at"}
    | {"depends_on", "run_if"}
)


def _workflow_job(job: Mapping[str, Any]) -> dict[str, Any]:
    """A job of a workflow as POST /workflows takes it; a field it does not take is a ValueError here,
    rather than the service's 422 for the whole request."""
    if "ref" not in job:
        raise ValueError("each job of a workflow needs a ref (what its children name it by)")
    unknown = sorted(k for k, v in job.items() if k not in _WORKFLOW_JOB_FIELDS and v is not None)
    if unknown:
        raise ValueError(
            f"job {job['ref']!r}: a workflow's jobs take no {', '.join(unknown)} (they take "
            f"{', '.join(sorted(_WORKFLOW_JOB_FIELDS))})"
        )
    return _new_job(job)


class Calls:
    """Every call of the API, written once. The clients expose each under the same name, on the client
    or in its `worker` or `admin` group."""

    @staticmethod
    def enqueue(
        queue: str,
        payload: Any,
        *,
        priority: int | None = None,
        delay: float | None = None,
        run_at: datetime | None = None,
        max_attempts: int | None = None,
        dedup_key: str | None = None,
        kind: str | None = None,
        key: str | None = None,
        idempotency_key: str | None = None,
        wait: float | None = None,
        depends_on: Iterable[int | Job] | None = None,
        run_if: RunIf | str | None = None,
        debounce: Debounce | None = None,
    ) -> Call[Job]:
        """Enqueue a job (`POST /jobs`). With a `dedup_key` an active job of the queue already holds, the
        answer is that job, with `duplicate` True. Lower `priority` runs first; `delay` is in seconds.
        `kind` names what the job is (`send_email`: 1-128 of A-Z a-z 0-9 _ . : -), for workers to
        route it by; `key` what flow control groups it by (a tenant, a customer: 1-256 characters).
        The call is sent with an `Idempotency-Key` (`idempotency_key`, else a fresh random one), so its
        retries enqueue it at most once.

        `depends_on`: its parents, 1-1000 existing jobs (ids, or `Job`s). It starts `waiting` and is
        decided once the last of them has ended: it runs if `run_if` holds (`completed`, the default:
        every parent completed; `finished`: whatever they ended as; `failed`: one at least dead or
        cancelled), else it is cancelled. A `delay` counts from then. Its handler reads what they
        returned with `jobq.parents()`. Not with `dedup_key`.

        `debounce` (`Debounce(key, seconds, max_seconds)`): while a job of the queue with that key is
        still pending, the enqueue lands in it (payload replaced, run_at moved to now + seconds, never
        past its first enqueue + max_seconds), and the answer is that job with `debounced` True; else a
        new job runs in `seconds`. Not with `run_at`, `delay`, `dedup_key` or `depends_on`.

        With `wait` (seconds), the call then waits for the job to finish, as `wait` does, and answers
        the job as it is then: request and reply in one call (`job.status`, `job.result`)."""
        options = dict(priority=priority, delay=delay, run_at=run_at, max_attempts=max_attempts)
        body = _new_job(
            {"queue": queue, "payload": payload, **options, "dedup_key": dedup_key, "kind": kind, "key": key}
            | {"depends_on": None if depends_on is None else list(depends_on), "run_if": run_if}
            | {"debounce": debounce}
        )
        then = functools.partial(_wait_more, deadline=time.monotonic() + wait) if wait else None
        return Call("POST", "/jobs", _job, json=body, headers=_once(idempotency_key), then=then)

    @staticmethod
    def enqueue_many(
        jobs: Iterable[Mapping[str, Any]], *, idempotency_key: str | None = None
    ) -> Call[list[Job]]:
        """Enqueue 1..1000 jobs at once, all or nothing (`POST /jobs/batch`); each is a mapping with the
        fields of `enqueue` (`{"queue": ..., "payload": ..., "priority": ..., "kind": ...}`, and
        `depends_on`, `run_if`, `debounce`), each job its own. Answers in order. Sent with an
        `Idempotency-Key`, as `enqueue` is. For jobs that depend on each other, make a workflow
        (`create_workflow`)."""
        body = [_new_job(j) for j in jobs]
        return Call("POST", "/jobs/batch", _jobs, json={"jobs": body}, headers=_once(idempotency_key))

    @staticmethod
    def create_workflow(
        jobs: Iterable[Mapping[str, Any]], *, name: str | None = None, idempotency_key: str | None = None
    ) -> Call[WorkflowMade]:
        """Make a workflow: 1..1000 jobs, all or none (`POST /workflows`), each a mapping with the fields
        of `enqueue_many`'s jobs (no `dedup_key` or `debounce`) and a `ref` (1-128 characters, unique
        in the workflow) that its siblings' `depends_on` name it by: `depends_on` lists refs of
        siblings and ids of existing jobs (or `Job`s). A job without parents is pending at once, the
        others wait for theirs. A cycle, or an unknown or repeated ref, is a `ValidationError` naming
        it. `name` says what it is (for people, and `workflows(name=...)`). The answer has each job's
        id by ref (`made.ids["charge"]`). Sent with an `Idempotency-Key`, as `enqueue` is.
        `jobq.Flow` builds the jobs from tasks."""
        body = _compact({"name": name}) | {"jobs": [_workflow_job(j) for j in jobs]}
        headers = _once(idempotency_key)
        return Call("POST", "/workflows", _reader(WorkflowMade), json=body, headers=headers)

    @staticmethod
    def get_workflow(id: int) -> Call[Workflow]:
        """A workflow: its status, its jobs' counts by status, and its jobs, each with its status and its
        parents' refs (`GET /workflows/{id}`); `NotFound` if none."""
        return Call("GET", f"/workflows/{int(id)}", _workflow)

    @staticmethod
    def wait_workflow(id: int, timeout: float) -> Call[Workflow]:
        """The workflow once it has finished (completed, failed or cancelled), or as it is after `timeout`
        seconds: read its `status`. Long-polls (`GET /workflows/{id}?wait=N`, up to a minute per
        request, again while time is left), answered when it finishes, not by polling."""
        return _wait_workflow_call(int(id), time.monotonic() + timeout)

    @staticmethod
    def workflows(
        *,
        status: str | None = None,
        name: str | None = None,
        limit: int = 50,
        before_id: int | None = None,
    ) -> Call[WorkflowPage]:
        """Workflows newest first (`GET /workflows`), of a status (running, completed, failed,
        cancelled) and name when given; pass `next_before_id` as `before_id` for the next page. A
        status is the one last seen: the service brings a workflow nobody reads up to date within its
        metrics interval."""
        params = _compact({"status": status, "name": name, "limit": limit, "before_id": before_id})
        return Call("GET", "/workflows", _reader(WorkflowPage), params=params)

    @staticmethod
    def cancel_workflow(id: int) -> Call[Workflow]:
        """Cancel a running workflow (`DELETE /workflows/{id}`): its waiting and pending jobs are
        cancelled; running ones finish, and their children are cancelled. The workflow as it is then;
        `Conflict` for one that has finished."""
        # A repeat after a lost answer would answer conflict (it is cancelled): not sent twice.
        return Call("DELETE", f"/workflows/{int(id)}", _workflow, idempotent=False)

    @staticmethod
    def retry_workflow(id: int) -> Call[Workflow]:
        """Resume a failed workflow where it failed (`POST /workflows/{id}/retry`): its dead jobs pending
        again (attempts reset), the jobs cancelled because of them waiting again. `Conflict` for a
        workflow that is not failed. The workflow as it is then."""
        # A repeat after a lost answer would answer conflict (it is running again): not sent twice.
        return Call("POST", f"/workflows/{int(id)}/retry", _workflow, idempotent=False)

    @staticmethod
    def job_parents(id: int, *, limit: int = 100, after_id: int | None = None) -> Call[ParentPage]:
        """A page of a job's parents in id order (`GET /jobs/{id}/parents`): each one's id, kind, status
        and result; pass `next_after_id` as `after_id` for the next page (`limit`: 1-1000). A leased
        job with at most 100 parents carries them (`LeasedJob.parents`); a handler reads them with
        `jobq.parents()`, which pages them only for a job with more."""
        params = _compact({"limit": limit, "after_id": after_id})
        return Call("GET", f"/jobs/{int(id)}/parents", _reader(ParentPage), params=params)

    @staticmethod
    def get_job(id: int) -> Call[Job]:
        """A job, whatever its state (`GET /jobs/{id}`)."""
        return Call("GET", f"/jobs/{int(id)}", _job)

    @staticmethod
    def wait(id: int, timeout: float) -> Call[Job]:
        """The job once it has finished (completed, dead or cancelled), or as it is after `timeout`
        seconds: read its `status` (and `result`). Long-polls (`GET /jobs/{id}?wait=N`, up to a minute
        per request, again while time is left), answered when the job finishes, not by polling."""
        return _wait_call(int(id), time.monotonic() + timeout)

    @staticmethod
    def cancel(id: int) -> Call[Job]:
        """Cancel a pending job (`DELETE /jobs/{id}`); `Conflict` if it is in any other state."""
        return Call("DELETE", f"/jobs/{int(id)}", _job, idempotent=False)

    @staticmethod
    def run_now(id: int) -> Call[Job]:
        """Run a pending job that waits for its run_at now (`POST /jobs/{id}/run`); `Conflict` if it is
        due already or in any other state."""
        return Call("POST", f"/jobs/{int(id)}/run", _job, idempotent=False)

    @staticmethod
    def lease(
        queue: str,
        *,
        max_jobs: int = 1,
        visibility_timeout: float | None = None,
        wait: float = 0,
        worker_id: str | None = None,
    ) -> Call[list[LeasedJob]]:
        """Claim up to `max_jobs` ready jobs (`POST /lease`) for `visibility_timeout` seconds (default: the
        queue's), waiting up to `wait` seconds (at most 60) for one to be ready."""
        body = {"queue": queue, "max_jobs": max_jobs, "wait": wait} | _compact(
            {"visibility_timeout": visibility_timeout, "worker_id": worker_id}
        )
        # A lease whose answer was lost only delays its jobs: they come back when it expires.
        return Call("POST", "/lease", _leased, json=body, wait=wait)

    @staticmethod
    def ack(job: LeasedJob | int, result: Any = None, *, lease_token: str | None = None) -> Call[AckResult]:
        """Complete a leased job (`POST /ack`), keeping `result` with it (any JSON value; None: none),
        shown on the job until the queue's retention removes it. `LeaseLost` if the lease moved on. A
        repeat is harmless (the first result stays). `PayloadTooLarge` if the result is over the
        service's limit (JOBQ_MAX_RESULT_BYTES, 64 KiB by default): nothing changed, the job is still
        held, so ack again without the result (or with a smaller one)."""
        body = _lease_of(job, lease_token) | _compact({"result": result})
        return Call("POST", "/ack", _reader(AckResult), json=body)

    @staticmethod
    def ack_many(jobs: Iterable[CompletionLike]) -> Call[list[ItemResult]]:
        """Complete up to 1000 leased jobs at once (`POST /ack/batch`): each a job, or a
        `Completion(job, result)` (or a `(job, result)` tuple) to keep its result as `ack` does. One
        result per job, in order; a job whose result is over the limit gets `ok` False and the code
        `payload_too_large`, and is still held."""
        items = [_ack_item(job) for job in jobs]
        return Call("POST", "/ack/batch", _item_results, json={"items": items})

    @staticmethod
    def release(jobs: Iterable[LeasedJob], *, delay: float | None = None) -> Call[list[ItemResult]]:
        """Give leased jobs back untouched (`POST /release`): pending again at once, or `delay` seconds
        from now (a durable sleep, at most a year), the attempt not counted. For jobs this worker will
        not start, or that sleep. One result per job, in order."""
        extra = {} if delay is None else {"delay": delay}
        items = [_lease_of(job, None) | extra for job in jobs]
        return Call("POST", "/release", _item_results, json={"items": items})

    @staticmethod
    def record_step(
        job: LeasedJob | int, name: str, result: Any, *, lease_token: str | None = None
    ) -> Call[None]:
        """Record step `name`'s result (any JSON value, None included) with a leased job (`POST
        /jobs/{id}/steps`): every later lease of the job carries it in `steps`. `Conflict` when the name
        is recorded already (the first result stands: `error.problem["result"]`), `LeaseLost` when the
        lease moved on, `PayloadTooLarge` past the service's limit of a job's steps. A handler calls
        `ctx.step` instead, which skips what is recorded."""
        body = _lease_of(job, lease_token)
        return Call(
            "POST",
            f"/jobs/{body['id']}/steps",
            _nothing,
            json={"lease_token": body["lease_token"], "name": name, "result": result},
            idempotent=False,
        )

    @staticmethod
    def await_event(
        job: LeasedJob | int, event: str, timeout: float, *, lease_token: str | None = None
    ) -> Call[Awaited]:
        """End the lease and park the job until an event named `event` is sent, for at most `timeout`
        seconds (`POST /jobs/{id}/await`), the attempt not counted; or, when such an event was sent since
        the job was enqueued and has not reached it, make it pending at once (`status` says which). A
        handler calls `ctx.wait_for_event` instead."""
        body = _lease_of(job, lease_token)
        return Call(
            "POST",
            f"/jobs/{body['id']}/await",
            _reader(Awaited),
            json={"lease_token": body["lease_token"], "event": event, "timeout": timeout},
            idempotent=False,
        )

    @staticmethod
    def send_event(name: str, payload: Any = None) -> Call[EventSent]:
        """Send an event (`POST /events`): every job awaiting `name` is pending at once, the event (and its
        `payload`, any JSON value) in its `events`. The event is kept (7 days by default), so a job that
        awaits the name later, having been enqueued before it was sent, finds it."""
        return Call("POST", "/events", _reader(EventSent), json={"name": name, "payload": payload})

    @staticmethod
    def events(name: str | None = None, *, limit: int = 100, before_id: int | None = None) -> Call[EventPage]:
        """The events kept, newest first (`GET /events`), of `name` when given; pass `next_before_id` as
        `before_id` for the next page."""
        params = _compact({"name": name, "limit": limit, "before_id": before_id})
        return Call("GET", "/events", _reader(EventPage), params=params)

    @staticmethod
    def nack(
        job: LeasedJob | int,
        error: str | None = None,
        *,
        lease_token: str | None = None,
        retry_after: float | None = None,
        dead: bool = False,
    ) -> Call[NackResult]:
        """Fail a leased job (`POST /nack`), keeping `error` as its last_error. It runs again after
        `retry_after` seconds (default: the queue's backoff) while attempts remain, else, or with
        `dead`, it goes dead."""
        body = _lease_of(job, lease_token) | _compact({"error": error, "retry_after": retry_after})
        # A nack ends the lease, so a repeat would answer lease_lost: not sent twice.
        return Call(
            "POST",
            "/nack",
            _reader(NackResult),
            json=body | {"dead": dead},
            idempotent=False,
        )

    @staticmethod
    def nack_many(
        failures: Iterable[FailureLike],
        *,
        retry_after: float | None = None,
        dead: bool = False,
    ) -> Call[list[NackItemResult]]:
        """Fail up to 1000 leased jobs at once (`POST /nack/batch`), each as in `nack`: a `Failure(job,
        error, retry_after, dead)` or a tuple of its first fields, `(job, error)` say. An item's own
        `retry_after` and `dead` win; where it leaves them out (or None), the call's `retry_after` and
        `dead` apply. One result per job, in order."""
        items = [_nack_item(failure, retry_after, dead) for failure in failures]
        # Like nack: a repeat would answer lease_lost for every item, so it is not sent twice.
        return Call("POST", "/nack/batch", _nack_item_results, json={"items": items}, idempotent=False)

    @staticmethod
    def extend(
        job: LeasedJob | int,
        visibility_timeout: float,
        *,
        lease_token: str | None = None,
        progress: Any = None,
    ) -> Call[ExtendResult]:
        """Move a lease's deadline to now + `visibility_timeout` seconds (`POST /extend`, at most 12 h).
        `progress` (any JSON value, up to the service's result limit) becomes the job's progress, shown
        on it; None keeps the last one. To report progress alone, give the lease's visibility_timeout."""
        body = _lease_of(job, lease_token) | {"visibility_timeout": visibility_timeout}
        return Call("POST", "/extend", _reader(ExtendResult), json=body | _compact({"progress": progress}))

    @staticmethod
    def dead_jobs(
        queue: str | None = None, *, limit: int = 100, before_id: int | None = None
    ) -> Call[DeadPage]:
        """Dead jobs, newest first (`GET /dead`); pass `next_before_id` as `before_id` for the next page."""
        params = _compact({"queue": queue, "limit": limit, "before_id": before_id})
        return Call("GET", "/dead", _job_page, params=params)

    @staticmethod
    def jobs(
        queue: str | None = None,
        *,
        status: str | None = None,
        kind: str | None = None,
        key: str | None = None,
        search: str | None = None,
        limit: int = 50,
        before_id: int | None = None,
    ) -> Call[JobPage]:
        """Jobs of any status, newest first (`GET /jobs`), of a queue, status ("pending", "running",
        "completed", "dead", "cancelled"), kind and key when given; `search` finds text, in any case, in
        the dedup_key, the last error or the payload's JSON. Pass `next_before_id` as `before_id` for the
        next page: a page reads at most 10,000 jobs of its queue and status, so with a rare kind, key or
        search it may be short, even empty, and still have a next one."""
        params = _compact(
            {"queue": queue, "status": status, "kind": kind, "key": key, "q": search, "limit": limit}
            | {"before_id": before_id}
        )
        return Call("GET", "/jobs", _job_page, params=params)

    @staticmethod
    def retry_dead(ids: Iterable[int] | None = None, *, queue: str | None = None) -> Call[RetryDeadResult]:
        """Dead jobs back to pending, attempts reset (`POST /dead/retry`): these ids, a queue's, or both."""
        body = _compact({"ids": list(ids) if ids is not None else None, "queue": queue})
        return Call("POST", "/dead/retry", _reader(RetryDeadResult), json=body, idempotent=False)

    @staticmethod
    def purge_dead(id: int) -> Call[PurgeResult]:
        """Delete a dead job for good (`DELETE /dead/{id}`); `Conflict` if it is not dead."""
        return Call("DELETE", f"/dead/{int(id)}", _reader(PurgeResult), idempotent=False)

    @staticmethod
    def queues() -> Call[list[QueueRow]]:
        """Every queue's counts (`GET /queues`)."""
        return Call("GET", "/queues", _queue_rows)

    @staticmethod
    def workers() -> Call[list[WorkerSeen]]:
        """Workers that leased in the last hour, by the `worker_id` they send, and any holding a running
        job (`GET /workers`): their queues, when last seen, jobs leased and held. Most recent first."""
        return Call("GET", "/workers", _workers)

    @staticmethod
    def queue(name: str) -> Call[QueueDetail]:
        """A queue's counts and settings (`GET /queues/{name}`); `NotFound` for a queue never used."""
        return Call("GET", f"/queues/{_segment(name)}", _queue_detail)

    @staticmethod
    def configure_queue(
        name: str,
        *,
        visibility_timeout: float | None = None,
        max_attempts: int | None = None,
        backoff_base: float | None = None,
        backoff_cap: float | None = None,
        retention: float | None = None,
        key_concurrency: int | NoLimit | None = None,
        fair: bool | None = None,
        rate: Rate | NoLimit | None = None,
        key_rate: Rate | NoLimit | None = None,
    ) -> Call[QueueDetail]:
        """Change some of a queue's settings (`PATCH /queues/{name}`); seconds for the durations. None
        keeps a setting; `NO_LIMIT` removes a key concurrency or a rate (`fair=False` turns fair off)."""
        body = _compact(
            dict(
                visibility_timeout=visibility_timeout,
                max_attempts=max_attempts,
                backoff_base=backoff_base,
                backoff_cap=backoff_cap,
                retention=retention,
            )
        )
        flow = {"key_concurrency": key_concurrency, "fair": fair, "rate": rate, "key_rate": key_rate}
        body |= {k: _limit(v) for k, v in flow.items() if v is not None}
        return Call("PATCH", f"/queues/{_segment(name)}", _queue_detail, json=body)

    @staticmethod
    def keys(queue: str, *, limit: int = 50) -> Call[list[KeyView]]:
        """A queue's keys with the most jobs waiting first, and keys with limits of their own
        (`GET /queues/{queue}/keys`)."""
        return Call("GET", f"/queues/{_segment(queue)}/keys", _key_views, params={"limit": limit})

    @staticmethod
    def key(queue: str, key: str) -> Call[KeyView]:
        """One key's limits and jobs (`GET /queues/{queue}/keys/{key}`); `NotFound` when it has neither."""
        return Call("GET", f"/queues/{_segment(queue)}/keys/{_segment(key)}", _key_view)

    @staticmethod
    def set_key(
        queue: str, key: str, *, concurrency: int | None = None, rate: Rate | None = None
    ) -> Call[KeyView]:
        """Give a key its own concurrency and rate in place of the queue's (None: the queue's); replaces
        what the key had (`PUT /queues/{queue}/keys/{key}`)."""
        body = {"concurrency": concurrency, "rate": _limit(rate)}
        return Call("PUT", f"/queues/{_segment(queue)}/keys/{_segment(key)}", _key_view, json=body)

    @staticmethod
    def delete_key(queue: str, key: str) -> Call[DeleteKeyResult]:
        """Remove a key's own limits (`DELETE /queues/{queue}/keys/{key}`); `NotFound` when it had none."""
        path = f"/queues/{_segment(queue)}/keys/{_segment(key)}"
        return Call("DELETE", path, _reader(DeleteKeyResult), idempotent=False)

    @staticmethod
    def pause(name: str) -> Call[QueueRow]:
        """Stop leasing from a queue; enqueues still land (`POST /queues/{name}/pause`)."""
        return Call("POST", f"/queues/{_segment(name)}/pause", _reader(QueueRow))

    @staticmethod
    def resume(name: str) -> Call[QueueRow]:
        """Lease from a paused queue again (`POST /queues/{name}/resume`)."""
        return Call("POST", f"/queues/{_segment(name)}/resume", _reader(QueueRow))

    @staticmethod
    def schedules() -> Call[list[Schedule]]:
        """Every schedule, by name (`GET /schedules`)."""
        return Call("GET", "/schedules", _schedules)

    @staticmethod
    def schedule(name: str) -> Call[Schedule]:
        """A schedule, with its next and last run (`GET /schedules/{name}`); `NotFound` if none."""
        return Call("GET", f"/schedules/{_segment(name)}", _reader(Schedule))

    @staticmethod
    def set_schedule(
        name: str,
        cron: str,
        queue: str,
        payload: Any,
        *,
        timezone: str | None = None,
        kind: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        key: str | None = None,
        catch_up: CatchUp | str | None = None,
        paused: bool | None = None,
    ) -> Call[Schedule]:
        """Create or replace the schedule `name` (`PUT /schedules/{name}`; 1-128 of A-Z a-z 0-9 _ . : -):
        at each time `cron` names (5 fields, or 6 with a leading seconds field) in `timezone` (an IANA
        name; default UTC), it enqueues `payload` on `queue`, with `kind`, `priority` and `max_attempts`
        as `enqueue` does. `key` is kept with the schedule, for keyed flow control. `catch_up` (skip,
        once, all; default once) says what it enqueues for the times it missed. On a replace, options
        left out take their defaults, not the old values; the next run stays if cron and timezone do.
        `ValidationError` for a bad cron or timezone."""
        options = _compact(
            dict(
                timezone=timezone,
                kind=kind,
                priority=priority,
                max_attempts=max_attempts,
                key=key,
                catch_up=catch_up,
                paused=paused,
            )
        )
        body = {"cron": cron, "queue": queue, "payload": payload} | options
        return Call("PUT", f"/schedules/{_segment(name)}", _reader(Schedule), json=body)

    @staticmethod
    def pause_schedule(name: str) -> Call[Schedule]:
        """Stop enqueuing on a schedule until it is resumed (`POST /schedules/{name}/pause`)."""
        return Call("POST", f"/schedules/{_segment(name)}/pause", _reader(Schedule))

    @staticmethod
    def resume_schedule(name: str) -> Call[Schedule]:
        """Enqueue on a paused schedule again, from its next time after now: the times it was paused are
        not caught up (`POST /schedules/{name}/resume`)."""
        return Call("POST", f"/schedules/{_segment(name)}/resume", _reader(Schedule))

    @staticmethod
    def trigger_schedule(name: str) -> Call[Schedule]:
        """Enqueue a schedule's job now, whatever its times (`POST /schedules/{name}/trigger`); the
        answer's `job_id` is that job."""
        # A repeat would enqueue another job: not sent twice.
        return Call("POST", f"/schedules/{_segment(name)}/trigger", _reader(Schedule), idempotent=False)

    @staticmethod
    def delete_schedule(name: str) -> Call[DeleteScheduleResult]:
        """Delete a schedule (`DELETE /schedules/{name}`); jobs it enqueued stay. `NotFound` if none."""
        # A repeat after a lost answer would answer not_found: not sent twice.
        return Call("DELETE", f"/schedules/{_segment(name)}", _reader(DeleteScheduleResult), idempotent=False)


# --- retries ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How calls are retried, never after an answer other than 503 (or a proxy's 502 or 504):

    - Idempotent calls (reads, lease, ack, extend, release, queue and schedule settings, and enqueues,
      which carry an Idempotency-Key) go again after connection errors, 503, 502 and 504: a repeat is
      harmless.
    - The others (nack, cancel, dead retry, purge, schedule trigger and delete) go again only when they
      surely were not carried out: the connection was never made, or the 503 says `nothing_done` (the
      service had not sent anything to its database). A lost answer or another 503 may follow their
      commit: they raise.

    The n-th retry sleeps `backoff * 2**n` seconds, capped at `cap`, less up to half of it at random, or
    the answer's `Retry-After` when that is longer."""

    attempts: int = 6  # tries in all, the first one included (default 6: about 8 s of trying at most)
    backoff: float = 0.25  # seconds before the first retry
    cap: float = 5.0  # longest sleep between tries

    def delay(self, retry: int) -> float:
        return min(self.cap, self.backoff * 2.0**retry) * random.uniform(0.5, 1.0)


class _Answer(NamedTuple):
    """An HTTP answer, as either client's library gave it."""

    status: int
    reason: str
    headers: Mapping[str, str]  # names in any case
    content: bytes


class _Failed(NamedTuple):
    """No answer: the library's error, and whether the request surely never reached the service."""

    error: Exception
    not_sent: bool


def _nothing_done(answer: _Answer) -> bool:
    """Whether a problem answer says the service did nothing for the request (its `nothing_done`)."""
    try:
        return _decode(answer.content).get("nothing_done") is True
    except (ValueError, AttributeError):
        return False


def _retry_after(answer: _Answer) -> float:
    try:
        return float(answer.headers.get("retry-after", 0))
    except ValueError:
        return 0.0


Step = Call[Any] | float  # send this call, or sleep this many seconds
Outcome = _Answer | _Failed | None


def _exchange(call: Call[T], retry: RetryPolicy) -> Generator[Step, Outcome, T]:
    """The retry policy, free of I/O: yields the call to send or a pause to take, receives the answer (or
    the transport error), and returns the result or raises. Both clients drive it."""
    attempts = max(1, retry.attempts)
    for n in range(attempts):
        last = n == attempts - 1
        outcome = yield call
        if isinstance(outcome, _Failed):
            if last or not (call.idempotent or outcome.not_sent):
                error = outcome.error
                raise Unreachable(f"{call.method} {call.path}: {type(error).__name__}: {error}") from error
            yield retry.delay(n)
            continue
        assert outcome is not None
        status = outcome.status
        # 503: the service could not answer (its database is away), but the request may have been
        # carried out before the connection to the database was lost; a proxy's 502/504 may hide one
        # too. So only idempotent calls go again, unless the service says nothing was done.
        again = call.idempotent or (status == 503 and _nothing_done(outcome))
        if not last and status in (502, 503, 504) and again:
            yield max(retry.delay(n), min(_retry_after(outcome), retry.cap))
            continue
        if 200 <= status < 300:
            return call.read(_decode(outcome.content))
        raise error_from(status, outcome.content, outcome.reason)
    raise AssertionError("unreachable")  # pragma: no cover


# --- the two clients -------------------------------------------------------------------------------


def _method(build: Callable[..., Call[Any]], wrapper: Callable[..., Any]) -> None:
    """Give a client's method the builder's name, docs and signature, with `self` and the result type."""
    functools.update_wrapper(wrapper, build)
    signature = inspect.signature(build)
    returns = str(signature.return_annotation)
    returns = returns[5:-1] if returns.startswith("Call[") else returns
    self = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
    wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[self, *signature.parameters.values()], return_annotation=returns
    )


class _Blocking:
    """What sends its calls through a `Client`: the client itself, or one of its groups of calls."""

    def _sender(self) -> Client:
        raise NotImplementedError


class _Awaited:
    """What sends its calls through an `AsyncClient`: the client itself, or one of its groups of calls."""

    def _sender(self) -> AsyncClient:
        raise NotImplementedError


def _sync(build: Callable[P, Call[T]]) -> Callable[Concatenate[_Blocking, P], T]:
    def method(self: _Blocking, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._sender().send(build(*args, **kwargs))

    _method(build, method)
    return method


def _async(build: Callable[P, Call[T]]) -> Callable[Concatenate[_Awaited, P], Coroutine[Any, Any, T]]:
    async def method(self: _Awaited, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._sender().send(build(*args, **kwargs))

    _method(build, method)
    return method


def _moved(group: str, method: Callable[Concatenate[Any, P], R]) -> Callable[Concatenate[Any, P], R]:
    """The client's method of old, from before the calls were grouped: `method` of its `group`, with a
    DeprecationWarning naming the new spelling. It returns what the group's method does (for
    `AsyncClient`, the coroutine to await), so both clients' old methods are this one function."""
    name = method.__name__

    def old(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        warnings.warn(
            f"{type(self).__name__}.{name}() is deprecated, call client.{group}.{name}() instead; "
            "the old spelling will be removed in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return method(getattr(self, group), *args, **kwargs)

    functools.update_wrapper(old, method)
    old.__doc__ = f"Deprecated: `client.{group}.{name}`, which this calls.\n\n{method.__doc__}"
    return old


class _SyncGroup(_Blocking):
    def __init__(self, client: Client) -> None:
        self._client = client

    def _sender(self) -> Client:
        return self._client

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self._client!r}>"


class _AsyncGroup(_Awaited):
    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    def _sender(self) -> AsyncClient:
        return self._client

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self._client!r}>"


class WorkerCalls(_SyncGroup):
    """`client.worker`: the lease protocol, what a worker calls. Lease jobs, then end each lease: ack it
    (done), nack it (failed), release it (not started); extend it while the job runs. Each is fenced by
    the lease's token, and `ack_many`, `nack_many` and `release` take many leases in one request. The
    worker runner (`jobq.Worker`) makes these calls itself."""

    lease = _sync(Calls.lease)
    ack = _sync(Calls.ack)
    ack_many = _sync(Calls.ack_many)
    nack = _sync(Calls.nack)
    nack_many = _sync(Calls.nack_many)
    extend = _sync(Calls.extend)
    release = _sync(Calls.release)
    record_step = _sync(Calls.record_step)
    await_event = _sync(Calls.await_event)


class AdminCalls(_SyncGroup):
    """`client.admin`: operating the service, what a person or a script at its controls calls. Jobs
    listed and searched, or run now; dead jobs retried and purged; queues read, configured, paused and
    resumed; keys' own limits; schedules; the workers seen. A viewer's token reads, an admin's changes."""

    jobs = _sync(Calls.jobs)
    run_now = _sync(Calls.run_now)
    workers = _sync(Calls.workers)
    events = _sync(Calls.events)
    dead_jobs = _sync(Calls.dead_jobs)
    retry_dead = _sync(Calls.retry_dead)
    purge_dead = _sync(Calls.purge_dead)
    queues = _sync(Calls.queues)
    queue = _sync(Calls.queue)
    configure_queue = _sync(Calls.configure_queue)
    pause = _sync(Calls.pause)
    resume = _sync(Calls.resume)
    keys = _sync(Calls.keys)
    key = _sync(Calls.key)
    set_key = _sync(Calls.set_key)
    delete_key = _sync(Calls.delete_key)
    schedules = _sync(Calls.schedules)
    schedule = _sync(Calls.schedule)
    set_schedule = _sync(Calls.set_schedule)
    pause_schedule = _sync(Calls.pause_schedule)
    resume_schedule = _sync(Calls.resume_schedule)
    trigger_schedule = _sync(Calls.trigger_schedule)
    delete_schedule = _sync(Calls.delete_schedule)


class AsyncWorkerCalls(_AsyncGroup):
    """`client.worker` of an `AsyncClient`: the calls of `WorkerCalls`, awaited."""

    lease = _async(Calls.lease)
    ack = _async(Calls.ack)
    ack_many = _async(Calls.ack_many)
    nack = _async(Calls.nack)
    nack_many = _async(Calls.nack_many)
    extend = _async(Calls.extend)
    release = _async(Calls.release)
    record_step = _async(Calls.record_step)
    await_event = _async(Calls.await_event)


class AsyncAdminCalls(_AsyncGroup):
    """`client.admin` of an `AsyncClient`: the calls of `AdminCalls`, awaited."""

    jobs = _async(Calls.jobs)
    run_now = _async(Calls.run_now)
    workers = _async(Calls.workers)
    events = _async(Calls.events)
    dead_jobs = _async(Calls.dead_jobs)
    retry_dead = _async(Calls.retry_dead)
    purge_dead = _async(Calls.purge_dead)
    queues = _async(Calls.queues)
    queue = _async(Calls.queue)
    configure_queue = _async(Calls.configure_queue)
    pause = _async(Calls.pause)
    resume = _async(Calls.resume)
    keys = _async(Calls.keys)
    key = _async(Calls.key)
    set_key = _async(Calls.set_key)
    delete_key = _async(Calls.delete_key)
    schedules = _async(Calls.schedules)
    schedule = _async(Calls.schedule)
    set_schedule = _async(Calls.set_schedule)
    pause_schedule = _async(Calls.pause_schedule)
    resume_schedule = _async(Calls.resume_schedule)
    trigger_schedule = _async(Calls.trigger_schedule)
    delete_schedule = _async(Calls.delete_schedule)


class _Transport:
    """What the two clients share: configuration, and aiohttp, which gets the other keyword arguments
    (`_open`). Only sending differs: awaited in the caller's event loop (`AsyncClient`), or blocking,
    on an event loop of the client's own (`Client`)."""

    def __init__(
        self,
        url: str | None = None,
        *,
        token: str | None = None,
        timeout: float = 10.0,
        retry: RetryPolicy | None = None,
        **options: Any,
    ) -> None:
        token = token if token is not None else os.environ.get("JOBQ_TOKEN") or None
        self.headers = {"Accept": "application/json", **options.pop("headers", {})}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.url = (url or os.environ.get("JOBQ_URL") or DEFAULT_URL).rstrip("/")
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self._open(options)

    def _open(self, session_options: dict[str, Any]) -> None:
        """Keep the caller's other keyword arguments, for the aiohttp session made at the first request."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


def _body(call: Call[Any]) -> tuple[bytes | None, dict[str, str] | None]:
    """The request's body and headers: compact JSON in UTF-8, NaN and infinities refused (JSON has none)."""
    if call.json is None:
        return None, call.headers
    body = json.dumps(call.json, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    return body, {**(call.headers or {}), "Content-Type": "application/json"}


def _env_proxy(url: str) -> str | None:
    """The proxy that HTTP_PROXY or HTTPS_PROXY (or their lower-case forms) name for `url`, unless NO_PROXY
    exempts its host."""
    parts = urlsplit(url)
    if parts.hostname and urllib.request.proxy_bypass(parts.hostname):
        return None
    return urllib.request.getproxies().get(parts.scheme)


class _Aiohttp:
    """A client's requests on aiohttp: its session, the proxy and the timeouts, and one attempt of a call.
    aiohttp binds a session to the event loop it is made in, so it is made at the first request, in the
    loop that sends it: the caller's for an `AsyncClient`, the client's own for a `Client`.

    The client on httpx took care that a plain-HTTP client not read the system's certificate authorities
    (50 ms of every `jobq` command); on aiohttp there is nothing to avoid: it reads them once, when it is
    imported, and a connection over plain HTTP makes no TLS context."""

    def __init__(
        self, url: str, headers: Mapping[str, str], timeout: float, options: Mapping[str, Any]
    ) -> None:
        self.url = url
        self.headers = headers
        self.timeout = timeout
        self.options = options
        self.session: aiohttp.ClientSession | None = None
        self.proxy: str | None = None
        self.timeouts: dict[float, aiohttp.ClientTimeout] = {}

    def open(self) -> aiohttp.ClientSession:
        """The session, made in the running event loop the first time."""
        if self.session is None:
            options = dict(self.options)
            # The proxy the environment names, found once, as curl and requests honour it: aiohttp's own
            # `trust_env=True` would also read ~/.netrc on a thread for every request (a fifth of a
            # worker's time per job) and refuse a request with a token when the file names the host. A
            # proxy given to the session wins, as it would over the environment's in other clients.
            self.proxy = None if "trust_env" in options or "proxy" in options else _env_proxy(self.url)
            if callable(options.get("connector")):
                # A connector is bound to its event loop too: a `Client` is given a function that makes
                # one, in its own loop, for each session it makes.
                options["connector"] = options["connector"]()
            self.session = aiohttp.ClientSession(headers=self.headers, **options)
        return self.session

    def _timeout(self, wait: float) -> aiohttp.ClientTimeout:
        """`timeout` to connect and between reads, a long-poll's `wait` added to the latter."""
        timeout = self.timeouts.get(wait)
        if timeout is None:
            timeout = aiohttp.ClientTimeout(
                total=None, sock_connect=self.timeout, sock_read=self.timeout + wait
            )
            if len(self.timeouts) < 64:
                self.timeouts[wait] = timeout
        return timeout

    async def attempt(self, call: Call[Any]) -> Outcome:
        body, headers = _body(call)
        params = {k: str(v) for k, v in call.params.items()} if call.params else None
        try:
            async with self.open().request(
                call.method,
                self.url + call.path,
                data=body,
                params=params,
                headers=headers,
                timeout=self._timeout(call.wait),
                proxy=self.proxy,
            ) as response:
                content = await response.read()
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            return _Failed(exc, True)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return _Failed(exc, False)
        return _Answer(response.status, response.reason or "", response.headers, content)

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None


class _Loop:
    """An event loop on a daemon thread of its own, where a `Client`'s requests run on aiohttp. A thread
    that sends a request waits for its outcome; any number of threads may wait at once, each for its own."""

    def __init__(self, http: _Aiohttp) -> None:
        self.http = http
        self.loop = asyncio.new_event_loop()
        self.closing: asyncio.Task[None] | None = None
        self.thread = threading.Thread(target=self._run, name="jobq-client", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.loop.run_forever()
        finally:
            self.loop.run_until_complete(self._cancel_leftovers())
            self.loop.close()

    async def _cancel_leftovers(self) -> None:
        """End the requests still under way when the client closed, with an error for the threads that
        wait for them, rather than leave those waiting for good."""
        leftovers = asyncio.all_tasks() - {asyncio.current_task()}
        for task in leftovers:
            task.cancel()
        await asyncio.gather(*leftovers, return_exceptions=True)
        await self.loop.shutdown_asyncgens()

    def attempt(self, call: Call[Any]) -> Outcome:
        """One attempt of `call` on the loop, the calling thread waiting for its outcome."""
        future = asyncio.run_coroutine_threadsafe(self.http.attempt(call), self.loop)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise RuntimeError(f"{call.method} {call.path}: the Client was closed meanwhile") from None
        except BaseException:
            future.cancel()  # interrupted (a KeyboardInterrupt): the request is dropped, not left running
            raise

    def stop(self) -> None:
        """Close the session and stop the loop, without waiting: the thread then ends by itself."""
        with contextlib.suppress(RuntimeError):  # the loop is closed already
            self.loop.call_soon_threadsafe(self._stop)

    def _stop(self) -> None:
        # Held here: the event loop keeps only a weak reference to a task.
        self.closing = self.closing or self.loop.create_task(self._shutdown())

    async def _shutdown(self) -> None:
        try:
            await self.http.close()
        finally:
            self.loop.stop()

    def close(self) -> None:
        """Close the session, stop the loop and wait for its thread to end."""
        self.stop()
        self.thread.join()


class Client(_Transport, _Blocking):
    """The jobq API, blocking. `url` defaults to $JOBQ_URL, else http://127.0.0.1:8000; `token` to
    $JOBQ_TOKEN (sent as a bearer token). `timeout` is per request, in seconds (a long-poll gets its
    `wait` on top). `retry` is the retry policy; other keyword arguments go to `aiohttp.ClientSession`, as
    `AsyncClient`'s do, but a `connector` is given as a function that makes one, since the client makes
    its sessions itself: `Client(url, connector=lambda: aiohttp.TCPConnector(ssl=context))`.

    Its own methods are a producer's (jobs, and workflows of jobs); `worker` holds the lease protocol,
    `admin` the operator's calls.

    Its requests run on aiohttp, in an event loop on a daemon thread of the client's own, started at the
    first request and ended by `close`: so one client may be shared by many threads, used from code
    that runs in an event loop of its own, and used in a child process forked after it was made (the
    child starts a loop of its own). Retries' pauses are taken in the calling thread."""

    def _open(self, session_options: dict[str, Any]) -> None:
        if isinstance(session_options.get("connector"), aiohttp.BaseConnector):
            raise TypeError(
                "Client(connector=...) takes a function that makes the connector: the client makes its"
                " aiohttp session in an event loop of its own, and a connector is bound to one loop"
            )
        self._options = session_options
        self._lock = threading.Lock()  # starting and ending the loop
        self._loop: _Loop | None = None
        # Stops the loop of a client dropped without `close` (`_start`).
        self._stopper: weakref.finalize[[], Client] | None = None
        self._closed = False
        _CLIENTS.add(self)

    def _attempt(self, call: Call[Any]) -> Outcome:
        return (self._loop or self._start()).attempt(call)

    def _start(self) -> _Loop:
        """The client's loop, started at its first request (or its first in a forked child)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("Cannot send a request: the Client is closed")
            if self._loop is None:
                loop = _Loop(_Aiohttp(self.url, self.headers, self.timeout, self._options))
                # The loop's thread holds the loop, not the client: a client dropped without `close`
                # is collected, and this ends its thread.
                self._stopper = weakref.finalize(self, loop.stop)
                self._stopper.atexit = False
                self._loop = loop
            return self._loop

    def _forked(self) -> None:
        """In a child process just forked: it has the parent's memory but not the loop's thread, so the
        next request starts a loop and a session of its own. The parent's are left as they are, neither
        closed nor collected (`_INHERITED`): closing them would touch the parent's connections, and
        collecting them would complain of a session never closed."""
        self._lock = threading.Lock()  # another thread may have held it at the fork
        if self._loop is not None:
            if self._stopper is not None:
                self._stopper.detach()
            _INHERITED.append(self._loop)
            self._loop = None

    def send(self, call: Call[T]) -> T:
        """The answer of `call` and of the calls it leads to (`Call.then`)."""
        while True:
            result = self._send(call)
            follow = call.then(result) if call.then is not None else None
            if follow is None:
                return result
            call = follow

    def _send(self, call: Call[T]) -> T:
        steps = _exchange(call, self.retry)
        step = next(steps)
        while True:
            outcome: Outcome = None
            if isinstance(step, Call):
                outcome = self._attempt(step)
            else:
                time.sleep(step)
            try:
                step = steps.send(outcome)
            except StopIteration as done:
                result: T = done.value
                return result

    def _sender(self) -> Client:
        return self

    def close(self) -> None:
        """Close the session and end the loop's thread; calls after this raise RuntimeError."""
        with self._lock:
            self._closed = True
            loop, self._loop = self._loop, None
        if loop is not None:
            if self._stopper is not None:
                self._stopper.detach()
            loop.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    enqueue = _sync(Calls.enqueue)
    enqueue_many = _sync(Calls.enqueue_many)
    get_job = _sync(Calls.get_job)
    wait = _sync(Calls.wait)
    cancel = _sync(Calls.cancel)
    create_workflow = _sync(Calls.create_workflow)
    get_workflow = _sync(Calls.get_workflow)
    wait_workflow = _sync(Calls.wait_workflow)
    workflows = _sync(Calls.workflows)
    cancel_workflow = _sync(Calls.cancel_workflow)
    retry_workflow = _sync(Calls.retry_workflow)
    job_parents = _sync(Calls.job_parents)
    send_event = _sync(Calls.send_event)

    @functools.cached_property
    def worker(self) -> WorkerCalls:
        """The lease protocol: lease, ack, nack, extend, release and their batch forms."""
        return WorkerCalls(self)

    @functools.cached_property
    def admin(self) -> AdminCalls:
        """Operating the service: jobs, dead jobs, queues, keys, schedules, workers."""
        return AdminCalls(self)

    # Before the calls were grouped: each warns, and calls the group's method (`_moved`).
    lease = _moved("worker", WorkerCalls.lease)
    ack = _moved("worker", WorkerCalls.ack)
    ack_many = _moved("worker", WorkerCalls.ack_many)
    nack = _moved("worker", WorkerCalls.nack)
    nack_many = _moved("worker", WorkerCalls.nack_many)
    extend = _moved("worker", WorkerCalls.extend)
    release = _moved("worker", WorkerCalls.release)
    jobs = _moved("admin", AdminCalls.jobs)
    run_now = _moved("admin", AdminCalls.run_now)
    workers = _moved("admin", AdminCalls.workers)
    dead_jobs = _moved("admin", AdminCalls.dead_jobs)
    retry_dead = _moved("admin", AdminCalls.retry_dead)
    purge_dead = _moved("admin", AdminCalls.purge_dead)
    queues = _moved("admin", AdminCalls.queues)
    queue = _moved("admin", AdminCalls.queue)
    configure_queue = _moved("admin", AdminCalls.configure_queue)
    pause = _moved("admin", AdminCalls.pause)
    resume = _moved("admin", AdminCalls.resume)
    keys = _moved("admin", AdminCalls.keys)
    key = _moved("admin", AdminCalls.key)
    set_key = _moved("admin", AdminCalls.set_key)
    delete_key = _moved("admin", AdminCalls.delete_key)
    schedules = _moved("admin", AdminCalls.schedules)
    schedule = _moved("admin", AdminCalls.schedule)
    set_schedule = _moved("admin", AdminCalls.set_schedule)
    pause_schedule = _moved("admin", AdminCalls.pause_schedule)
    resume_schedule = _moved("admin", AdminCalls.resume_schedule)
    trigger_schedule = _moved("admin", AdminCalls.trigger_schedule)
    delete_schedule = _moved("admin", AdminCalls.delete_schedule)


# Every Client, held weakly: a forked child starts each one's loop afresh (`Client._forked`).
_CLIENTS: weakref.WeakSet[Client] = weakref.WeakSet()
# In a forked child, the parent's loops, kept from being collected (`Client._forked`).
_INHERITED: list[_Loop] = []


def _after_fork_in_child() -> None:
    for client in list(_CLIENTS):
        client._forked()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_after_fork_in_child)


class AsyncClient(_Transport, _Awaited):
    """The jobq API for asyncio: the methods of `Client` and its groups, awaited; the same arguments, and
    other keyword arguments go to `aiohttp.ClientSession` (made at the first call, in its event loop; a
    `connector` may be one, or a function that makes one).

    Both clients are on aiohttp: a worker's requests are its overhead per job, and aiohttp's take a sixth
    of httpx's time (its parser is C), a millisecond less between a job's enqueue and its handler."""

    def _open(self, session_options: dict[str, Any]) -> None:
        self._aiohttp = _Aiohttp(self.url, self.headers, self.timeout, session_options)

    @property
    def http(self) -> aiohttp.ClientSession:
        """The aiohttp session, made at the first call, in the running event loop."""
        return self._aiohttp.open()

    async def _attempt(self, call: Call[Any]) -> Outcome:
        return await self._aiohttp.attempt(call)

    async def send(self, call: Call[T]) -> T:
        """The answer of `call` and of the calls it leads to (`Call.then`)."""
        while True:
            result = await self._send(call)
            follow = call.then(result) if call.then is not None else None
            if follow is None:
                return result
            call = follow

    async def _send(self, call: Call[T]) -> T:
        steps = _exchange(call, self.retry)
        step = next(steps)
        while True:
            outcome: Outcome = None
            if isinstance(step, Call):
                outcome = await self._attempt(step)
            else:
                await asyncio.sleep(step)
            try:
                step = steps.send(outcome)
            except StopIteration as done:
                result: T = done.value
                return result

    def _sender(self) -> AsyncClient:
        return self

    async def aclose(self) -> None:
        await self._aiohttp.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    enqueue = _async(Calls.enqueue)
    enqueue_many = _async(Calls.enqueue_many)
    get_job = _async(Calls.get_job)
    wait = _async(Calls.wait)
    cancel = _async(Calls.cancel)
    create_workflow = _async(Calls.create_workflow)
    get_workflow = _async(Calls.get_workflow)
    wait_workflow = _async(Calls.wait_workflow)
    workflows = _async(Calls.workflows)
    cancel_workflow = _async(Calls.cancel_workflow)
    retry_workflow = _async(Calls.retry_workflow)
    job_parents = _async(Calls.job_parents)
    send_event = _async(Calls.send_event)

    @functools.cached_property
    def worker(self) -> AsyncWorkerCalls:
        """The lease protocol: lease, ack, nack, extend, release and their batch forms."""
        return AsyncWorkerCalls(self)

    @functools.cached_property
    def admin(self) -> AsyncAdminCalls:
        """Operating the service: jobs, dead jobs, queues, keys, schedules, workers."""
        return AsyncAdminCalls(self)

    # Before the calls were grouped: each warns, and calls the group's method (`_moved`).
    lease = _moved("worker", AsyncWorkerCalls.lease)
    ack = _moved("worker", AsyncWorkerCalls.ack)
    ack_many = _moved("worker", AsyncWorkerCalls.ack_many)
    nack = _moved("worker", AsyncWorkerCalls.nack)
    nack_many = _moved("worker", AsyncWorkerCalls.nack_many)
    extend = _moved("worker", AsyncWorkerCalls.extend)
    release = _moved("worker", AsyncWorkerCalls.release)
    jobs = _moved("admin", AsyncAdminCalls.jobs)
    run_now = _moved("admin", AsyncAdminCalls.run_now)
    workers = _moved("admin", AsyncAdminCalls.workers)
    dead_jobs = _moved("admin", AsyncAdminCalls.dead_jobs)
    retry_dead = _moved("admin", AsyncAdminCalls.retry_dead)
    purge_dead = _moved("admin", AsyncAdminCalls.purge_dead)
    queues = _moved("admin", AsyncAdminCalls.queues)
    queue = _moved("admin", AsyncAdminCalls.queue)
    configure_queue = _moved("admin", AsyncAdminCalls.configure_queue)
    pause = _moved("admin", AsyncAdminCalls.pause)
    resume = _moved("admin", AsyncAdminCalls.resume)
    keys = _moved("admin", AsyncAdminCalls.keys)
    key = _moved("admin", AsyncAdminCalls.key)
    set_key = _moved("admin", AsyncAdminCalls.set_key)
    delete_key = _moved("admin", AsyncAdminCalls.delete_key)
    schedules = _moved("admin", AsyncAdminCalls.schedules)
    schedule = _moved("admin", AsyncAdminCalls.schedule)
    set_schedule = _moved("admin", AsyncAdminCalls.set_schedule)
    pause_schedule = _moved("admin", AsyncAdminCalls.pause_schedule)
    resume_schedule = _moved("admin", AsyncAdminCalls.resume_schedule)
    trigger_schedule = _moved("admin", AsyncAdminCalls.trigger_schedule)
    delete_schedule = _moved("admin", AsyncAdminCalls.delete_schedule)
