"""The README's examples, run against a live service, so they cannot go stale: the curl walk-through and
every block of the Clients section."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from waiting import until

from jobq import AsyncClient
from tests.fixtures import tool_missing

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.anyio
needs_curl_jq = pytest.mark.skipif(
    not (shutil.which("jq") and shutil.which("curl")), reason="needs curl and jq"
)


def walkthrough() -> str:
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"<!-- walkthrough:.*?-->\s*```bash\n(.*?)```", readme, re.S)
    assert match, "the README lost its walk-through block"
    return match[1]


@needs_curl_jq
async def test_readme_walkthrough(service, db):
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", walkthrough()],
        env={**os.environ, "JOBQ": service.url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert '"status":"completed"' in done.stdout.replace(" ", "")
    assert "mailbox does not exist" in done.stdout
    assert '"retried":1' in done.stdout.replace(" ", "")

    rows = await db.fetch("SELECT id, status, attempts, last_error FROM jobq.all_jobs ORDER BY id")
    assert [(r["status"], r["attempts"]) for r in rows] == [("completed", 1), ("pending", 0)]
    assert rows[1]["last_error"] == "mailbox does not exist"


@pytest.fixture
def service(start_service):
    """The service, noticing within 0.5 s a long-poll whose worker has gone (instead of the 5 s default), so
    that stopping it after a test does not wait for the workers' abandoned long-polls."""
    return start_service(wakeup_safety_interval=0.5)


# --- the Clients section: every block in it runs here --------------------------------------------


def block(name: str) -> str:
    readme = (ROOT / "README.md").read_text()
    match = re.search(rf"<!-- clients: {re.escape(name)} -->\s*```\w+\n(.*?)```", readme, re.S)
    assert match, f"the README lost its {name} block"
    return match[1]


def client_env(url: str) -> dict[str, str]:
    """Where a reader would be: JOBQ_URL set, `jobq` and `python` on the PATH, jobq installed (nothing of
    the checkout on the path)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "JOBQ_URL": url, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def run_block(name: str, url: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    command = (
        [sys.executable, "-c", block(name)] if name.startswith("python") else ["bash", "-euo", "pipefail"]
    )
    done = subprocess.run(
        command,
        input=None if name.startswith("python") else block(name),
        cwd=cwd,
        env=client_env(url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done


def start_block(name: str, url: str, cwd: Path = ROOT) -> subprocess.Popen:
    """A block that runs until stopped (a worker), in a process group of its own."""
    return subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", block(name)],
        cwd=cwd,
        env=client_env(url),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def stop_block(process: subprocess.Popen) -> str:
    os.killpg(process.pid, signal.SIGTERM)
    try:
        output, _ = process.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise
    assert process.returncode == 0, output
    return output


async def jobs(db) -> list[tuple]:
    rows = await db.fetch(
        "SELECT queue, payload, status, attempts, run_at > now() AS later FROM jobq.all_jobs ORDER BY id"
    )
    return [(r["queue"], json.loads(r["payload"]), r["status"], r["attempts"], r["later"]) for r in rows]


# The TypeScript one runs in tests/test_typescript_client.py, against the package built there.
@pytest.mark.parametrize(
    "name",
    ["python-one-job", *(pytest.param(f"{way}-one-job", marks=needs_curl_jq) for way in ("shell", "curl"))],
)
async def test_readme_one_job_four_ways(service, db, name):
    output = run_block(name, service.url).stdout.splitlines()
    said = [line for line in output if line in ("sending to ada@example.com", "completed")]
    assert said == ["sending to ada@example.com", "completed"], output
    assert await jobs(db) == [("emails", {"to": "ada@example.com"}, "completed", 1, False)]


async def test_readme_python_client(service, db):
    done = run_block("python-client", service.url)
    assert done.stdout == "sending to ada@example.com\ncompleted\n1\n"
    assert await jobs(db) == [
        ("emails", {"to": "ada@example.com"}, "completed", 1, False),
        ("emails", {"to": "bob@example.com"}, "pending", 0, True),
    ]


async def test_readme_python_async_client(service, db):
    run_block("python-async", service.url)
    assert await jobs(db) == [("reports", {"month": "2024-05"}, "completed", 1, False)]


async def test_readme_python_wait(service, db):
    done = run_block("python-wait", service.url)
    assert done.stdout == "completed 6\n", done.stdout + done.stderr
    assert await jobs(db) == [("sums", [1, 2, 3], "completed", 1, False)]


async def test_readme_python_worker(service, db, tmp_path):
    (tmp_path / "tasks.py").write_text(block("python-handler"))
    async with AsyncClient(service.url) as client:
        await client.configure_queue("emails", backoff_base=3600)
        await client.enqueue("emails", {"to": "ada@example.com"})
        await client.enqueue("emails", {"to": "eve@elsewhere.org"})
    worker = start_block("python-worker", service.url, cwd=tmp_path)
    try:
        await until(
            lambda: db.fetchval(
                "SELECT count(*) = 2 FROM jobq.all_jobs WHERE attempts = 1 AND status <> 'running'"
            )
        )
    finally:
        output = stop_block(worker)
    assert await jobs(db) == [
        ("emails", {"to": "ada@example.com"}, "completed", 1, False),
        ("emails", {"to": "eve@elsewhere.org"}, "pending", 1, True),
    ]
    error = await db.fetchval("SELECT last_error FROM jobq.all_jobs WHERE status = 'pending'")
    assert (
        error.startswith("ValueError: will not send to eve@elsewhere.org\nTraceback") and "tasks.py" in error
    )
    assert "sending to ada@example.com" in output and "emails: 1 done, 1 failed, 0/16 in flight\n" in output


async def test_readme_python_tasks(service, db, tmp_path):
    (tmp_path / "shop.py").write_text(block("python-tasks"))
    worker = start_block("python-tasks-run", service.url, cwd=tmp_path)
    try:
        await until(lambda: db.fetchval("SELECT count(*) = 2 FROM jobq.all_jobs WHERE status = 'completed'"))
    finally:
        output = stop_block(worker)
    rows = await db.fetch("SELECT queue, kind, payload, max_attempts FROM jobq.all_jobs ORDER BY id")
    assert [(r["queue"], r["kind"], json.loads(r["payload"]), r["max_attempts"]) for r in rows] == [
        ("emails", "send_email", {"to": "ada@example.com", "subject": "Welcome"}, 3),
        ("reports", "build_report", {"month": "2026-11"}, None),  # the queue's
    ]
    assert "sending 'Welcome' to ada@example.com" in output and "report for 2026-11" in output


@pytest.mark.skipif(not shutil.which("jq"), reason="needs jq")
async def test_readme_cli(service, db):
    async with AsyncClient(service.url) as client:  # a dead job for `dead list` and `dead retry`
        await client.enqueue("emails", {"to": "nobody@invalid"}, max_attempts=1)
        (job,) = await client.lease("emails")
        await client.nack(job, "mailbox does not exist")
    done = run_block("cli", service.url)
    assert "QUEUE   PENDING  SCHEDULED  RUNNING  DEAD" in done.stdout
    assert '"pending": 1,\n  "scheduled": 1,\n  "dead": 1' in done.stdout
    assert "mailbox does not exist" in done.stdout and done.stdout.endswith(
        "retried 1\nno worker has leased in the last hour\n"
    )
    assert await jobs(db) == [
        ("emails", {"to": "nobody@invalid"}, "pending", 0, False),
        ("emails", {"to": "ada@example.com"}, "pending", 0, False),
        ("emails", {"to": "bob@example.com"}, "pending", 0, True),
    ]
    row = await db.fetchrow(
        "SELECT priority, max_attempts, dedup_key FROM jobq.all_jobs WHERE payload->>'to' LIKE 'bob%'"
    )
    assert tuple(row) == (5, 3, None)
    assert (
        await db.fetchval("SELECT dedup_key FROM jobq.all_jobs WHERE payload->>'to' LIKE 'ada%'")
        == "welcome:ada"
    )
    assert await db.fetchval("SELECT paused FROM jobq.queues WHERE name = 'emails'") is False


async def test_readme_node_worker(service, db, tmp_path):
    """The block as a reader runs it, in a checkout of its own (the package's `npm ci` and build write
    into it): it builds the TypeScript client, links it beside the example, and runs the example."""
    if not (shutil.which("node") and shutil.which("npm")):
        tool_missing("needs node and npm (Debian's nodejs and npm)")
    for part in ("clients/typescript", "examples/node"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("node_modules", "dist"))
    async with AsyncClient(service.url) as client:
        await client.enqueue("emails", {"to": "ada@example.com"})
    worker = start_block("node", service.url, cwd=tmp_path)
    try:
        await until(lambda: db.fetchval("SELECT status = 'completed' FROM jobq.all_jobs"), timeout=300)
    finally:
        output = stop_block(worker)
    assert "job 1 done" in output and output.endswith("stopped\n"), output


@needs_curl_jq
async def test_readme_shell(service, db):
    worker = start_block("shell", service.url)
    try:
        await until(lambda: db.fetchval("SELECT count(*) = 2 FROM jobq.all_jobs WHERE status = 'completed'"))
    finally:
        output = stop_block(worker)
    assert output.startswith("1\n2\n")  # the ids produce.sh printed
    assert "sending to ada@example.com\njob 1 done" in output and "sending to bob@example.com" in output
