"""jobq's Python client: `Client` and `AsyncClient` for the HTTP API, tasks (`Tasks`), and the worker runner
`Worker`.

    from jobq import Client, LeaseLost

    with Client() as jobq:  # JOBQ_URL, else http://127.0.0.1:8000
        jobq.enqueue("emails", {"to": "ada@example.com"})
        for leased in jobq.worker.lease("emails", wait=5):
            jobq.worker.ack(leased)

Here is what an application uses every day: the clients, tasks and what a handler raises or asks
(`Retry`, `Fail`, `current_job`, `progress`; for durable execution `Context`, `context()` and what ends a
handler to resume it later, `Suspend`), the runner, and the errors worth catching one by one (every
error of a call is a `JobqError`; `Unavailable` covers no answer at all). A client's own methods are a
producer's (`enqueue`, `get_job`, `wait`, `cancel`); `client.worker` holds the lease protocol and
`client.admin` the operator's calls (see `jobq.client`).

Workflows, jobs each run after its parents, are built from tasks with `Flow` (`flow.add(task.s(...),
after=[ref])`, then `flow.submit(client)`), or `chain`, `group` and `chord`; a task's handler reads
what its parents returned with `parents()` and `parent_results()` (`aparents()` and `aparent_results()`
in an async handler).

A receiver of push delivery (the service POSTs each job of a queue with a push URL to that URL, signed
as Standard Webhooks specifies) checks each request with `verify_push(request.headers, body, secret)`,
which returns the job (a `jobq.types.PushedJob`) or raises `PushVerificationError` (a ValueError, not a
`JobqError`); `sign_push` makes the headers the service would send, for testing a receiver (see
`jobq.push`).

The rest is imported from the module it lives in:
- `jobq.types`: the results (`Job`, `LeasedJob`, `JobStatus`, `AckResult`, `NackResult`, `ExtendResult`,
  `ItemResult`, `JobPage`, `DeadPage`, `RetryDeadResult`, `PurgeResult`, `QueueRow`, `QueueDetail`,
  `QueueSettings`, `Rate`, `NO_LIMIT`, `KeyView`, `DeleteKeyResult`, `WorkerSeen`, `Schedule`, `CatchUp`,
  `DeleteScheduleResult`; of dependencies and workflows `RunIf`, `Debounce`, `Parent`, `ParentPage`,
  `Workflow`, `WorkflowJob`, `WorkflowMade`, `WorkflowJobMade`, `WorkflowRow`, `WorkflowPage`,
  `WorkflowStatus`; of push delivery `PushedJob`, `PushedParent`) and the other errors (`Unreachable`,
  `Unauthorized`, `Forbidden`, `PayloadTooLarge`);
- `jobq.client`: the calls (`Call`, `Calls`), the retry policy (`RetryPolicy`), the batch items
  (`Completion`, `Failure`) and the groups of calls (`WorkerCalls`, `AdminCalls` and their async forms);
- `jobq.tasks`: `UnknownTask`, `Signature` (what `task.s(...)` gives); `jobq.flows`: what `Flow` is
  built on; `jobq.worker`: the runner's `Stats` (`jobq.pools` and `jobq.serving` hold
  its parts); `jobq.cli`: the `jobq` command.

Those names were importable from here too, and still are for one release, with a DeprecationWarning
naming their module (`__getattr__`).
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jobq.client import AsyncClient, Client
    from jobq.flows import Flow, chain, chord, group
    from jobq.push import sign_push, verify_push
    from jobq.tasks import (
        Context,
        Fail,
        Retry,
        Suspend,
        Task,
        Tasks,
        aparent_results,
        aparents,
        context,
        current_job,
        parent_results,
        parents,
        progress,
    )
    from jobq.types import (
        Conflict,
        JobqError,
        LeaseLost,
        NotFound,
        PushVerificationError,
        Unavailable,
        ValidationError,
    )
    from jobq.worker import Worker

__all__ = [
    "AsyncClient",
    "Client",
    "Conflict",
    "Context",
    "Fail",
    "Flow",
    "JobqError",
    "LeaseLost",
    "NotFound",
    "PushVerificationError",
    "Retry",
    "Suspend",
    "Task",
    "Tasks",
    "Unavailable",
    "ValidationError",
    "Worker",
    "aparent_results",
    "aparents",
    "chain",
    "chord",
    "context",
    "current_job",
    "group",
    "parent_results",
    "parents",
    "progress",
    "sign_push",
    "verify_push",
]

# Each name above with the module it lives in, imported at its first use: a program that runs only
# `jobq serve` (or any command that speaks to no service) does not load the HTTP client (aiohttp takes
# 0.15 s to import, the system's certificate authorities read with it).
_HOME = {
    **dict.fromkeys(("AsyncClient", "Client"), "jobq.client"),
    **dict.fromkeys(
        ("Context", "Fail", "Retry", "Suspend", "Task", "Tasks", "context", "current_job", "progress"),
        "jobq.tasks",
    ),
    **dict.fromkeys(("Flow", "chain", "chord", "group"), "jobq.flows"),
    **dict.fromkeys(("parents", "aparents", "parent_results", "aparent_results"), "jobq.tasks"),
    **dict.fromkeys(
        (
            "Conflict",
            "JobqError",
            "LeaseLost",
            "NotFound",
            "PushVerificationError",
            "Unavailable",
            "ValidationError",
        ),
        "jobq.types",
    ),
    **dict.fromkeys(("sign_push", "verify_push"), "jobq.push"),
    "Worker": "jobq.worker",
}

# The names this package exported before, each with the module it lives in: `from jobq import Job` goes
# on working for a release, with a warning that says where to import it from.
_MOVED = {
    **dict.fromkeys(("Call", "Calls", "Completion", "Failure", "RetryPolicy"), "jobq.client"),
    "UnknownTask": "jobq.tasks",
    "Stats": "jobq.worker",
    **dict.fromkeys(
        (
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
        ),
        "jobq.types",
    ),
}


def __getattr__(name: str) -> Any:
    if name == "__version__":
        # pyproject.toml's version, read from the installed distribution at its first use: written in one
        # place, and `import jobq` does not load importlib.metadata for it.
        from importlib.metadata import PackageNotFoundError, version

        try:
            value = version("jobq")
        except PackageNotFoundError:  # run from a checkout that was never installed
            value = "0+unknown"
        globals()[name] = value
        return value
    home = _HOME.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value  # found here from now on, without this function
        return value
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module 'jobq' has no attribute {name!r}")
    warnings.warn(
        f"importing {name} from jobq is deprecated, import it from {module} (from {module} import {name}); "
        "the old import will be removed in the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(module), name)


if TYPE_CHECKING:
    __version__: str
    # The same names, for type checkers, which do not run `__getattr__`: code importing them from here
    # keeps its types while it moves.
    from jobq.client import Call as Call
    from jobq.client import Calls as Calls
    from jobq.client import Completion as Completion
    from jobq.client import Failure as Failure
    from jobq.client import RetryPolicy as RetryPolicy
    from jobq.tasks import UnknownTask as UnknownTask
    from jobq.types import NO_LIMIT as NO_LIMIT
    from jobq.types import AckResult as AckResult
    from jobq.types import CatchUp as CatchUp
    from jobq.types import DeadPage as DeadPage
    from jobq.types import DeleteKeyResult as DeleteKeyResult
    from jobq.types import DeleteScheduleResult as DeleteScheduleResult
    from jobq.types import ExtendResult as ExtendResult
    from jobq.types import Forbidden as Forbidden
    from jobq.types import ItemResult as ItemResult
    from jobq.types import Job as Job
    from jobq.types import JobPage as JobPage
    from jobq.types import JobStatus as JobStatus
    from jobq.types import KeyView as KeyView
    from jobq.types import LeasedJob as LeasedJob
    from jobq.types import NackResult as NackResult
    from jobq.types import PayloadTooLarge as PayloadTooLarge
    from jobq.types import PurgeResult as PurgeResult
    from jobq.types import QueueDetail as QueueDetail
    from jobq.types import QueueRow as QueueRow
    from jobq.types import QueueSettings as QueueSettings
    from jobq.types import Rate as Rate
    from jobq.types import RetryDeadResult as RetryDeadResult
    from jobq.types import Schedule as Schedule
    from jobq.types import Unauthorized as Unauthorized
    from jobq.types import Unreachable as Unreachable
    from jobq.types import WorkerSeen as WorkerSeen
    from jobq.worker import Stats as Stats
