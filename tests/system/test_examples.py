"""The clients in other languages (examples/), run as they are against a live service: their jobs
complete, fail, retry and go dead as they should, in the database; they stop cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from jobq import AsyncClient
from tests.helpers import assert_nothing_stranded
from tests.waiting import equals, until

pytestmark = [pytest.mark.anyio, pytest.mark.any_server]

ROOT = Path(__file__).resolve().parents[2]
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


@pytest.fixture
def node_worker(tmp_path, typescript_client) -> list[str]:
    """The command that runs examples/node/worker.mjs as its README says, with jobq-client installed
    beside it (the package built by the typescript_client fixture, linked as `npm install` links it)."""
    example = tmp_path / "node-example"
    shutil.copytree(ROOT / "examples" / "node", example)
    (example / "node_modules").mkdir()
    (example / "node_modules" / "jobq-client").symlink_to(typescript_client, target_is_directory=True)
    return ["node", str(example / "worker.mjs")]


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
        return {r["id"]: (r["status"], r["attempts"]) for r in await db.fetch("SELECT * FROM jobq.all_jobs")}

    return query


async def test_node_worker(service, db, node_worker):
    async with AsyncClient(service.url, token="admin-token") as client:
        # Retries come due at once; leases of 2 s, which the slow job outlives, extended.
        await client.configure_queue("node", backoff_base=0, visibility_timeout=2)
        ok = await client.enqueue("node", {"to": "ada@example.com"})
        failing = await client.enqueue("node", {"fail": "no such mailbox"}, max_attempts=2)
        slow = await client.enqueue("node", {"seconds": 3})

    worker = start([*node_worker, "node"], service.url, JOBQ_TOKEN="worker-token")
    try:
        expected = {ok.id: ("completed", 1), failing.id: ("dead", 2), slow.id: ("completed", 1)}
        await until(equals(by_id(db), expected))
    finally:
        status, output, took = stop(worker)
    assert status == 0 and took < 2, output  # a waiting long-poll is abandoned at once

    rows = {r["id"]: r for r in await db.fetch("SELECT id, last_error, result FROM jobq.all_jobs")}
    error = rows[failing.id]["last_error"]
    assert error.startswith("Error: no such mailbox\n    at ") and "node-example/worker.mjs:" in error
    assert rows[slow.id]["last_error"] is None  # never expired
    assert json.loads(rows[slow.id]["result"]) == {"took": 3}
    assert f"job {ok.id} done" in output
    assert f"job {failing.id} failed (attempt 1 of 2, now pending): Error: no such mailbox" in output
    assert f"job {failing.id} failed (attempt 2 of 2, now dead)" in output and output.endswith("stopped\n")


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

    error = await db.fetchval("SELECT last_error FROM jobq.all_jobs WHERE id = $1", failing)
    assert error == f'exit status 3\nattempt 2 of job {failing}: {{"fail":true}}\ncannot do it'
    assert f"attempt 1 of job {ok}: " + json.dumps({"n": 1}, separators=(",", ":")) in output
    assert f"job {flaky} failed with exit status 1" in output and f"job {flaky} done" in output
    assert output.endswith("stopped\n")


@pytest.fixture(params=[pytest.param("shell", marks=needs_curl_jq), "node"])
def idle_worker(request) -> list[str]:
    """Each example worker on an empty queue (the shell one running `cat` on any job it gets)."""
    if request.param == "shell":
        return ["examples/shell/worker.sh", "idle", "cat"]
    return [*request.getfixturevalue("node_worker"), "idle"]


POLL_WAIT = 20  # seconds the examples' long-polls wait


def stop_idle(process: subprocess.Popen) -> tuple[int, str, float]:
    """SIGTERM, then `exited(process)`."""
    process.send_signal(signal.SIGTERM)
    return exited(process)


def exited(process: subprocess.Popen) -> tuple[int, str, float]:
    """Wait for the process to exit and print that it stopped, but not for its output to end, which a
    child left behind would hold open. Its exit status, output and seconds taken to exit (it must exit
    before its long-poll would have ended by itself)."""
    started = time.monotonic()
    try:
        status = process.wait(timeout=POLL_WAIT / 2)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    took = time.monotonic() - started
    output = ""
    while not output.endswith("stopped\n") and (line := process.stdout.readline()):
        output += line
    process.stdout.close()
    return status, output, took


async def test_a_worker_stopped_in_its_long_poll_strands_nothing(service, db, idle_worker):
    worker = start(idle_worker, service.url, JOBQ_TOKEN="worker-token")
    try:
        await until(lambda: service.app.state.runtime.wakeups.waiter_count() == 1)  # in its long-poll
    finally:
        status, output, took = stop_idle(worker)
    assert status == 0 and output.endswith("stopped\n"), output
    assert took < POLL_WAIT / 2, output  # its poll was cut short, not waited out
    await assert_nothing_stranded(service, db, "idle", token="producer-token")


async def test_a_worker_stopped_as_its_long_poll_starts_strands_nothing(service, db, idle_worker):
    """SIGTERM as soon as the worker says it is working: just before, during or just after the start of
    its first long-poll. Ten rounds, as the moment varies: a signal the worker missed as the poll started
    (the shell worker once did, between starting curl and noting its pid) shows up within them about
    half the time, as a worker that waits out its poll."""
    for _ in range(10):
        worker = start(idle_worker, service.url, JOBQ_TOKEN="worker-token")
        try:
            assert (await asyncio.to_thread(worker.stdout.readline)).startswith("working on idle")
        finally:
            status, output, took = stop_idle(worker)
        assert status == 0 and output.endswith("stopped\n"), output
        assert took < POLL_WAIT / 2, output
    await assert_nothing_stranded(service, db, "idle", token="producer-token")


def child_states(pid: int) -> list[str]:
    """The states (R, S, Z, ...) of a process's children, from /proc."""
    states = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, parent = stat.read_text().rsplit(")", 1)[1].split()[:2]
        except OSError:  # gone meanwhile
            continue
        if int(parent) == pid:
            states.append(state)
    return states


@needs_curl_jq
async def test_the_shell_worker_gives_back_a_job_its_long_poll_brought_as_it_stopped(service, db):
    """The long-poll's answer, a job, arrived just as SIGTERM did: the worker gives the job back (pending
    at once, its attempt not counted) instead of leaving it leased, and does not run it. The moment is
    made certain by freezing the worker (SIGSTOP) while its curl gets the job and exits, and sending
    SIGTERM before it thaws."""
    worker = start(["examples/shell/worker.sh", "idle", "cat"], service.url, JOBQ_TOKEN="worker-token")
    try:
        await until(lambda: service.app.state.runtime.wakeups.waiter_count() == 1)  # in its long-poll
        worker.send_signal(signal.SIGSTOP)
        async with AsyncClient(service.url, token="producer-token") as client:
            job = await client.enqueue("idle", {"n": 1})
        await until(lambda: child_states(worker.pid) == ["Z"])  # its curl got the job and exited
        assert await by_id(db)() == {job.id: ("running", 1)}
        worker.send_signal(signal.SIGTERM)
    finally:
        worker.send_signal(signal.SIGCONT)
        status, output, _ = exited(worker)
    assert await by_id(db)() == {job.id: ("pending", 0)}
    assert status == 0 and output.endswith(f"job {job.id} given back\nstopped\n"), output
    assert '{"n":1}' not in output  # `cat` never had it
