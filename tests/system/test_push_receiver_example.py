"""examples/push-python/receiver.py, the example push receiver, as it is: requests signed by Standard
Webhooks' own library are done (200, the handler's result), put off (503 with Retry-After) or failed
(500); a request not signed with its secret is refused (401) before any handler runs."""

from __future__ import annotations

import base64
import importlib.util
import json
import secrets
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType

import httpx
import pytest
import standardwebhooks

pytestmark = pytest.mark.anyio

RECEIVER = Path(__file__).resolve().parents[2] / "examples" / "push-python" / "receiver.py"
SECRET = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The example's module, loaded from its file with JOBQ_PUSH_SECRET set, as uvicorn would."""
    monkeypatch.setenv("JOBQ_PUSH_SECRET", SECRET)
    spec = importlib.util.spec_from_file_location("push_receiver_example", RECEIVER)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def job(kind: str | None, payload: object, id: int = 7) -> bytes:
    return json.dumps(
        {
            "id": id,
            "queue": "default",
            "kind": kind,
            "key": None,
            "payload": payload,
            "attempts": 1,
            "max_attempts": 3,
            "run_at": "2026-11-23T10:00:00+00:00",
            "created_at": "2026-11-23T10:00:00+00:00",
        }
    ).encode()


def signed(body: bytes, secret: str = SECRET, at: datetime | None = None) -> dict[str, str]:
    at = at or datetime.now(UTC)
    webhook_id = f"job_{json.loads(body)['id']}"
    return {
        "content-type": "application/json",
        "webhook-id": webhook_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": standardwebhooks.Webhook(secret).sign(webhook_id, at, body),
        "jobq-attempt": "1",
    }


async def post(receiver: ModuleType, body: bytes, headers: dict[str, str]) -> httpx.Response:
    transport = httpx.ASGITransport(app=receiver.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://receiver") as client:
        return await client.post("/jobs", content=body, headers=headers)


async def test_a_signed_job_is_done_and_answered_with_its_result(receiver):
    body = job("send_email", {"to": "ada@example.com"})
    answer = await post(receiver, body, signed(body))
    assert (answer.status_code, answer.json()) == (200, {"sent_to": "ada@example.com"})


async def test_a_request_not_signed_with_the_secret_is_refused_before_its_handler_runs(receiver, monkeypatch):
    ran = []

    async def handler(payload: object) -> object:
        ran.append(payload)
        return "done"

    monkeypatch.setitem(receiver.HANDLERS, "send_email", handler)
    body = job("send_email", {"to": "ada@example.com"})
    other = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
    stale = datetime.now(UTC) - timedelta(minutes=10)
    for headers, why in (
        (signed(body, secret=other), "no signature matched the secret"),
        (signed(job("send_email", {"to": "eve@example.com"})), "no signature matched the secret"),
        (signed(body, at=stale), "more than the 300 s allowed"),
        ({"content-type": "application/json"}, "missing header webhook-id"),
    ):
        answer = await post(receiver, body, headers)
        assert answer.status_code == 401, answer.text
        assert why in answer.json()["error"]
    assert ran == []
    answer = await post(receiver, body, signed(body))
    assert (answer.status_code, answer.json(), ran) == (200, "done", [{"to": "ada@example.com"}])


async def test_a_job_wanted_later_is_answered_503_with_retry_after(receiver):
    this_month = datetime.now(UTC).strftime("%Y-%m")
    body = job("monthly_report", {"month": this_month})
    answer = await post(receiver, body, signed(body))
    assert (answer.status_code, answer.headers.get("retry-after")) == (503, "3600")
    body = job("monthly_report", {"month": "2001-01"})
    answer = await post(receiver, body, signed(body))
    assert (answer.status_code, answer.json()) == (200, {"month": "2001-01", "total": 0})


@pytest.mark.parametrize(
    ("kind", "payload", "error"),
    [("send_email", {"to": "nobody"}, "not an address"), ("resize_image", {}, "no handler for kind")],
)
async def test_a_handler_s_error_or_an_unknown_kind_is_answered_500(receiver, kind, payload, error):
    body = job(kind, payload)
    answer = await post(receiver, body, signed(body))
    assert answer.status_code == 500
    assert error in answer.json()["error"]
