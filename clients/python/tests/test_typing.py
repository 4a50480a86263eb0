"""The client is typed: its package passes `mypy --strict`, and code using it is checked against it (a
task's `enqueue` takes the function's own arguments; the groups' calls and the spellings they replace
have the calls' own signatures)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "jobq"

USER_CODE = """
import asyncio
import jobq
from jobq import QueueRow as OldQueueRow  # an import of old, typed as before
from jobq.types import Job, LeasedJob, QueueRow

tasks = jobq.Tasks(queue="emails")

@tasks.task(max_attempts=3)
def send_email(to: str, subject: str = "Hello") -> None: ...

@tasks.task
async def build_report(month: str) -> int:
    return 1

send_email.enqueue("ada@example.com", subject="Hi")
job: Job = send_email.enqueue(to="ada@example.com")
asyncio.run(build_report.aenqueue(month="2026-11"))
count: int = asyncio.run(build_report("2026-11"))
leased: list[LeasedJob] = jobq.Client().worker.lease("emails", max_jobs=10)
worker = jobq.Worker(tasks, concurrency=16)
rows: list[QueueRow] = jobq.Client().admin.queues()
old_rows: list[OldQueueRow] = jobq.Client().queues()  # the spelling of old, typed as before

async def lease(client: jobq.AsyncClient) -> list[LeasedJob]:
    return await client.worker.lease("emails") + await client.lease("emails")

send_email.enqueue(3)                      # error: not a str
send_email.enqueue("a", subjekt="x")       # error: no such argument
build_report.enqueue()                     # error: month missing
jobq.Client().admin.pause(7)               # error: a queue's name
"""


def mypy(*args: str) -> subprocess.CompletedProcess[str]:
    # MYPYPATH: an editable install is found through an import hook, which mypy does not follow.
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--hide-error-context", *args],
        env={**os.environ, "MYPYPATH": str(PACKAGE.parent)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_package_passes_mypy_strict():
    done = mypy(str(PACKAGE))
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_task_s_arguments_are_checked_as_a_call_s(tmp_path):
    (tmp_path / "user.py").write_text(USER_CODE)
    done = mypy(str(tmp_path / "user.py"))
    found = [line for line in done.stdout.splitlines() if ": error: " in line and "user.py" in line]
    errors = [line.split(": error: ")[1] for line in found]
    lines = [int(line.split(":")[1]) for line in found]
    source = USER_CODE.splitlines()
    assert [source[n - 1].split("#")[1].strip() for n in lines] == [
        "error: not a str",
        "error: no such argument",
        "error: month missing",
        "error: a queue's name",
    ], done.stdout
    assert 'incompatible type "int"; expected "str"' in errors[0]
    assert 'Unexpected keyword argument "subjekt"' in errors[1]
    assert 'Missing positional argument "month"' in errors[2]
    assert 'incompatible type "int"; expected "str"' in errors[3]
