"""What the service is given: a job to enqueue, a lease to end, a nack, queue settings.

Each is a ``Protocol`` (``...Like``), the shape the service reads, and a plain frozen dataclass of that
shape. Callers that parsed a request pass what they parsed as it is: the HTTP API's pydantic bodies
(app/http/schemas/) have these attributes, so a batch of a thousand is not copied item by item into other
objects first. Callers with plain values (the SQS API) build the dataclasses. Validation belongs to the
caller (pydantic for HTTP, app/sqs/ for SQS): the service takes what it is given as valid.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol


class NewJobLike(Protocol):
    """A job to enqueue."""

    @property
    def queue(self) -> str: ...
    @property
    def payload(self) -> Any: ...  # any JSON value, encoded once as stored; or its text, as msgspec.Raw
    @property
    def priority(self) -> int: ...  # lower runs first
    @property
    def run_at(self) -> datetime | None: ...  # not before then; None: now (or after `delay`)
    @property
    def delay(self) -> float | None: ...  # seconds from now; never together with run_at
    @property
    def max_attempts(self) -> int | None: ...  # None: the queue's setting
    @property
    def dedup_key(self) -> str | None: ...
    @property
    def kind(self) -> str | None: ...  # what the job is (send_email); stored and shown, nothing more
    @property
    def key(self) -> str | None: ...  # what flow control groups it by (a tenant); stored and shown
    @property
    def traceparent(self) -> str | None: ...  # the W3C trace context it was enqueued under (valid)
    @property
    def tracestate(self) -> str | None: ...  # only with a traceparent
    @property
    def depends_on(self) -> list[int] | None: ...  # its parents (existing jobs); None: none
    @property
    def run_if(self) -> str | None: ...  # with parents: what they must end as (RunIf); None: completed
    @property
    def debounce(self) -> DebounceLike | None: ...  # lands in its key's pending job, if any; None: none


class DebounceLike(Protocol):
    """Enqueues of a queue with the same key make one job while it waits (`seconds` after the last of
    them, `max_seconds` after the first at the latest)."""

    @property
    def key(self) -> str: ...
    @property
    def seconds(self) -> float: ...
    @property
    def max_seconds(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class Debounce:
    key: str
    seconds: float
    max_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class NewJob:
    queue: str
    payload: Any
    priority: int = 0
    run_at: datetime | None = None
    delay: float | None = None
    max_attempts: int | None = None
    dedup_key: str | None = None
    kind: str | None = None
    key: str | None = None
    traceparent: str | None = None
    tracestate: str | None = None
    depends_on: list[int] | None = None
    run_if: str | None = None
    debounce: Debounce | None = None


class WorkflowJobLike(NewJobLike, Protocol):
    """A job of a workflow to make: a job to enqueue, named by `ref`, whose parents are refs of its
    siblings or ids of existing jobs."""

    @property
    def ref(self) -> str: ...
    @property
    def depends_on(self) -> list[str | int] | None: ...  # type: ignore[override]


@dataclass(frozen=True, slots=True)
class WorkflowJob:
    ref: str
    queue: str
    payload: Any
    depends_on: list[str | int] | None = None
    run_if: str | None = None
    priority: int = 0
    run_at: datetime | None = None
    delay: float | None = None
    max_attempts: int | None = None
    kind: str | None = None
    key: str | None = None
    traceparent: str | None = None
    tracestate: str | None = None
    dedup_key: str | None = None
    debounce: None = None


class JobLeaseLike(Protocol):
    """A job and the lease token it is held under: an item of ack and release."""

    @property
    def id(self) -> int: ...
    @property
    def lease_token(self) -> str: ...


@dataclass(frozen=True, slots=True)
class JobLease:
    id: int
    lease_token: str


class AckLike(JobLeaseLike, Protocol):
    """A lease to end with the job done. An item without `result` (a ``JobLease``: SQS's DeleteMessage)
    completes its job with none."""

    @property
    def result(self) -> Any: ...  # any JSON value, kept with the job; None: no result


@dataclass(frozen=True, slots=True)
class Ack:
    id: int
    lease_token: str
    result: Any = None


class NackLike(JobLeaseLike, Protocol):
    """A lease to end after a failed attempt."""

    @property
    def error(self) -> str | None: ...  # kept as last_error
    @property
    def retry_after(self) -> float | None: ...  # seconds; None: the queue's backoff
    @property
    def dead(self) -> bool: ...  # dead now, whatever attempts are left


@dataclass(frozen=True, slots=True)
class Nack:
    id: int
    lease_token: str
    error: str | None = None
    retry_after: float | None = None
    dead: bool = False


class QueueSettingsLike(Protocol):
    """Settings to change; None keeps a setting's value (or, for a new queue, its default)."""

    @property
    def visibility_timeout(self) -> float | None: ...
    @property
    def max_attempts(self) -> int | None: ...
    @property
    def backoff_base(self) -> float | None: ...
    @property
    def backoff_cap(self) -> float | None: ...
    @property
    def retention(self) -> float | None: ...
    @property
    def flow(self) -> dict[str, object]: ...
    @property
    def push(self) -> PushSettingsLike | None: ...  # with push_set: the target, or None to stop pushing
    @property
    def push_set(self) -> bool: ...  # False: the target stays as it is


class PushSettingsLike(Protocol):
    """A queue's push target (app/service/push.py)."""

    @property
    def url(self) -> str: ...
    @property
    def timeout(self) -> float: ...  # seconds a delivery may take, answer read
    @property
    def concurrency(self) -> int: ...  # deliveries in flight at once, across replicas


@dataclass(frozen=True, slots=True)
class QueueSettings:
    visibility_timeout: float | None = None
    max_attempts: int | None = None
    backoff_base: float | None = None
    backoff_cap: float | None = None
    retention: float | None = None
    # Flow-control settings to change (sql.CONFIGURE_FLOW): absent keeps one, None clears it.
    flow: dict[str, object] = field(default_factory=dict)
    push: PushSettingsLike | None = None
    push_set: bool = False
