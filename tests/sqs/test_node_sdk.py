"""The AWS SDK for JavaScript v3 (@aws-sdk/client-sqs from npm) against a live, secured service:
it signs with SigV4, checks the MD5s, sends, receives and deletes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from app.sqs.protocol import job_id_of

pytestmark = [pytest.mark.anyio, pytest.mark.any_server]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sqs-node"
CREDENTIALS = {"AKIANODE": {"secret": "node-secret", "role": "admin"}}


@pytest.fixture(scope="module")
def sdk() -> Path:
    if not shutil.which("node") or not shutil.which("npm"):
        pytest.skip("needs node and npm")
    if not (EXAMPLE / "node_modules" / "@aws-sdk" / "client-sqs").is_dir():
        done = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund"],
            cwd=EXAMPLE,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            pytest.skip(f"npm install failed: {done.stderr[-500:]}")
    return EXAMPLE


def roundtrip(sdk: Path, url: str, secret: str) -> subprocess.Popen:
    """examples/sqs-node/roundtrip.mjs started against the service at `url`, signing as AKIANODE with
    `secret`."""
    return subprocess.Popen(
        ["node", "roundtrip.mjs", url, "from-node"],
        cwd=sdk,
        env={**os.environ, "AWS_ACCESS_KEY_ID": "AKIANODE", "AWS_SECRET_ACCESS_KEY": secret},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished(run: subprocess.Popen) -> subprocess.CompletedProcess:
    stdout, stderr = run.communicate(timeout=60)
    return subprocess.CompletedProcess(run.args, run.returncode, stdout, stderr)


async def test_send_receive_delete_with_the_javascript_sdk(sdk, start_service, db):
    service = start_service(tokens={"bearer-admin": "admin"}, aws_credentials=CREDENTIALS)
    # Side by side (each is mostly Node starting up): the forged run is refused at its first request, so
    # it changes nothing the signed one sees.
    runs = [roundtrip(sdk, service.url, "node-secret"), roundtrip(sdk, service.url, "wrong")]
    try:
        done, refused = [finished(run) for run in runs]
    finally:
        for run in runs:
            run.kill()  # nothing to do for a run that ended
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["queueUrl"] == f"{service.url}/000000000000/from-node"
    assert result["sentId"] == result["receivedId"]
    assert (result["body"], result["lang"], result["receiveCount"]) == ("hello from node", "javascript", "1")
    job = await db.fetchrow(
        "SELECT status, payload, attempts FROM jobq.all_jobs WHERE id = $1", job_id_of(result["sentId"])
    )
    assert (job["status"], json.loads(job["payload"]), job["attempts"]) == ("completed", "hello from node", 1)

    assert refused.returncode != 0
    assert "SignatureDoesNotMatch" in refused.stderr
