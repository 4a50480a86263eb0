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
from waiting import equals, states, until

pytest.importorskip("pycurl", reason="kombu's SQS transport receives through pycurl")
pytest.importorskip("boto3", reason="kombu's SQS transport needs boto3")
pytest.importorskip("celery", reason="celery is not installed")
pytest.importorskip("kombu.transport.SQS", reason="kombu[sqs] is not installed")

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
# The keys of the README's least-privilege table: the worker's is producer and worker (a retry is a new
# SendMessage from the worker) and, like the sender's, limited to Celery's queues.
CREDENTIALS = {
    "AKIACELERY": {"secret": "celery-secret", "roles": ["producer", "worker"], "queues": ["celery-*"]},
    "AKIASENDER": {"secret": "sender-secret", "role": "producer", "queues": ["celery-*"]},
}


def broker(service, key: str) -> str:
    address = urlsplit(service.url)
    return f"sqs://{key}:{CREDENTIALS[key]['secret']}@{address.hostname}:{address.port}"


def test_readme_configuration_is_the_tested_one():
    """The README's Celery settings are the ones the worker below runs with (it adds only timings)."""
    import celery_app

    readme = (ROOT / "README.md").read_text()
    match = re.search(
        r'Celery\("tasks", broker="(sqs://[^"]+)"\)\n.*broker_transport_options = (\{.*?\})\n', readme
    )
    assert match, "the README lost its Celery block"
    assert re.fullmatch(r"sqs://AKIA\w+:<its secret>@[\w.]+:\d+", match[1])
    options = ast.literal_eval(match[2])
    assert options.items() <= celery_app.app.conf.broker_transport_options.items()
    # Its key, as the README gives it, is the worker's key below (secret aside).
    key = re.search(r"JOBQ_AWS_CREDENTIALS='(\{\"AKIACELERY\".*\})'\n", readme)
    assert key, "the README lost the Celery key's configuration"
    (given,) = json.loads(key[1]).values()
    assert {**given, "secret": None} == {**CREDENTIALS["AKIACELERY"], "secret": None}


async def test_celery_tasks_through_jobq(start_service, database_url, db):
    service = start_service(tokens={"bearer-admin": "admin"}, aws_credentials=CREDENTIALS)
    await db.execute("CREATE TABLE celery_results (task text, attempt int, outcome text)")
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "celery_app", "worker", "--pool=solo", "-l", "info"],
        cwd=ROOT,
        env={
            **os.environ,
            "JOBQ_CELERY_BROKER": broker(service, "AKIACELERY"),
            "JOBQ_CELERY_DATABASE": database_url,
            "PYTHONPATH": str(ROOT / "tests"),
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        import celery_app

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
    with a MessageGroupId and a MessageDeduplicationId): a worker of four threads runs each group's steps
    one at a time, in the order they were sent, while the groups go side by side."""
    service = start_service(tokens={"bearer-admin": "admin"}, aws_credentials=CREDENTIALS)
    await db.execute("CREATE TABLE celery_results (seq bigserial, task text, attempt int, outcome text)")
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "celery_app", "worker", "--pool=threads", "-c", "4"]
        + ["-l", "info"],
        cwd=ROOT,
        env={
            **os.environ,
            "JOBQ_CELERY_BROKER": broker(service, "AKIACELERY"),
            "JOBQ_CELERY_DATABASE": database_url,
            "JOBQ_CELERY_QUEUE": "tasks.fifo",
            "PYTHONPATH": str(ROOT / "tests"),
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    groups, steps = ("acct-1", "acct-2"), 6
    try:
        import celery_app

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
        stop(worker)


def stop(worker: subprocess.Popen) -> None:
    """Stop a Celery worker (killed if it does not stop within 10 s) and print what it logged."""
    worker.terminate()
    try:
        output, _ = worker.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        worker.kill()
        output, _ = worker.communicate()
    print(output)
