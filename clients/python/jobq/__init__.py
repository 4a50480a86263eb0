"""jobq's Python client: `Client` and `AsyncClient` for the HTTP API, tasks (`Tasks`), and the worker runner
`Worker`.

    from jobq import Client, LeaseLost

    with Client() as jobq:  # JOBQ_URL, else http://127.0.0.1:8000
        jobq.enqueue("emails", {"to": "ada@example.com"})

Every public name is importable from here; the modules behind them are `jobq.client` (the calls and the
retry policy), `jobq.types` (results and errors), `jobq.tasks` (tasks, `Retry` and `Fail`), `jobq.worker`
(the runner; `jobq.pools` and `jobq.serving` hold its parts) and `jobq.cli` (the `jobq` command).
"""

from jobq.client import AsyncClient, Call, Calls, Client, Completion, Failure, RetryPolicy
from jobq.tasks import Fail, Retry, Task, Tasks, UnknownTask, current_job, progress
from jobq.types import (
    NO_LIMIT,
    AckResult,
    CatchUp,
    Conflict,
    DeadPage,
    DeleteKeyResult,
    DeleteScheduleResult,
    ExtendResult,
    Forbidden,
    ItemResult,
    Job,
    JobPage,
    JobqError,
    JobStatus,
    KeyView,
    LeasedJob,
    LeaseLost,
    NackResult,
    NotFound,
    PayloadTooLarge,
    PurgeResult,
    QueueDetail,
    QueueRow,
    QueueSettings,
    Rate,
    RetryDeadResult,
    Schedule,
    Unauthorized,
    Unavailable,
    Unreachable,
    ValidationError,
    WorkerSeen,
)
from jobq.worker import Stats, Worker

__version__ = "0.1.0"

__all__ = [
    "AckResult",
    "AsyncClient",
    "Call",
    "Calls",
    "CatchUp",
    "Client",
    "Completion",
    "Conflict",
    "DeadPage",
    "JobPage",
    "DeleteScheduleResult",
    "ExtendResult",
    "Fail",
    "Failure",
    "Forbidden",
    "ItemResult",
    "Job",
    "JobqError",
    "JobStatus",
    "LeaseLost",
    "LeasedJob",
    "NackResult",
    "NotFound",
    "PayloadTooLarge",
    "PurgeResult",
    "QueueDetail",
    "QueueRow",
    "QueueSettings",
    "Rate",
    "NO_LIMIT",
    "KeyView",
    "DeleteKeyResult",
    "Retry",
    "RetryDeadResult",
    "RetryPolicy",
    "Schedule",
    "Stats",
    "Task",
    "Tasks",
    "Unauthorized",
    "Unavailable",
    "UnknownTask",
    "Unreachable",
    "ValidationError",
    "Worker",
    "WorkerSeen",
    "current_job",
    "progress",
]
