"""The TypeScript client (clients/typescript) against a live service: its src/schema.d.ts must be what
openapi-typescript makes of openapi.json now, the package must build with its own `npm run build`
(tsc --strict), the examples of its README must compile against it, and its tests (`node --test` on
clients/typescript/test/) must pass against a service started here, whose URL they get as JOBQ_URL.

The package's dev dependencies are installed once per machine from the npm registry, by `npm ci` from
its lock file, under ~/.cache/jobq-tests (keyed by their versions and the lock file); the package is
built in a copy, so the test writes nothing into the repository. Without Node and npm the test is
skipped (failed under CI=true)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.docs import block

pytestmark = pytest.mark.any_server

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "clients" / "typescript"  # built by the typescript_client fixture (tests/fixtures.py)
# The documentation's TypeScript blocks run here, against the package built for the test.
DOCUMENTED_BLOCKS = ["typescript-worker", "typescript-one-job", "typescript-flow"]


def run(command: list[str | Path], **options) -> subprocess.CompletedProcess:
    """`command`, which must succeed; its output is the failure's message otherwise."""
    ran = subprocess.run(command, capture_output=True, text=True, **options)
    assert ran.returncode == 0, f"{' '.join(map(str, command))}:\n{ran.stdout}{ran.stderr}"
    return ran


def test_typescript_client(tmp_path, start_service, typescript_dev_packages, typescript_client):
    dev_packages, work = typescript_dev_packages, typescript_client

    # The committed types are those of openapi.json as it is now: made while tsc runs below, as the two
    # share nothing, and compared after it.
    fresh = tmp_path / "schema.d.ts"
    generate = [dev_packages / ".bin" / "openapi-typescript", ROOT / "openapi.json"]
    generating = subprocess.Popen(
        [*generate, "--default-non-nullable", "false", "-o", fresh],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    # The examples of the package's README, and the documentation's TypeScript blocks (run below), as a
    # program using the package would import them (`from "jobq-client"`, which inside the built package
    # names the package itself), compiled with tsc --strict in one run: each run of tsc checks Node's
    # types anew, which is most of its time.
    blocks = re.findall(r"^```ts\n(.*?)^```", (PACKAGE / "README.md").read_text(), re.MULTILINE | re.DOTALL)
    assert len(blocks) >= 3
    readme = work / "readme"
    readme.mkdir()
    for n, text in enumerate(blocks):
        (readme / f"example{n}.ts").write_text(text)
    for name in DOCUMENTED_BLOCKS:
        (readme / f"{name}.ts").write_text(block(name))
    config = {"extends": "../tsconfig.json", "compilerOptions": {"rootDir": ".", "outDir": "out"}}
    (readme / "tsconfig.json").write_text(json.dumps({**config, "include": ["*.ts"]}))
    try:
        run([dev_packages / ".bin" / "tsc", "-p", readme], timeout=300)
    finally:
        try:
            said, _ = generating.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            generating.kill()
            raise
    assert generating.returncode == 0, said
    assert fresh.read_text() == (PACKAGE / "src" / "schema.d.ts").read_text(), (
        "clients/typescript/src/schema.d.ts is not what openapi.json makes: run `npm run generate` there"
    )

    tests = sorted((work / "dist" / "test").glob("*.test.js"))
    expected = {"client", "errors", "retry", "tasks", "worker", "workflows"}
    assert {path.name.removesuffix(".test.js") for path in tests} >= expected

    # Noticing within 0.5 s a long-poll whose worker has gone (instead of the 5 s default), so that stopping
    # the service after the tests does not wait for the workers' abandoned long-polls.
    service = start_service(wakeup_safety_interval=0.5)
    # Its own process group: a test file's process left running (a worker never stopped) goes with it.
    node = subprocess.Popen(
        # The files side by side (each test keeps to queues of its own, tests/helpers.ts): node runs one
        # at a time on a machine of two cores, and most of their time is waiting on leases and polls.
        ["node", "--test", f"--test-concurrency={len(tests)}", "--test-reporter=spec", *tests],
        cwd=work,
        env={**os.environ, "JOBQ_URL": service.url, "JOBQ_TOKEN": ""},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = node.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(node.pid, signal.SIGKILL)
        output, _ = node.communicate()
        pytest.fail(f"node --test did not finish in 10 minutes:\n{output}", pytrace=False)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pid, signal.SIGKILL)
    assert node.returncode == 0, output

    env = {**os.environ, "JOBQ_URL": service.url, "JOBQ_TOKEN": ""}
    # The documentation's worker (docs/tutorials/typescript.md): it enqueues a job, runs it, and stops
    # on SIGTERM.
    worker = subprocess.Popen(
        ["node", readme / "out" / "typescript-worker.js"],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        with httpx.Client(base_url=service.url) as http:
            deadline = time.monotonic() + 60
            while http.get("/queues/emails").json().get("completed") != 1:
                assert time.monotonic() < deadline and worker.poll() is None, "the README's worker did no job"
                time.sleep(0.05)
            (job,) = http.get("/jobs", params={"queue": "emails"}).json()["jobs"]
    finally:
        worker.send_signal(signal.SIGTERM)
        output, _ = worker.communicate(timeout=30)
    assert worker.returncode == 0, output
    assert output == "sending to ada@example.com\n"
    assert (job["kind"], job["status"], job["result"]) == (
        "send_email",
        "completed",
        {"sent": "ada@example.com"},
    )

    # The documentation's TypeScript way of "One job, four ways".
    one_job = run(["node", readme / "out" / "typescript-one-job.js"], cwd=work, env=env, timeout=60)
    assert one_job.stdout == "sending to ada@example.com\ncompleted\n"
    jobs = httpx.get(f"{service.url}/jobs", params={"queue": "emails"}).json()["jobs"]
    assert [(job["payload"], job["status"], job["attempts"]) for job in jobs][0] == (
        {"to": "ada@example.com"},
        "completed",
        1,
    )
