"""The client is typed: its package passes `mypy --strict`, and code using it is checked against it (a
task's `enqueue` takes the function's own arguments; the groups' calls and the spellings they replace
have the calls' own signatures; the job `verify_push` returns has the fields of a pushed job)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures import once_per_run

PACKAGE = Path(__file__).resolve().parent.parent / "jobq"

USER_CODE = """
import asyncio
import jobq
from jobq import QueueRow as OldQueueRow  # an import of old, typed as before
from jobq.types import Job, LeasedJob, PushedJob, QueueRow

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

def receive(headers: dict[str, str], body: bytes) -> str | None:
    pushed: PushedJob = jobq.verify_push(headers, body, "whsec_c2VjcmV0")
    return pushed["kind"]

send_email.enqueue(3)                      # error: not a str
send_email.enqueue("a", subjekt="x")       # error: no such argument
build_report.enqueue()                     # error: month missing
jobq.Client().admin.pause(7)               # error: a queue's name
jobq.verify_push({}, b"", "")["queu"]      # error: no such field
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


def checked(where: Path) -> dict[str, object]:
    """One run of mypy over the package and the user code together: most of a run is reading the standard
    library's stubs and those of the dependencies, the same for both, so each test reads its part of the
    one output (the user code's lines name user.py, any other line is the package's)."""
    (where / "user.py").write_text(USER_CODE)
    done = mypy(str(PACKAGE), str(where / "user.py"))
    return {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}


@pytest.fixture(scope="session")
def mypy_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The run of `checked`, once per run of the tests (its workers read the one output)."""

    def run(where: Path) -> None:
        where.mkdir()
        (where / "mypy.json").write_text(json.dumps(checked(where)))

    return json.loads((once_per_run(tmp_path_factory, "typing", run) / "mypy.json").read_text())


def diagnostics(output: str) -> list[str]:
    """mypy's lines about the code (`path:line: error: ...`, and its notes), without the summary."""
    return [line for line in output.splitlines() if re.match(r"[^:]+:(\d+:)? (error|note|warning): ", line)]


def test_the_package_passes_mypy_strict(mypy_run):
    output = str(mypy_run["stdout"]) + str(mypy_run["stderr"])
    # Exit status 1 is errors found (the user code's, below); 2 would be a crash or a bad option.
    assert mypy_run["returncode"] in (0, 1) and mypy_run["stderr"] == "", output
    assert [line for line in diagnostics(output) if "user.py:" not in line] == [], output
    # Every file of the package was checked, with user.py.
    files = len(list(PACKAGE.rglob("*.py")))
    assert re.search(rf" {files + 1} source files\)?$", output, re.M), output


def test_a_task_s_arguments_are_checked_as_a_call_s(mypy_run):
    stdout = str(mypy_run["stdout"])
    found = [line for line in diagnostics(stdout) if ": error: " in line and "user.py:" in line]
    errors = [line.split(": error: ")[1] for line in found]
    lines = [int(line.split(":")[1]) for line in found]
    source = USER_CODE.splitlines()
    assert [source[n - 1].split("#")[1].strip() for n in lines] == [
        "error: not a str",
        "error: no such argument",
        "error: month missing",
        "error: a queue's name",
        "error: no such field",
    ], stdout
    assert 'incompatible type "int"; expected "str"' in errors[0]
    assert 'Unexpected keyword argument "subjekt"' in errors[1]
    assert 'Missing positional argument "month"' in errors[2]
    assert 'incompatible type "int"; expected "str"' in errors[3]
    assert '"PushedJob" has no key "queu"' in errors[4]
