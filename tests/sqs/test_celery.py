"""Celery on kombu's SQS transport runs real tasks through jobq: a worker subprocess receives them over
the SQS API (signed, with tokens configured), a task that fails once is retried with Celery's own
``self.retry``, and every message ends as a completed job."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests import docs
from tests.waiting import equals, states, until

pytest.importorskip("pycurl", reason="kombu's SQS transport receives through pycurl")
pytest.importorskip("boto3", reason="kombu's SQS transport needs boto3")
pytest.importorskip("celery", reason="celery is not installed")
pytest.importorskip("kombu.transport.SQS", reason="kombu[sqs] is not installed")

pytestmark = [pytest.mark.anyio, pytest.mark.any_server]

ROOT = Path(__file__).resolve().parents[2]
# The keys of the least-privilege table (docs/how-to/sqs.md): the worker's is producer and worker (a
# retry is a new SendMessage from the worker) and, like the sender's, limited to Celery's queues.
CREDENTIALS = {
    "AKIACELERY": {"secret": "celery-secret", "roles": ["producer", "worker"], "queues": ["celery-*"]},
    "AKIASENDER": {"secret": "sender-secret", "role": "producer", "queues": ["celery-*"]},
}


def broker(service, key: str) -> str:
    address = urlsplit(service.url)
    return f"sqs://{key}:{CREDENTIALS[key]['secret']}@{address.hostname}:{address.port}"


def test_the_documented_configuration_is_the_tested_one():
    """The documentation's Celery settings are the ones the worker below runs with (it adds only timings)."""
    from tests import celery_app

    readme = docs.text()
    match = re.search(
        r'Celery\("tasks", broker="(sqs://[^"]+)"\)\n.*broker_transport_options = (\{.*?\})\n', readme
    )
    assert match, "the documentation lost its Celery block"
    assert re.fullmatch(r"sqs://AKIA\w+:<its secret>@[\w.]+:\d+", match[1])
    options = ast.literal_eval(match[2])
    assert options.items() <= celery_app.app.conf.broker_transport_options.items()
    # Its key, as the documentation gives it, is the worker's key below (secret aside).
    key = re.search(r"JOBQ_AWS_CREDENTIALS='(\{\"AKIACELERY\".*\})'\n", readme)
    assert key, "the documentation lost the Celery key's configuration"
    (given,) = json.loads(key[1]).values()
    assert {**given, "secret": None} == {**CREDENTIALS["AKIACELERY"], "secret": None}


async def test_celery_tasks_through_jobq(start_service, database_url, db):
    service = start_service(tokens={"bearer-admin": "admin"}, aws_credentials=CREDENTIALS)
    await db.execute("CREATE TABLE celery_results (task text, attempt int, outcome text)")
    worker = start_worker(service, database_url, "--pool=solo")
    try:
        from tests import celery_app

        with celery_app.app.connection_for_write(broker(service, "AKIASENDER")) as connection:
            celery_app.add.apply_async((2, 3), connection=connection)
            celery_app.flaky.apply_async(("jobq",), connection=connection)

        async def results():
            rows = await db.fetch("SELECT task, attempt, outcome FROM celery_results ORDER BY 1, 2")
            return [tuple(row) for row in rows]

        expected = [("add", 0, "5"), ("flaky", 0, "failed"), ("flaky", 1, "JOBQ")]
        await until(equals(results, expected), timeout=20)
        # Three messages (the retry is a new one), each received once and deleted after its task ran
        # (task_acks_late).
        await until(equals(states(db, "celery-tasks"), {"completed": 3}), timeout=10)
        assert await db.fetchval("SELECT array_agg(attempts) FROM jobq.all_jobs") == [1, 1, 1]
    finally:
        stop(worker)


async def test_celery_on_a_fifo_queue_runs_each_group_in_order(start_service, database_url, db):
    """kombu's SQS transport on a FIFO queue (``tasks.fifo``: it creates it with FifoQueue, sends each task
    with a MessageGroupId and a MessageDeduplicationId): two workers of one thread each run each group's
    steps one at a time, in the order they were sent, while the groups go side by side. (A receive hands
    out several messages of a group, as SQS does, so a worker of several threads would run them side by
    side: on SQS as on jobq, a FIFO queue's Celery workers run one task at a time.)"""
    service = start_service(tokens={"bearer-admin": "admin"}, aws_credentials=CREDENTIALS)
    await db.execute("CREATE TABLE celery_results (seq bigserial, task text, attempt int, outcome text)")
    workers = [
        start_worker(service, database_url, "--pool=threads", "-c", "1", queue="tasks.fifo") for _ in range(2)
    ]
    groups, steps = ("acct-1", "acct-2"), 6
    try:
        from tests import celery_app

        with celery_app.app.connection_for_write(broker(service, "AKIASENDER")) as connection:
            for n in range(steps):
                for group in groups:
                    celery_app.step.apply_async(
                        (group, n), connection=connection, queue="tasks.fifo", MessageGroupId=group
                    )

        async def ended():
            return await db.fetchval("SELECT count(*) FROM celery_results WHERE outcome LIKE '% end'")

        await until(equals(ended, len(groups) * steps), timeout=30)
        for group in groups:
            rows = await db.fetch(
                "SELECT attempt, outcome FROM celery_results WHERE outcome LIKE $1 ORDER BY seq", f"{group} %"
            )
            # Each step starts after the one before it ended: in order, one at a time.
            assert [(r["attempt"], r["outcome"].split()[1]) for r in rows] == [
                (n, moment) for n in range(steps) for moment in ("start", "end")
            ]
        assert await db.fetchval("SELECT array_agg(DISTINCT key ORDER BY key) FROM jobq.all_jobs") == list(
            groups
        )
        await until(equals(states(db, "celery-tasks.fifo"), {"completed": len(groups) * steps}), timeout=10)
        kept = await db.fetchval("SELECT sqs_attributes FROM jobq.queues WHERE name = 'celery-tasks.fifo'")
        assert json.loads(kept)["FifoQueue"] == "true"
    finally:
        for worker in workers:
            stop(worker)


def start_worker(service, database_url: str, *pool: str, queue: str | None = None) -> subprocess.Popen:
    """A Celery worker of tests/celery_app.py on `service` as AKIACELERY, its tasks recording into
    `database_url`. The app is named as the tests import it, tests.celery_app, from the repository's root:
    Celery names a task after its module, and a worker knows only the names of the tasks it imported. (With
    tests/ itself on the path, tests/http would also hide the standard library's http package.)"""
    queue_env = {"JOBQ_CELERY_QUEUE": queue} if queue else {}
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.celery_app", "worker", *pool, "-l", "info"],
        cwd=ROOT,
        env={
            **os.environ,
            "JOBQ_CELERY_BROKER": broker(service, "AKIACELERY"),
            "JOBQ_CELERY_DATABASE": database_url,
            **queue_env,
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def stop(worker: subprocess.Popen) -> None:
    """Stop a Celery worker (killed if it does not stop within 10 s) and print what it logged."""
    worker.terminate()
    try:
        output, _ = worker.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        worker.kill()
        output, _ = worker.communicate()
    print(output)
