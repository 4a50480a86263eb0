"""examples/push-node/receiver.mjs, the Node push receiver, run as its README says (`node receiver.mjs`,
with jobq-client built and linked beside it as in test_examples.py), on a free port: requests signed by
Python's `standardwebhooks` (as the service signs) are done (200 and the result), put off (503 with
Retry-After) or failed (500); a request not signed with its secret is refused (401) before any handler
runs; a repeat of a `webhook-id` is answered with the first one's result, not run again."""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import standardwebhooks

pytestmark = pytest.mark.any_server

ROOT = Path(__file__).resolve().parents[2]


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


SECRET = new_secret()


@dataclass
class Receiver:
    url: str
    process: subprocess.Popen

    def stop(self) -> str:
        """SIGTERM: it must exit 0, saying it stopped; its output."""
        self.process.send_signal(signal.SIGTERM)
        try:
            output, _ = self.process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise
        assert self.process.returncode == 0 and output.endswith("stopped\n"), output
        return output


@pytest.fixture
def receiver(tmp_path, typescript_client) -> Iterator[Receiver]:
    """`node receiver.mjs` on a free port (PORT=0), with jobq-client linked as `npm install` links it and
    JOBQ_PUSH_SECRET set; stopped afterwards (where the test did not stop it)."""
    example = tmp_path / "push-node-example"
    shutil.copytree(ROOT / "examples" / "push-node", example)
    (example / "node_modules").mkdir()
    (example / "node_modules" / "jobq-client").symlink_to(typescript_client, target_is_directory=True)
    process = subprocess.Popen(
        ["node", str(example / "receiver.mjs")],
        cwd=ROOT,
        env={**os.environ, "JOBQ_PUSH_SECRET": SECRET, "PORT": "0"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = process.stdout.readline()
        listening = re.fullmatch(r"receiving pushes on (http://127\.0\.0\.1:\d+)\n", line)
        assert listening, line + (process.stdout.read() if process.poll() is not None else "")
        yield Receiver(listening[1], process)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def job(kind: str | None, payload: object, id: int = 7, **fields: object) -> bytes:
    """A job's body as the service sends it."""
    body = {
        "id": id,
        "queue": "accounts",
        "kind": kind,
        "key": None,
        "payload": payload,
        "attempts": 1,
        "max_attempts": 3,
        "run_at": "2026-11-23T10:00:00.123456+00:00",
        "created_at": "2026-11-23T10:00:00+00:00",
        **fields,
    }
    return json.dumps(body, ensure_ascii=False).encode()


def signed(body: bytes, *secrets: str, at: datetime | None = None) -> dict[str, str]:
    """The headers of `body` as the service sends them, signed with `secrets` (SECRET by default; several
    during a rotation, space-separated)."""
    at = at or datetime.now(UTC)
    webhook_id = f"job_{json.loads(body)['id']}"
    signatures = [standardwebhooks.Webhook(s).sign(webhook_id, at, body) for s in secrets or [SECRET]]
    return {
        "content-type": "application/json",
        "webhook-id": webhook_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": " ".join(signatures),
        "jobq-attempt": str(json.loads(body)["attempts"]),
    }


def post(receiver: Receiver, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{receiver.url}/push", content=body, headers=headers, timeout=10)


def test_a_signed_job_is_done_and_answered_200_with_its_result(receiver):
    body = job("send_email", {"to": "ada@example.com"})
    answer = post(receiver, body, signed(body))
    assert (answer.status_code, answer.json()) == (200, {"sent_to": "ada@example.com"})
    assert answer.headers["content-type"] == "application/json"

    # Non-ASCII bytes, parents, and a signature among others (a secret's rotation).
    parents = [{"id": 3, "kind": "render", "status": "completed", "result": {"html": "<p>é</p>"}}]
    body = job("sync_account", {"account": "Zoë ✓"}, id=8, parents=parents)
    answer = post(receiver, body, signed(body, new_secret(), SECRET))
    assert (answer.status_code, answer.json()) == (200, {"synced": "Zoë ✓"})

    assert "job 7 (send_email) done, attempt 1\n" in receiver.stop()


def test_a_request_not_signed_with_the_secret_is_refused_401_before_its_handler_runs(receiver):
    body = job("send_email", {"to": "ada@example.com"})
    headers = signed(body)
    missing = {k: v for k, v in headers.items() if k != "webhook-signature"}
    for refused, why in [
        (post(receiver, body, signed(body, new_secret())), "no signature in webhook-signature matches"),
        (
            post(receiver, body.replace(b"ada@", b"eve@"), headers),
            "no signature in webhook-signature matches",
        ),
        (
            post(receiver, body, {**headers, "webhook-id": "job_8"}),
            "no signature in webhook-signature matches",
        ),
        (
            post(receiver, body, signed(body, at=datetime.now(UTC) - timedelta(minutes=10))),
            "more than the 300 s",
        ),
        (post(receiver, body, missing), "no webhook-signature header"),
        (
            post(receiver, body, {**headers, "webhook-signature": "v2," + headers["webhook-signature"][3:]}),
            "no v1",
        ),
    ]:
        assert refused.status_code == 401, refused.text
        assert why in refused.json()["error"]
    answer = post(receiver, body, headers)
    assert (answer.status_code, answer.json()) == (200, {"sent_to": "ada@example.com"})

    output = receiver.stop()
    assert output.count("refused a push: ") == 6
    assert output.count("job 7 (send_email) done") == 1, output  # run once, after the refusals


def test_a_job_wanted_later_is_answered_503_with_retry_after(receiver):
    body = job("sync_account", {"account": "ada", "rate_limited": True})
    answer = post(receiver, body, signed(body))
    assert (answer.status_code, answer.headers.get("retry-after")) == (503, "30")
    assert answer.json() == {"error": "the accounts API is rate limiting us"}
    # Not kept as done: the next push of the job runs it again.
    body = job("sync_account", {"account": "ada"}, attempts=1)
    answer = post(receiver, body, signed(body))
    assert (answer.status_code, answer.json()) == (200, {"synced": "ada"})


@pytest.mark.parametrize(
    ("kind", "payload", "error"),
    [
        ("send_email", {}, "no address to send to"),
        ("resize_image", {}, 'no handler for kind "resize_image"'),
        ("constructor", {}, 'no handler for kind "constructor"'),
        (None, {}, "no handler for kind null"),
    ],
)
def test_a_handler_s_error_or_an_unknown_kind_is_answered_500(receiver, kind, payload, error):
    body = job(kind, payload)
    answer = post(receiver, body, signed(body))
    assert answer.status_code == 500, answer.text
    assert answer.json() == {"error": error}


def test_a_repeat_of_a_webhook_id_gets_the_first_result_without_running_again(receiver):
    first = job("send_email", {"to": "ada@example.com"}, attempts=1)
    again = job("send_email", {"to": "ada@example.com"}, attempts=2)  # its answer was lost, say
    assert post(receiver, first, signed(first)).json() == {"sent_to": "ada@example.com"}
    answer = post(receiver, again, signed(again, at=datetime.now(UTC) + timedelta(seconds=1)))
    assert (answer.status_code, answer.json()) == (200, {"sent_to": "ada@example.com"})
    output = receiver.stop()
    assert "job 7 (send_email) done, attempt 1\n" in output
    assert "job 7 (send_email) done before: its result again, attempt 2\n" in output
