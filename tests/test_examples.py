"""The clients in other languages (examples/), run as they are against a live service: their jobs
complete, fail, retry and go dead as they should, in the database; they stop cleanly on SIGTERM."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from waiting import equals, until

from app.client import AsyncClient

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
needs_node = pytest.mark.skipif(not shutil.which("node"), reason="needs node")
needs_curl_jq = pytest.mark.skipif(
    not (shutil.which("curl") and shutil.which("jq")), reason="needs curl and jq"
)


TOKENS = {"producer-token": "producer", "worker-token": "worker", "admin-token": "admin"}


@pytest.fixture
def service(start_service):
    """The service with tokens, so that the examples must send theirs; noticing within 0.5 s a long-poll
    whose worker has gone (instead of the 5 s default), so that stopping it after a test does not wait
    for the workers' abandoned long-polls."""
    return start_service(wakeup_safety_interval=0.5, tokens=TOKENS)


def start(command: list[str], url: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        command,
        cwd=ROOT,
        env={**os.environ, "JOBQ_URL": url, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def stop(process: subprocess.Popen) -> tuple[int, str, float]:
    """SIGTERM: its exit status, its output, and how long it took to exit."""
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        output, _ = process.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    return process.returncode, output, time.monotonic() - started


def by_id(db):
    async def query() -> dict[int, tuple[str, int]]:
        return {r["id"]: (r["status"], r["attempts"]) for r in await db.fetch("SELECT * FROM jobq.jobs")}

    return query


@needs_node
async def test_node_worker(service, db):
    async with AsyncClient(service.url, token="admin-token") as client:
        await client.configure_queue("node", backoff_base=0)  # retries come due at once
        ok = await client.enqueue("node", {"to": "ada@example.com"})
        failing = await client.enqueue("node", {"fail": "no such mailbox"}, max_attempts=2)
        slow = await client.enqueue("node", {"seconds": 1.5})  # outlives its 0.8 s lease, extended

    worker = start(
        ["node", "examples/node/worker.mjs", "node"],
        service.url,
        JOBQ_VISIBILITY_TIMEOUT="0.8",
        JOBQ_TOKEN="worker-token",
    )
    try:
        expected = {ok.id: ("completed", 1), failing.id: ("dead", 2), slow.id: ("completed", 1)}
        await until(equals(by_id(db), expected))
    finally:
        status, output, took = stop(worker)
    assert status == 0 and took < 2, output  # a waiting long-poll is abandoned at once

    errors = dict(await db.fetch("SELECT id, last_error FROM jobq.jobs"))
    assert errors[failing.id].startswith("Error: no such mailbox\n    at handle (file://")
    assert errors[slow.id] is None  # never expired
    assert (
        f"job {ok.id} done" in output and f"job {failing.id} failed, now pending: no such mailbox" in output
    )
    assert f"job {failing.id} failed, now dead" in output and output.endswith("stopped\n")


FLAKY_COMMAND = """
payload=$(cat)
echo "attempt $JOBQ_ATTEMPT of job $JOBQ_JOB_ID: $payload"
if jq -e .fail <<<"$payload" >/dev/null; then echo "cannot do it" >&2; exit 3; fi
if jq -e .flaky <<<"$payload" >/dev/null && ((JOBQ_ATTEMPT < 2)); then exit 1; fi
"""


@needs_curl_jq
async def test_shell_producer_and_worker(service, db):
    async with AsyncClient(service.url, token="admin-token") as client:
        await client.configure_queue("sh", backoff_base=0, max_attempts=2)
    env = {**os.environ, "JOBQ_URL": service.url, "JOBQ_TOKEN": "producer-token"}
    produce = ["examples/shell/produce.sh", "sh"]
    done = subprocess.run(
        [*produce, '{"n": 1}', '{"fail": true}', '{"flaky": true}'],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    ok, failing, flaky = map(int, done.stdout.split())
    done = subprocess.run(
        produce, input='{"n": 2}\n\n{"n": 3}\n', cwd=ROOT, env=env, capture_output=True, text=True
    )
    more = list(map(int, done.stdout.split()))
    assert len(more) == 2
    refused = subprocess.run(
        ["examples/shell/produce.sh", "no spaces", "1"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert refused.returncode == 1 and refused.stderr.endswith("(validation_error)\n")

    worker = start(
        ["examples/shell/worker.sh", "sh", "bash", "-c", FLAKY_COMMAND],
        service.url,
        JOBQ_TOKEN="worker-token",
    )
    try:
        expected = {ok: ("completed", 1), failing: ("dead", 2), flaky: ("completed", 2)}
        expected |= {job: ("completed", 1) for job in more}
        await until(equals(by_id(db), expected))
    finally:
        status, output, took = stop(worker)
    assert status == 0 and took < 2, output

    error = await db.fetchval("SELECT last_error FROM jobq.jobs WHERE id = $1", failing)
    assert error == f'exit status 3\nattempt 2 of job {failing}: {{"fail":true}}\ncannot do it'
    assert f"attempt 1 of job {ok}: " + json.dumps({"n": 1}, separators=(",", ":")) in output
    assert f"job {flaky} failed with exit status 1" in output and f"job {flaky} done" in output
    assert output.endswith("stopped\n")
