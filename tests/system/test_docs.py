"""The documentation's examples, run against a live service, so they cannot go stale: the curl
walk-through, the schedule, and every block of the client pages; the site built as `make docs` builds it;
and the README's examples, which are copies of the documentation's.

They run as a reader runs them: one after another, in the documentation's order, against one service. So an
example that left a job behind for the next one to lease, or a schedule whose payload its task cannot
take, fails here. Each block's check asserts the jobs it made and that it changed no job made before it.
The one exception is the build of the Node.js block (npm ci, npm run build, npm install), which speaks to
no service: it starts with the test, in a copy of its own, and its worker starts in its place.
The TypeScript blocks run in tests/system/test_typescript_client.py, against the package built there."""

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from app.http.routers.schedules import declared
from jobq import AsyncClient
from tests import docs
from tests.fixtures import tool_missing
from tests.waiting import until

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.anyio, pytest.mark.any_server]

# The Clients section's blocks run elsewhere: the TypeScript ones, in tests/system/test_typescript_client.py
# against the package built there, and the generated client's in tests/system/test_generated_clients.py.
RUN_ELSEWHERE = {"typescript-one-job", "typescript-worker", "typescript-flow", "typescript"}
# Files the blocks after them use (`jobq worker shop`, `jobq worker tasks:send_email`), written, not run.
FILES = {"python-tasks": "shop.py", "python-handler": "tasks.py"}


def walkthrough() -> str:
    match = re.search(r"<!-- walkthrough:.*?-->\s*```bash\n(.*?)```", docs.text(), re.S)
    assert match, "the documentation lost its walk-through block"
    return match[1]


def schedule_blocks() -> tuple[str, str]:
    """The Schedules section's `PUT /schedules/nightly-report` and the same schedule in a file."""
    put = re.search(r"```bash\n(curl -X PUT \S+/schedules/nightly-report.*?)```", docs.text(), re.S)
    toml = re.search(r"```toml\n(\s*\[schedules\.nightly-report\].*?)```", docs.text(), re.S)
    assert put and toml, "the documentation lost its schedule's blocks"
    return put[1], re.sub(r"^  ", "", toml[1], flags=re.M)


@pytest.fixture
def service(start_service):
    """The service, noticing within 0.5 s a long-poll whose worker has gone (instead of the 5 s default), so
    that stopping it after a test does not wait for the workers' abandoned long-polls."""
    return start_service(wakeup_safety_interval=0.5)


def node_block() -> tuple[str, str]:
    """The Node.js block as its build (the lines that run npm), which speaks to no service, and the worker
    it is built for (the last line)."""
    text = block("node")
    *build, worker = text.strip().splitlines()
    assert build and all("npm " in line for line in build) and worker.startswith("node "), text
    return "\n".join(build) + "\n", worker + "\n"


@pytest.fixture
def node_build(tmp_path, service) -> Iterator[subprocess.Popen]:
    """The Node.js block's build, started at once (it takes seconds, most of them tsc's) in the test's
    copy of the TypeScript client and the example, into which it writes: it runs while the blocks
    before it do, and the test waits for it where the block comes. Stopped with the test if still
    running then. Without the tools the blocks need, the test is skipped (failed under CI=true)."""
    for tool in ("curl", "jq", "node", "npm"):
        if not shutil.which(tool):
            tool_missing(f"needs {tool} (Debian's curl, jq, nodejs and npm)")
    for part in ("clients/typescript", "examples/node"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("node_modules", "dist"))
    build = start_script(node_block()[0], service.url, tmp_path)
    yield build
    if build.poll() is None:
        os.killpg(build.pid, signal.SIGKILL)
        build.communicate()


block = docs.block


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
    return start_script(block(name), url, cwd)


def start_script(script: str, url: str, cwd: Path) -> subprocess.Popen:
    """`script` run by bash in a process group of its own, its output (and errors) to read."""
    return subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", script],
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


class Ledger:
    """The jobs of the test's database, block by block: `made()` is what the last block enqueued, each
    as (queue, payload, status, attempts, run_at later than now), and fails if it changed a job made
    before it (the status or attempts of a job that was there already), bar the ids it may touch."""

    def __init__(self, db) -> None:
        self.db = db
        self.before: dict[int, tuple] = {}

    async def _all(self) -> dict[int, tuple]:
        rows = await self.db.fetch(
            "SELECT id, queue, payload, status, attempts, run_at > now() AS later FROM jobq.all_jobs"
        )
        return {
            r["id"]: (r["queue"], json.loads(r["payload"]), r["status"], r["attempts"], r["later"])
            for r in rows
        }

    async def start(self) -> None:
        self.before = await self._all()

    async def made(self, *touched: int) -> list[tuple]:
        now = await self._all()
        changed = {
            id: (self.before[id], now.get(id))
            for id in self.before
            if id not in touched and self.before[id][2:4] != (now.get(id) or (0,) * 5)[2:4]
        }
        assert not changed, f"the block changed jobs made before it: {changed}"
        made = [now[id] for id in sorted(now) if id not in self.before]
        self.before = now
        return made

    async def ids(self, count: int) -> list[int]:
        """The ids of the last `count` jobs made."""
        rows = await self.db.fetch("SELECT id FROM jobq.all_jobs ORDER BY id DESC LIMIT $1", count)
        return sorted(r["id"] for r in rows)


def test_every_block_is_run_here_or_elsewhere():
    names = re.findall(r"<!-- clients: (\S+) -->", docs.text())
    assert names == [
        "python-one-job",
        "typescript-one-job",
        "shell-one-job",
        "curl-one-job",
        "python-client",
        "python-wait",
        "python-async",
        "python-tasks",
        "python-tasks-run",
        "python-handler",
        "python-worker",
        "cli",
        "typescript-worker",
        "node",
        "typescript-flow",
        "shell",
        "typescript",
    ], "a block was added, moved or dropped: run it in test_the_examples_in_order, in its place"


def test_the_readme_examples_are_the_documentations():
    """The README shows three of the documentation's examples: copies, so that they run here too."""
    readme = (ROOT / "README.md").read_text()
    shown = re.findall(r"^```\w+\n(.*?)^```", readme, re.S | re.M)
    examples = [block(name) for name in ("python-one-job", "typescript-one-job", "curl-one-job")]
    assert [s for s in shown if s in examples] == examples, "the README's examples differ from the docs'"


def test_the_site_builds_strict_and_offline(tmp_path):
    """`make docs`: no warning (a broken link, a page outside the nav, a setting without its comment), and
    nothing the pages load from elsewhere."""
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    pages = list((tmp_path / "site").rglob("*.html"))
    assert len(pages) >= len(docs.pages())
    for page in pages:
        html = page.read_text()
        loaded = re.findall(r'<(?:script|link|img)[^>]+(?:src|href)="(https?://[^"]+)"', html)
        assert loaded == [], (page, loaded[:3])
    configuration = (tmp_path / "site" / "reference" / "configuration.html").read_text()
    from app.settings import Settings

    for name in Settings.model_fields:
        assert f"JOBQ_{name.upper()}" in configuration, name


async def test_the_examples_in_order(service, db, tmp_path, node_build):
    """Every example, one after another in the documentation's order, against one service, as a reader runs
    them: none may lease what another left, or leave what the next one would lease."""
    ledger = Ledger(db)
    url = service.url

    # --- A walk through with curl
    await ledger.start()
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", walkthrough()],
        env={**os.environ, "JOBQ": url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    said = done.stdout.replace(" ", "")
    assert '"status":"completed"' in said and "mailboxdoesnotexist" in said and '"retried":1' in said
    assert said.endswith('{\n"pending":0,\n"running":0,\n"dead":0,\n"completed":2\n}\n'), done.stdout
    assert [(queue, status) for queue, _, status, *_ in await ledger.made()] == [
        ("emails", "completed"),
        ("emails", "completed"),
    ]
    assert (
        await db.fetchval("SELECT last_error FROM jobq.all_jobs WHERE payload->>'to' = 'nobody@invalid'")
        == "mailbox does not exist"
    )

    # --- Schedules: the schedule, as PUT sends it and as a file declares it, alike
    put, toml = schedule_blocks()
    host = urlsplit(url).netloc
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", put.replace("localhost:8000", host)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and '"next_run_at"' in done.stdout, done.stdout + done.stderr
    async with AsyncClient(url) as client:
        schedule = await client.schedule("nightly-report")
        # Paused while the examples run, lest its slot come in the middle: its job is triggered below,
        # when the task that takes it has its worker.
        await client.pause_schedule("nightly-report")
    (tmp_path / "schedules.toml").write_text(toml)
    (spec,) = declared(tmp_path / "schedules.toml").values()
    assert (spec.cron, spec.timezone, spec.queue, spec.kind, spec.payload) == (
        schedule.cron,
        schedule.timezone,
        schedule.queue,
        schedule.kind,
        schedule.payload,
    )
    assert await ledger.made() == []

    # --- Clients: One job, four ways (the TypeScript way runs elsewhere)
    for name in ("python-one-job", "shell-one-job", "curl-one-job"):
        output = run_block(name, url).stdout.splitlines()
        said = [line for line in output if line.startswith("sending to") or line in ("completed", "pending")]
        assert said == ["sending to ada@example.com", "completed"], (name, output)
        assert await ledger.made() == [("emails", {"to": "ada@example.com"}, "completed", 1, False)], name

    # --- Python client
    done = run_block("python-client", url)
    assert done.stdout == "sending to ada@example.com\ncompleted\n1\n"
    assert await ledger.made() == [
        ("welcome", {"to": "ada@example.com"}, "completed", 1, False),
        ("welcome", {"to": "bob@example.com"}, "pending", 0, True),
    ]
    done = run_block("python-wait", url)
    assert done.stdout == "completed 6\n", done.stdout + done.stderr
    assert await ledger.made() == [("sums", [1, 2, 3], "completed", 1, False)]
    run_block("python-async", url)
    assert await ledger.made() == [("reports", {"period": "2024-05"}, "completed", 1, False)]

    # --- Python tasks, and the schedule's job, which is the task's to run
    (tmp_path / FILES["python-tasks"]).write_text(block("python-tasks"))
    worker = start_block("python-tasks-run", url, cwd=tmp_path)
    try:
        done_jobs = "SELECT count(*) FROM jobq.all_jobs WHERE status = 'completed' AND kind IS NOT NULL"
        await until(lambda: db.fetchval(f"SELECT ({done_jobs}) = 2"))
        async with AsyncClient(url) as client:
            await client.trigger_schedule("nightly-report")
        await until(lambda: db.fetchval(f"SELECT ({done_jobs}) = 3"))
    finally:
        output = stop_block(worker)
    rows = await db.fetch(
        "SELECT queue, kind, payload, max_attempts, status FROM jobq.all_jobs WHERE kind IS NOT NULL "
        "ORDER BY id"
    )
    assert [
        (r["queue"], r["kind"], json.loads(r["payload"]), r["max_attempts"], r["status"]) for r in rows
    ] == [
        ("emails", "send_email", {"to": "ada@example.com", "subject": "Welcome"}, 3, "completed"),
        ("reports", "build_report", {"period": "2026-11"}, None, "completed"),  # the queue's
        ("reports", "build_report", {"period": "day"}, None, "completed"),  # the schedule's
    ]
    assert "sending 'Welcome' to ada@example.com" in output and "report for 2026-11" in output
    assert "report for day" in output
    assert len(await ledger.made()) == 3
    async with AsyncClient(url) as client:
        await client.delete_schedule("nightly-report")

    # --- Python worker runner
    (tmp_path / FILES["python-handler"]).write_text(block("python-handler"))
    async with AsyncClient(url) as client:
        await client.configure_queue("emails", backoff_base=3600)
        await client.enqueue("emails", {"to": "ada@example.com"})
        await client.enqueue("emails", {"to": "eve@elsewhere.org"})
    await ledger.made()
    ada, eve = await ledger.ids(2)
    worker = start_block("python-worker", url, cwd=tmp_path)
    try:
        await until(
            lambda: db.fetchval(
                "SELECT count(*) = 2 FROM jobq.all_jobs WHERE id = ANY($1) AND attempts = 1 "
                "AND status <> 'running'",
                [ada, eve],
            )
        )
    finally:
        output = stop_block(worker)
    assert await ledger.made(ada, eve) == []
    rows = await db.fetch(
        "SELECT status, run_at > now() AS later, last_error FROM jobq.all_jobs WHERE id = ANY($1) "
        "ORDER BY id",
        [ada, eve],
    )
    assert [(r["status"], r["later"]) for r in rows] == [("completed", False), ("pending", True)]
    error = rows[1]["last_error"]
    assert (
        error.startswith("ValueError: will not send to eve@elsewhere.org\nTraceback") and "tasks.py" in error
    )
    assert "sending to ada@example.com" in output and "emails: 1 done, 1 failed, 0/16 in flight\n" in output
    assert "does not exist" not in output

    # --- The jobq command (a dead job for `dead list` and `dead retry` first)
    async with AsyncClient(url) as client:
        await client.enqueue("notices", {"to": "nobody@invalid"}, max_attempts=1)
        (job,) = await client.lease("notices")
        await client.nack(job, "mailbox does not exist")
    await ledger.made()
    done = run_block("cli", url)
    assert "QUEUE    PENDING  SCHEDULED  RUNNING  DEAD" in done.stdout
    assert '"pending": 1,\n  "scheduled": 1,\n  "dead": 1' in done.stdout
    assert "mailbox does not exist" in done.stdout and "retried 1\nWORKER" in done.stdout
    assert await ledger.made(job.id) == [
        ("notices", {"to": "ada@example.com"}, "pending", 0, False),
        ("notices", {"to": "bob@example.com"}, "pending", 0, True),
    ]
    assert await db.fetchval("SELECT status FROM jobq.all_jobs WHERE id = $1", job.id) == "pending"
    row = await db.fetchrow(
        "SELECT priority, max_attempts, dedup_key FROM jobq.all_jobs WHERE payload->>'to' LIKE 'bob%' "
        "AND queue = 'notices'"
    )
    assert tuple(row) == (5, 3, None)
    assert (
        await db.fetchval(
            "SELECT dedup_key FROM jobq.all_jobs WHERE payload->>'to' LIKE 'ada%' AND queue = 'notices'"
        )
        == "welcome:ada"
    )
    assert await db.fetchval("SELECT paused FROM jobq.queues WHERE name = 'notices'") is False

    # --- TypeScript and JavaScript: the Node.js worker, in a checkout of its own (the package's `npm ci`
    # and build write into it): the TypeScript client built and linked beside the example (by the build
    # started with the test, `node_build`), and the example run.
    built, _ = await asyncio.to_thread(node_build.communicate, timeout=600)
    assert node_build.returncode == 0, built
    assert await ledger.made() == []
    async with AsyncClient(url) as client:
        node_job = await client.enqueue("emails", {"to": "ada@example.com"})
    await ledger.made()
    worker = start_script(node_block()[1], url, cwd=tmp_path)
    try:
        completed = "SELECT status = 'completed' FROM jobq.all_jobs WHERE id = $1"
        await until(lambda: db.fetchval(completed, node_job.id), timeout=300)
    finally:
        output = stop_block(worker)
    assert f"job {node_job.id} done" in output and output.endswith("stopped\n"), output
    assert await ledger.made(node_job.id) == []

    # --- Shell
    worker = start_block("shell", url)
    shell_done = (
        "SELECT count(*) = 2 FROM jobq.all_jobs WHERE id > $1 AND queue = 'emails' AND status = 'completed'"
    )
    try:
        await until(lambda: db.fetchval(shell_done, node_job.id))
    finally:
        output = stop_block(worker)
    first, second = await ledger.ids(2)
    assert output.startswith(f"{first}\n{second}\n")  # the ids produce.sh printed
    assert (
        f"sending to ada@example.com\njob {first} done" in output and "sending to bob@example.com" in output
    )
    assert await ledger.made() == [
        ("emails", {"to": "ada@example.com"}, "completed", 1, False),
        ("emails", {"to": "bob@example.com"}, "completed", 1, False),
    ]
