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
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs import block
from tests.fixtures import node_modules

pytestmark = pytest.mark.any_server

ROOT = Path(__file__).resolve().parents[2]
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


# The TypeScript programs, by the name of the generated types each imports: tests/generated's round trip,
# and the documentation's example (docs/tutorials/other-languages.md), which names them as it makes them.
PROGRAMS = {"round_trip": "schema", "readme": "jobq"}


@pytest.fixture(scope="module")
def typescript_programs(tmp_path_factory: pytest.TempPathFactory, node_packages: Path) -> tuple[Path, str]:
    """The TypeScript programs compiled with tsc --strict next to the types made from openapi.json as the
    documentation says, in one run of each tool for every test of the module: most of a run of tsc is checking
    Node's types, the same for both programs, and the types are the same whatever they are named. The
    directory, and what tsc said, which each test reads for its own program (`compiled`)."""
    where = tmp_path_factory.mktemp("generated-typescript")
    (where / "node_modules").symlink_to(node_packages)
    (where / "package.json").write_text('{"type": "module"}')
    (where / "round_trip.ts").write_text((ROOT / "tests" / "generated" / "round_trip.ts").read_text())
    (where / "readme.ts").write_text(block("typescript"))
    made, *copies = (where / f"{types}.d.ts" for types in PROGRAMS.values())
    ran = subprocess.run(
        [node_packages / ".bin" / "openapi-typescript", DOCUMENT, "--default-non-nullable", "false"]
        + ["-o", made],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    for copy in copies:
        shutil.copy(made, copy)
    options = {"strict": True, "target": "es2022", "module": "nodenext", "moduleResolution": "nodenext"}
    (where / "tsconfig.json").write_text(
        json.dumps(
            {
                "compilerOptions": {**options, "types": ["node"], "outDir": "out"},
                "files": [f"{program}.ts" for program in PROGRAMS],
            }
        )
    )
    # From the directory itself, so that each diagnostic starts with the name of its file.
    ran = subprocess.run(
        [node_packages / ".bin" / "tsc", "-p", ".", "--pretty", "false"],
        cwd=where,
        capture_output=True,
        text=True,
    )
    said = ran.stdout + ran.stderr
    return where, said if said or ran.returncode == 0 else f"tsc exited with {ran.returncode}"


def compiled(programs: tuple[Path, str], program: str) -> Path:
    """`program`'s JavaScript, which must have compiled without error. The diagnostics of the other
    programs (a line naming the file, then indented ones) are theirs to fail on; any other, in the program,
    in its types or in none in particular, fails it."""
    where, said = programs
    others = tuple(f"{other}.ts(" for other in PROGRAMS if other != program)
    errors = [text for text in re.split(r"\n(?=\S)", said.strip()) if text and not text.startswith(others)]
    assert not errors, "\n".join(errors)
    return where / "out" / f"{program}.js"


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


def test_openapi_typescript_with_openapi_fetch(service, typescript_programs):
    """tests/generated/round_trip.ts compiles only while error bodies are typed as Problem."""
    seen = json.loads(run_node(compiled(typescript_programs, "round_trip"), service, QUEUE="ts").stdout)
    assert seen["leased"] == seen["id"]
    assert (seen["stale_status"], seen["code"]) == (409, "lease_lost") and str(seen["id"]) in seen["detail"]
    assert (seen["acked"], seen["status"], seen["missing"]) == ("completed", "completed", "not_found")


@pytest.mark.anyio
async def test_readme_typescript_example(service, db, typescript_programs):
    ran = run_node(compiled(typescript_programs, "readme"), service)
    assert ran.stdout == "sending to ada@example.com\n" and ran.stderr == ""
    rows = await db.fetch("SELECT queue, status FROM jobq.all_jobs")
    assert [(r["queue"], r["status"]) for r in rows] == [("emails", "completed")]
