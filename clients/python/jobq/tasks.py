"""Tasks: functions registered by name, enqueued with their arguments, and run by one worker for many kinds.

    import jobq

    tasks = jobq.Tasks()

    @tasks.task(queue="emails", max_attempts=3)
    def send_email(to: str, subject: str = "Hello") -> None:
        ...

    send_email.enqueue("ada@example.com", subject="Hi")  # kind send_email, payload {"to": .., "subject": ..}
    # jobq worker myapp.tasks --queue emails              # runs it: send_email(to=..., subject=...)

- A task's name is the job's `kind` (the function's name unless given), so a producer in any language enqueues
  the same job as `{"queue": "emails", "kind": "send_email", "payload": {"to": "ada@example.com"}}`.
- Arguments are the payload, by name: `enqueue` binds them to the function's signature (a wrong argument is a
  TypeError at once, in the producer) and sends those given; defaults are applied when the job runs, so a
  changed default reaches jobs already queued. The payload must be a JSON object of them (or null for none).
- A task's settings (`queue`, `max_attempts`, `priority`, `visibility_timeout`) apply to every job it
  enqueues; `task.using(delay=60, dedup_key=...)` gives the same task with other options for one enqueue.
- `task.s(...)` is a signature: the task with its arguments, a job to be, for a workflow built with
  `jobq.Flow` (jobq/flows.py), each job after its parents.
- In a handler: `raise jobq.Retry(after=300)` runs the job again in 5 minutes (an attempt, like any failure),
  `raise jobq.Fail("reason")` makes it dead now, any other exception retries it on the queue's backoff.
  What it returns is the job's result (when JSON can hold it). `jobq.current_job()` is the job being run
  (its id, attempts, ...), `jobq.progress(value)` reports how far it got, and `jobq.parents()` /
  `jobq.parent_results()` what its parents (`depends_on`) returned.
- Durable execution: a task with a parameter named `ctx` gets the job's `jobq.Context` there (not from the
  payload; any handler can call `jobq.context()`). `ctx.step("charge", charge_card, order)` runs the
  function once across retries and returns its recorded result afterwards; `ctx.sleep(3600)` and
  `ctx.wait_for_event("paid:7", timeout=86400)` end the handler and run it again later from the top, the
  earlier steps answered from the record (see `Context`).
- A worker serving a registry (`Worker(tasks)`, `jobq worker myapp.tasks`) routes each job by its kind; a
  job whose kind no task has fails with an error naming the kinds it knows, and is retried on the queue's
  backoff, so that a worker of a newer release can take it during a rolling deploy (until its attempts run
  out).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import inspect
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, ParamSpec, Protocol, TypeVar, cast, overload

from jobq.client import AsyncClient, Client
from jobq.types import Event, Job, LeasedJob, Parent

__all__ = [
    "Context",
    "Fail",
    "Suspend",
    "Retry",
    "Signature",
    "Task",
    "Tasks",
    "UnknownTask",
    "aparent_results",
    "aparents",
    "context",
    "current_job",
    "parent_results",
    "parents",
    "progress",
]

P = ParamSpec("P")
# A task's parameter of this name is given the job's `jobq.Context`, never a payload field.
CONTEXT_PARAMETER = "ctx"
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Running:
    """What a handler's context knows of its job: the job, where its progress goes, and the worker's
    client and event loop (to read its parents when its lease did not carry them; None outside a
    worker)."""

    job: LeasedJob
    report: Callable[[int, Any], None]  # (job id, progress)
    client: AsyncClient | None = None
    loop: asyncio.AbstractEventLoop | None = None
    # Its parents once read with a request (`parents`), so a handler asking again makes no other.
    read: dict[str, list[Parent]] = field(default_factory=dict)
    # Its durable context, made on first use (`context()`, a task's `ctx`).
    durable: list[Context] = field(default_factory=list)


_current: contextvars.ContextVar[Running] = contextvars.ContextVar("jobq_running")


def _running(what: str) -> Running:
    try:
        return _current.get()
    except LookupError:
        raise LookupError(f"jobq.{what}() is only known inside a handler the worker runs") from None


def is_async(function: Callable[..., Any]) -> bool:
    """Whether calling `function` gives a coroutine: an `async def`, or an object with an async `__call__`."""
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(
        getattr(function, "__call__", None)  # noqa: B004 - an object with an async __call__
    )


def current_job() -> LeasedJob:
    """The job whose handler is running (in that handler's thread or task); LookupError outside one."""
    return _running("current_job").job


def progress(value: Any) -> None:
    """Report the running job's progress (any JSON value: `{"done": 40, "of": 100}`), shown on the job.
    It goes with the lease's next extension, or within a second: calling it often costs no request
    per call, and only the latest value is sent."""
    running = _running("progress")
    running.report(running.job.id, value)


PARENTS_PAGE = 1000  # parents read per request, when the lease did not carry them


def parents() -> list[Parent]:
    """The running job's parents (its `depends_on`), in id order (the order they were enqueued in; a
    `jobq.Flow`'s jobs are enqueued in the order they were added): each one's id, kind, status and
    result, what its handler returned. LookupError outside a handler.

    The lease of a job with 1-100 parents carries them: read from it, with no request. For a job with
    more, or none (a lease tells the two apart by nothing), they are read with `GET /jobs/{id}/parents`,
    page after page, once per job. A plain handler (run on a thread) waits for that; an async handler
    cannot block its event loop, so there this raises RuntimeError when a request is needed:
    `await jobq.aparents()` reads them either way."""
    running = _running("parents")
    known = _parents_known(running)
    if known is not None:
        return known
    loop = _worker_loop(running, "parents")
    try:
        on_the_loop = asyncio.get_running_loop() is loop
    except RuntimeError:
        on_the_loop = False
    if on_the_loop:
        raise RuntimeError(
            f"job {running.job.id}: its lease did not carry its parents (it has none, or more than 100), "
            "and an async handler cannot wait for them here: use `await jobq.aparents()`"
        )
    return asyncio.run_coroutine_threadsafe(_read_parents(running), loop).result()


async def aparents() -> list[Parent]:
    """`parents()`, awaited: for an async handler, which may not block its event loop while the parents
    of a job whose lease did not carry them (more than 100, or none) are read."""
    running = _running("aparents")
    known = _parents_known(running)
    if known is not None:
        return known
    loop = _worker_loop(running, "aparents")
    if asyncio.get_running_loop() is loop:
        return await _read_parents(running)
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_read_parents(running), loop))


def parent_results(kind: str | Task[Any, Any] | None = None) -> list[Any]:
    """What the running job's parents returned (their results), in id order as `parents()` gives them;
    only those of `kind` (a kind, or a task) when given: `(charge,) = jobq.parent_results("charge")`.
    A parent that did not complete has None (a job with `run_if="finished"` or `"failed"` may have
    such parents: `parents()` says each one's status)."""
    return _results(parents(), kind)


async def aparent_results(kind: str | Task[Any, Any] | None = None) -> list[Any]:
    """`parent_results()`, awaited, as `aparents()` is."""
    return _results(await aparents(), kind)


def _results(found: list[Parent], kind: str | Task[Any, Any] | None) -> list[Any]:
    name = kind.name if isinstance(kind, Task) else kind
    return [parent.result for parent in found if name is None or parent.kind == name]


def _parents_known(running: Running) -> list[Parent] | None:
    """The job's parents without a request (in id order): as its lease carried them, or as read before."""
    if running.job.parents is not None:
        return list(running.job.parents)
    read = running.read.get("parents")
    return None if read is None else list(read)


def _worker_loop(running: Running, what: str) -> asyncio.AbstractEventLoop:
    if running.client is None or running.loop is None:
        raise LookupError(
            f"jobq.{what}(): the job's lease did not carry its parents, and no worker can read them"
        )
    return running.loop


async def _read_parents(running: Running) -> list[Parent]:
    """Every parent of the running job, page by page, through the worker's client (on its loop)."""
    assert running.client is not None
    found: list[Parent] = []
    after: int | None = None
    while True:
        page = await running.client.job_parents(running.job.id, limit=PARENTS_PAGE, after_id=after)
        found += page.parents
        if page.next_after_id is None:
            running.read["parents"] = found
            return list(found)
        after = page.next_after_id


def context() -> Context:
    """The running job's durable context (`ctx.step`, `ctx.sleep`, `ctx.wait_for_event`); LookupError
    outside a handler the worker runs. A task with a parameter named `ctx` is given it there."""
    running = _running("context")
    if not running.durable:
        running.durable.append(Context(running))
    return running.durable[0]


# The step names jobq keeps for its own records: `ctx.sleep` records its wake-up time under one.
RESERVED_STEP_PREFIX = "jobq."


class Suspend(BaseException):  # noqa: N818 - read as what it does: the handler is suspended
    """Raised by `ctx.sleep` and `ctx.wait_for_event` to end the handler: the worker, instead of acking or
    nacking the job, sleeps it (`POST /release` with a delay, after recording its wake-up time) or parks it
    until the event (`POST /jobs/{id}/await`), and the handler runs again from the top later. A
    BaseException, so that a handler's `except Exception` does not swallow it: let it through."""

    def __init__(
        self,
        *,
        delay: float | None = None,
        record: tuple[str, float] | None = None,
        event: str | None = None,
        timeout: float | None = None,
    ) -> None:
        super().__init__(f"sleep {delay} s" if event is None else f"wait for event {event!r}")
        self.delay, self.record, self.event, self.timeout = delay, record, event, timeout


class Context:
    """Durable execution for one run of a job's handler: steps recorded with the job, sleeps that hold no
    worker, and waits for events.

    The handler is written to replay: after a crash, a retry, a sleep or an event, it runs again from the
    top, and each `step` it reaches that was recorded before returns the recorded result without running
    its function. So everything a handler decides must come from its payload, its steps' results and its
    events: a value that changes from one run to the next (the time, a random id, a read of data that
    others change) is taken inside a step, or the replay takes another path than the first run did::

        def place_order(order: int, ctx: jobq.Context) -> None:
            charge = ctx.step("charge", charge_card, order)       # runs once, however often the job runs
            ctx.sleep(3600)                                        # ends the handler; an hour later it
            paid = ctx.wait_for_event(f"paid:{order}", timeout=86400)  # runs again from the top
            if paid is None:                                       # the day ran out without the event
                ctx.step("refund", refund, charge["id"])
            ...

    Mistake to avoid: ``key = uuid.uuid4()`` in the handler, then ``ctx.step("ship", ship, order, key)``:
    a replay makes another key, and a step whose function did run (a crash before its result was recorded)
    ran with the other. Take it in a step: ``key = ctx.step("key", lambda: str(uuid.uuid4()))``.

    A step's side effect happens once when the process survives until its result is recorded; a crash in
    between runs the function again on the next lease (give it an idempotency key where that matters).
    Steps are recorded in `steps` ({name: result}) and names are unique within a job; `sleep` numbers its
    own records (`jobq.sleep:0`, ...), so step names starting with "jobq." are the service's."""

    def __init__(self, running: Running) -> None:
        self._running = running
        self._steps: dict[str, Any] = dict(running.job.steps or {})
        self._sleeps = 0
        self._waits: dict[str, int] = {}

    @property
    def job(self) -> LeasedJob:
        return self._running.job

    @property
    def steps(self) -> dict[str, Any]:
        """The steps recorded so far, by name: those the lease carried and those of this run."""
        return dict(self._steps)

    def step(self, name: str, function: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
        """Step `name`: its recorded result if the job has one (the function is not called), else
        `function(*args, **kwargs)`, recorded with the job before it is returned. The result must be a
        JSON value. In an async handler, `await ctx.astep(...)`: recording is a request, which a plain
        call would have to block the event loop for."""
        if name in self._steps:
            return cast(R, self._steps[name])
        _own_name(name)
        loop = _worker_loop_of(self._running, "step")
        try:
            on_the_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_the_loop = False
        if on_the_loop:
            raise RuntimeError(f"step {name!r}: in an async handler, use `await ctx.astep(...)`")
        if is_async(function):
            raise TypeError(
                f"step {name!r}: {function!r} is a coroutine function; use `await ctx.astep(...)`"
            )
        result = function(*args, **kwargs)
        return cast(R, asyncio.run_coroutine_threadsafe(self._record(name, result), loop).result())

    async def astep(self, name: str, function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """`step`, awaited, for an async handler; `function` may be a coroutine function."""
        if name in self._steps:
            return self._steps[name]
        _own_name(name)
        loop = _worker_loop_of(self._running, "astep")
        result = function(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        if asyncio.get_running_loop() is loop:
            return await self._record(name, result)
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._record(name, result), loop))

    async def _record(self, name: str, result: Any) -> Any:
        """Record `result` as step `name` (on the worker's loop); the result the job keeps, as JSON gives
        it back (a tuple a list), so that this run and every later one see the same value: this one, or
        the one recorded first when another run got there before (the first write wins)."""
        from jobq.types import Conflict

        client = self._running.client
        assert client is not None
        result = json.loads(json.dumps(result))
        try:
            await client.worker.record_step(self.job, name, result)
        except Conflict as exc:
            result = exc.problem.get("result")
        self._steps[name] = result
        return result

    def sleep(self, seconds: float) -> None:
        """Sleep `seconds` (at most a year) without holding a worker: ends the handler (raising `Suspend`),
        and the job runs again from the top once they have passed, where this call returns at once. Works
        the same in a plain and an async handler (no await). Sleeps are told apart by their order in the
        handler."""
        name = f"{RESERVED_STEP_PREFIX}sleep:{self._sleeps}"
        self._sleeps += 1
        now = time.time()
        wake = self._steps.get(name)
        if wake is None:
            raise Suspend(delay=max(seconds, 0.0), record=(name, now + max(seconds, 0.0)))
        if now < wake:  # woken early (run now by an operator, or the clocks disagree): sleep the rest
            raise Suspend(delay=wake - now)

    def wait_for_event(self, name: str, *, timeout: float) -> Event | None:
        """The event `name` (its payload in `.payload`), once it is sent: ends the handler (raising
        `Suspend`) until it is, or until `timeout` seconds (at most a year) pass, and the job runs again
        from the top, where this call returns it, or None when the wait ran out. An event sent after the
        job was enqueued and before this call is not lost: the job goes on at once. The n-th wait for a
        name in the handler reads the n-th event of that name that reached the job."""
        n = self._waits.get(name, 0)
        self._waits[name] = n + 1
        reached = [event for event in self.job.events or () if event.name == name]
        if n < len(reached):
            event = reached[n]
            return None if event.timed_out else event
        raise Suspend(event=name, timeout=timeout)


def _own_name(name: str) -> None:
    """ValueError for a step name the client keeps for itself (`jobq.sleep:0`)."""
    if name.startswith(RESERVED_STEP_PREFIX):
        raise ValueError(f"step names starting with {RESERVED_STEP_PREFIX!r} are jobq's own: {name!r}")


def _worker_loop_of(running: Running, what: str) -> asyncio.AbstractEventLoop:
    if running.client is None or running.loop is None:
        raise LookupError(f"ctx.{what}(): no worker runs this job, so nothing can be recorded")
    return running.loop


class Retry(Exception):  # noqa: N818 - read as an instruction: raise Retry(after=300)
    """Raised by a handler: run the job again after `after` seconds (default: the queue's backoff). The
    attempt counts, as any failure does: past the job's max_attempts it goes dead."""

    def __init__(self, reason: str = "", *, after: float | None = None) -> None:
        super().__init__(reason)
        self.after = after


class Fail(Exception):  # noqa: N818 - read as an instruction: raise Fail("reason")
    """Raised by a handler: the job goes dead now, whatever attempts remain, with `reason` as its error."""


class UnknownTask(LookupError):
    """A job of a kind that no task of the worker's has."""


@dataclass(frozen=True, slots=True)
class Options:
    """What a task sends with each job beside its arguments (None: the queue's setting)."""

    priority: int | None = None
    max_attempts: int | None = None
    delay: float | None = None
    run_at: datetime | None = None
    dedup_key: str | None = None
    key: str | None = None


@dataclass(frozen=True)
class Task(Generic[P, R]):
    """A function registered as a kind of job. Calling the task calls the function; `enqueue` queues a job
    that a worker runs with these arguments."""

    function: Callable[P, R]
    name: str
    queue: str
    tasks: Tasks = field(repr=False)
    options: Options = Options()
    # Seconds each lease of this task's jobs lasts while it runs (extended as it runs); None: the queue's.
    visibility_timeout: float | None = None
    signature: inspect.Signature = field(init=False, repr=False, compare=False)
    is_async: bool = field(init=False, repr=False, compare=False)
    # Whether the function takes the job's `jobq.Context` as `ctx` (left out of its arguments by name).
    takes_context: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        signature = inspect.signature(self.function)
        takes_context = CONTEXT_PARAMETER in signature.parameters
        if takes_context:
            signature = signature.replace(
                parameters=[p for p in signature.parameters.values() if p.name != CONTEXT_PARAMETER]
            )
        object.__setattr__(self, "takes_context", takes_context)
        for parameter in signature.parameters.values():
            if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.VAR_POSITIONAL):
                raise TypeError(
                    f"task {self.name}: parameter {parameter.name} cannot be passed by name, and a job's "
                    "arguments are its payload's fields, by name"
                )
        object.__setattr__(self, "signature", signature)
        object.__setattr__(self, "is_async", is_async(self.function))

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.function(*args, **kwargs)

    def using(
        self,
        *,
        priority: int | None = None,
        max_attempts: int | None = None,
        delay: float | None = None,
        run_at: datetime | None = None,
        dedup_key: str | None = None,
        key: str | None = None,
        queue: str | None = None,
    ) -> Task[P, R]:
        """The same task with these options for the jobs it enqueues (the others kept), and in `queue`
        when given."""
        given = {k: v for k, v in locals().items() if k not in ("self", "queue") and v is not None}
        options = dataclasses.replace(self.options, **given)
        return dataclasses.replace(self, options=options, queue=queue or self.queue)

    def s(self, *args: P.args, **kwargs: P.kwargs) -> Signature:
        """A signature: this task with these arguments (checked now, as `enqueue` checks them) and its
        options, a job to be. `jobq.Flow` makes a workflow of them: `flow.add(charge.s(order=7))`;
        `task.using(...).s(...)` for other options."""
        return Signature(self, self.payload(*args, **kwargs))

    def payload(self, *args: P.args, **kwargs: P.kwargs) -> dict[str, Any]:
        """The job's payload for these arguments: each given argument by name (a TypeError, as a call
        would raise, when they do not fit the function)."""
        bound = self.signature.bind(*args, **kwargs)
        payload = dict(bound.arguments)
        for parameter in self.signature.parameters.values():
            if parameter.kind is parameter.VAR_KEYWORD and parameter.name in payload:
                payload.update(payload.pop(parameter.name))
        return payload

    def job(self, *args: P.args, **kwargs: P.kwargs) -> dict[str, Any]:
        """The job `enqueue` sends, as a mapping for `Client.enqueue_many` (to send many in one request)."""
        return self.s(*args, **kwargs).job()

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Queue a job that runs this task with these arguments (through the registry's `Client`)."""
        return self.tasks.client.enqueue_many([self.job(*args, **kwargs)])[0]

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """`enqueue` through the registry's `AsyncClient`."""
        return (await self.tasks.async_client.enqueue_many([self.job(*args, **kwargs)]))[0]

    def run(self, job: LeasedJob) -> Any:
        """Run the function on a leased job's payload (what the worker calls)."""
        payload = job.payload if job.payload is not None else {}
        if not isinstance(payload, dict):
            raise Fail(
                f"task {self.name} takes its arguments by name, from a JSON object payload; "
                f"this job's payload is a {type(payload).__name__}"
            )
        try:
            self.signature.bind(**payload)
        except TypeError as exc:
            raise Fail(f"task {self.name}: the payload does not fit its arguments: {exc}") from None
        if self.takes_context:
            return self.function(**payload, **{CONTEXT_PARAMETER: context()})  # type: ignore[arg-type,call-arg]
        return self.function(**payload)  # type: ignore[call-arg]


@dataclass(frozen=True)
class Signature:
    """A task with its arguments (`task.s(...)`): one job to be, with the task's queue and options. A
    `jobq.Flow` adds it to a workflow; `job()` is the mapping `Client.enqueue_many` takes."""

    task: Task[Any, Any]
    payload: dict[str, Any]

    @property
    def name(self) -> str:
        """The task's name: the job's kind."""
        return self.task.name

    def job(self) -> dict[str, Any]:
        """The job, as a mapping for `Client.enqueue_many` (or, with a ref, for `create_workflow`)."""
        task = self.task
        options = {k: v for k, v in dataclasses.asdict(task.options).items() if v is not None}
        return {"queue": task.queue, "kind": task.name, "payload": self.payload, **options}


class Register(Protocol):
    """What `@tasks.task(...)` gives: it registers the function it decorates."""

    def __call__(self, function: Callable[P, R], /) -> Task[P, R]: ...


class Tasks:
    """A registry of tasks: `@tasks.task` registers a function, a worker given the registry runs them all.

    `client` and `async_client` enqueue (default: one on $JOBQ_URL and $JOBQ_TOKEN, made when first used);
    `queue` is the queue of a task that names none."""

    def __init__(
        self,
        *,
        queue: str = "default",
        client: Client | None = None,
        async_client: AsyncClient | None = None,
    ) -> None:
        self.queue = queue
        self._client, self._async_client = client, async_client
        self._tasks: dict[str, Task[Any, Any]] = {}

    @overload
    def task(self, function: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        *,
        name: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        visibility_timeout: float | None = None,
    ) -> Register: ...

    def task(
        self,
        function: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        visibility_timeout: float | None = None,
    ) -> Task[Any, Any] | Register:
        """Register a function as a task (`@tasks.task` or `@tasks.task(queue=..., ...)`)."""

        def register(function: Callable[..., Any], /) -> Task[Any, Any]:
            task = Task(
                function,
                name or function.__name__,
                queue or self.queue,
                self,
                Options(priority=priority, max_attempts=max_attempts),
                visibility_timeout,
            )
            if task.name in self._tasks:
                raise ValueError(f"a task named {task.name} is registered already")
            self._tasks[task.name] = task
            return task

        return register(function) if function is not None else register

    def __getitem__(self, name: str) -> Task[Any, Any]:
        try:
            return self._tasks[name]
        except KeyError:
            known = ", ".join(sorted(self._tasks)) or "none"
            raise UnknownTask(f"no task is named {name!r} in this worker (it knows: {known})") from None

    def __iter__(self) -> Iterator[Task[Any, Any]]:
        return iter(self._tasks.values())

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def queues(self) -> list[str]:
        """The queues of the registered tasks, in the order first named."""
        return list(dict.fromkeys(task.queue for task in self))

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client()
        return self._client

    @property
    def async_client(self) -> AsyncClient:
        if self._async_client is None:
            self._async_client = AsyncClient()
        return self._async_client

    @classmethod
    def of_module(cls, module: Any, queue: str = "default") -> Tasks:
        """The tasks of a module: its one `Tasks` registry if it has one, else each public function
        defined in it, under its own name."""
        registries = [value for value in vars(module).values() if isinstance(value, Tasks)]
        if len(registries) == 1:
            return registries[0]
        if registries:
            raise ValueError(f"{module.__name__} has {len(registries)} task registries: name one (module:x)")
        tasks = cls(queue=queue)
        for name, value in vars(module).items():
            if inspect.isfunction(value) and not name.startswith("_") and value.__module__ == module.__name__:
                tasks.task(value)
        if not tasks:
            raise ValueError(f"{module.__name__} has no task registry and no functions")
        return tasks
