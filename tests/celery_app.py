"""A Celery app on kombu's SQS transport, pointed at a jobq service by tests/sqs/test_celery.py.

The worker runs as ``celery -A tests.celery_app worker`` (from the repository) with JOBQ_CELERY_BROKER (an
``sqs://`` URL naming jobq's host and port), JOBQ_CELERY_DATABASE (where the tasks record what they did) and,
for a FIFO queue, JOBQ_CELERY_QUEUE (``tasks.fifo``; default ``tasks``).
"""

from __future__ import annotations

import asyncio
import os
import time

import asyncpg
from celery import Celery

app = Celery("jobq_celery_test", broker=os.environ.get("JOBQ_CELERY_BROKER", "sqs://test:test@"))
app.conf.update(
    broker_transport_options={
        "region": "us-east-1",
        "is_secure": False,
        "queue_name_prefix": "celery-",
        "visibility_timeout": 30,
        "wait_time_seconds": 1,
        "polling_interval": 0.1,
    },
    broker_connection_retry_on_startup=True,
    task_default_queue=os.environ.get("JOBQ_CELERY_QUEUE", "tasks"),
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
)


def record(task: str, attempt: int, outcome: str) -> None:
    async def insert() -> None:
        conn = await asyncpg.connect(os.environ["JOBQ_CELERY_DATABASE"])
        try:
            await conn.execute(
                "INSERT INTO celery_results (task, attempt, outcome) VALUES ($1, $2, $3)",
                task,
                attempt,
                outcome,
            )
        finally:
            await conn.close()

    asyncio.run(insert())


@app.task(bind=True)
def add(self, x: int, y: int) -> int:
    record("add", self.request.retries, str(x + y))
    return x + y


@app.task(bind=True, max_retries=3)
def flaky(self, word: str) -> str:
    if self.request.retries == 0:
        record("flaky", 0, "failed")
        raise self.retry(exc=RuntimeError("first try fails"), countdown=1)
    record("flaky", self.request.retries, word.upper())
    return word.upper()


@app.task(bind=True)
def step(self, group: str, n: int) -> None:
    """One step of a group's sequence, recorded as it starts and ends (on a FIFO queue, a group's steps
    run one at a time, in order, however many threads the worker has)."""
    record("step", n, f"{group} start")
    time.sleep(0.05)
    record("step", n, f"{group} end")
