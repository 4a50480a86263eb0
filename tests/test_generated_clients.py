"""Clients generated from openapi.json as a user of another code base makes them, run against a live
service: openapi-python-client, and openapi-typescript's types with openapi-fetch (compiled by tsc
--strict). Neither may skip an endpoint, both must type error bodies as Problem, and a round trip
through each (enqueue, lease, an ack with a stale token read as `409 lease_lost`, the ack, the job)
must come out right.

The Node packages are installed once per machine from the npm registry, at the versions below, under
~/.cache/jobq-tests; without Node and npm the TypeScript test is skipped (failed under CI=true)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_readme import block

from tests.fixtures import node_modules

ROOT = Path(__file__).resolve().parent.parent
DOCUMENT = ROOT / "openapi.json"
NODE_PACKAGES = [
    "openapi-typescript@7.13.0",
    "openapi-fetch@0.17.0",
    "typescript@5.9.3",
    "@types/node@20.19.25",
]
STALE_TOKEN = "00000000-0000-4000-8000-000000000000"


def test_openapi_python_client(tmp_path, service):
    """Generated with no warning (an endpoint it cannot parse is left out with one), then used."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"post_hooks": []}))
    generator = Path(sys.executable).with_name("openapi-python-client")
    made = subprocess.run(
        [generator, "generate", "--path", DOCUMENT, "--meta", "none", "--output-path", tmp_path / "jobq_api"]
        + ["--config", config],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    assert "Warning" not in made.stdout + made.stderr, made.stdout + made.stderr
    generated = {path.stem for path in (tmp_path / "jobq_api" / "api").rglob("*.py")} - {"__init__"}
    operations = {
        op["operationId"]
        for item in json.loads(DOCUMENT.read_text())["paths"].values()
        for op in item.values()
    }
    assert generated == operations

    sys.path.insert(0, str(tmp_path))
    try:
        api = importlib.import_module("jobq_api")
        models = importlib.import_module("jobq_api.models")
        enqueue, get_job = (
            importlib.import_module(f"jobq_api.api.producers.{n}") for n in ("enqueue", "get_job")
        )
        lease, ack = (importlib.import_module(f"jobq_api.api.workers.{n}") for n in ("lease", "ack"))
        retry_dead = importlib.import_module("jobq_api.api.operators.retry_dead")
        with api.Client(base_url=service.url) as client:
            job = enqueue.sync(client=client, body=models.EnqueueRequest(queue="py", payload={"n": 1}))
            assert isinstance(job, models.EnqueuedJob) and job.status == models.JobStatus.PENDING
            (leased,) = lease.sync(client=client, body=models.LeaseRequest(queue="py")).jobs
            assert leased.id == job.id and leased.payload == {"n": 1}

            stale = ack.sync_detailed(
                client=client, body=models.AckRequest(id=job.id, lease_token=f"{STALE_TOKEN}.py")
            )
            assert stale.status_code == 409
            assert isinstance(stale.parsed, models.Problem)
            assert stale.parsed.code == models.ProblemCode.LEASE_LOST and str(job.id) in stale.parsed.detail

            acked = ack.sync(client=client, body=models.AckRequest(id=job.id, lease_token=leased.lease_token))
            assert acked.status == "completed"
            assert get_job.sync(client=client, id=job.id).status == models.JobStatus.COMPLETED
            invalid = lease.sync_detailed(client=client, body=models.LeaseRequest(queue="py", max_jobs=0))
            assert invalid.status_code == 422 and invalid.parsed.code == models.ProblemCode.VALIDATION_ERROR
            assert invalid.parsed.errors[0].loc[-1] == "max_jobs"
            retried = retry_dead.sync(client=client, body=models.RetryDeadRequest(queue="py"))
            assert retried.retried == 0
    finally:
        sys.path.remove(str(tmp_path))
        for name in [name for name in sys.modules if name == "jobq_api" or name.startswith("jobq_api.")]:
            del sys.modules[name]


@pytest.fixture(scope="session")
def node_packages() -> Path:
    """openapi-typescript, openapi-fetch, tsc and Node's types, at the versions above."""
    dependencies = dict(package.rsplit("@", 1) for package in NODE_PACKAGES)
    manifest = {"private": True, "devDependencies": dependencies}
    return node_modules("openapi-ts", {"package.json": json.dumps(manifest).encode()})


def typescript_project(where: Path, node_packages: Path, program: str, types: str) -> Path:
    """`program` (TypeScript importing the generated types from `./{types}.js`) compiled with tsc --strict
    next to those types, made from openapi.json as the README says; the JavaScript to run."""
    (where / "node_modules").symlink_to(node_packages)
    (where / "package.json").write_text('{"type": "module"}')
    (where / "main.ts").write_text(program)
    made = subprocess.run(
        [node_packages / ".bin" / "openapi-typescript", DOCUMENT, "--default-non-nullable", "false"]
        + ["-o", where / f"{types}.d.ts"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    options = {"strict": True, "target": "es2022", "module": "nodenext", "moduleResolution": "nodenext"}
    (where / "tsconfig.json").write_text(
        json.dumps({"compilerOptions": {**options, "types": ["node"], "outDir": "out"}, "files": ["main.ts"]})
    )
    compiled = subprocess.run([node_packages / ".bin" / "tsc", "-p", where], capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    return where / "out" / "main.js"


def run_node(script: Path, service, **env: str) -> subprocess.CompletedProcess:
    ran = subprocess.run(
        ["node", script],
        env={**os.environ, "JOBQ_URL": service.url, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    return ran


def test_openapi_typescript_with_openapi_fetch(tmp_path, service, node_packages):
    """tests/generated/round_trip.ts compiles only while error bodies are typed as Problem."""
    program = (ROOT / "tests" / "generated" / "round_trip.ts").read_text()
    seen = json.loads(
        run_node(typescript_project(tmp_path, node_packages, program, "schema"), service, QUEUE="ts").stdout
    )
    assert seen["leased"] == seen["id"]
    assert (seen["stale_status"], seen["code"]) == (409, "lease_lost") and str(seen["id"]) in seen["detail"]
    assert (seen["acked"], seen["status"], seen["missing"]) == ("completed", "completed", "not_found")


@pytest.mark.anyio
async def test_readme_typescript_example(tmp_path, service, db, node_packages):
    ran = run_node(typescript_project(tmp_path, node_packages, block("typescript"), "jobq"), service)
    assert ran.stdout == "sending to ada@example.com\n" and ran.stderr == ""
    rows = await db.fetch("SELECT queue, status FROM jobq.all_jobs")
    assert [(r["queue"], r["status"]) for r in rows] == [("emails", "completed")]
