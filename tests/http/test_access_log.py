"""The access log: one JSON line per request on `jobq.access` (app/http/middleware/access_log.py), in process
and from `jobq serve`, whose uvicorn access lines it replaces."""

import asyncio
import json
import logging
import signal
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest

from app.http.middleware.access_log import JSONFormatter
from tests.service_process import JOBQ, free_port, jobq_env

pytestmark = pytest.mark.anyio

SECRET = "payload-secret-7f3a"


class Lines(logging.Handler):
    """The access lines, formatted as they would be written."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(JSONFormatter())
        self.lines: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = self.format(record)
        assert "\n" not in text
        self.lines.append(json.loads(text))


@pytest.fixture
def access_lines() -> Iterator[Lines]:
    logger = logging.getLogger("jobq.access")
    handler, level = Lines(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


async def test_one_json_line_per_request(client, access_lines):
    jobs = [{"queue": "emails", "payload": {"token": SECRET}} for _ in range(3)]
    created = (await client.post("/jobs/batch", json={"jobs": jobs})).json()["jobs"]
    leased = (await client.post("/lease", json={"queue": "emails", "max_jobs": 2})).json()["jobs"]
    items = [{"id": j["id"], "lease_token": j["lease_token"]} for j in leased]
    await client.post("/ack/batch", json={"items": items})
    await client.get(f"/jobs/{created[2]['id']}")
    await client.post("/queues/emails/pause")
    await client.post("/lease", json={"queue": "emails", "max_jobs": 5})  # paused: none
    await client.get("/no/such/path")
    await client.post("/jobs", json={"queue": "emails"})  # no payload: 422

    # A line is written once its answer has gone out, so the last one may trail the answer a little.
    deadline = asyncio.get_running_loop().time() + 5
    while len(access_lines.lines) < 8 and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
    lines = access_lines.lines
    assert [(x["method"], x["route"], x["status"]) for x in lines] == [
        ("POST", "/jobs/batch", 201),
        ("POST", "/lease", 200),
        ("POST", "/ack/batch", 200),
        ("GET", "/jobs/{id}", 200),
        ("POST", "/queues/{queue}/pause", 200),
        ("POST", "/lease", 200),
        ("GET", "<unmatched>", 404),
        ("POST", "/jobs", 422),
    ]
    assert [(x.get("queue"), x.get("jobs")) for x in lines] == [
        ("emails", 3),
        ("emails", 2),
        (None, 2),
        (None, None),
        ("emails", None),
        ("emails", 0),
        (None, None),
        ("emails", None),
    ]
    for line in lines:
        assert line["logger"] == "jobq.access" and line["level"] == "info"
        assert line["time"].endswith("Z")
        assert isinstance(line["duration_ms"], float) and line["duration_ms"] >= 0
        assert line["client"] == "127.0.0.1"
        assert line["message"] == f"{line['method']} {line['route']} {line['status']}"
    assert lines[3]["path"] == f"/jobs/{created[2]['id']}"
    assert not any(SECRET in json.dumps(line) for line in lines)  # no payloads


async def test_switched_off(start_service, access_lines):
    service = start_service(access_log=False)
    async with httpx.AsyncClient(base_url=service.url) as client:
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.post("/jobs", json={"queue": "q", "payload": 1})).status_code == 201
    assert access_lines.lines == []


def test_jobq_serve_writes_json_lines_instead_of_uvicorn_access_lines(database_url, tmp_path):
    port = free_port()
    env = jobq_env(JOBQ_DATABASE_URL=database_url, JOBQ_MIGRATE_ON_START="false")
    env.pop("JOBQ_ACCESS_LOG", None)
    process = subprocess.Popen(
        [*JOBQ, "serve", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, "jobq serve exited"
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "jobq serve did not become ready"
            time.sleep(0.1)
        assert httpx.post(f"{url}/jobs", json={"queue": "served", "payload": SECRET}).status_code == 201
    finally:
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=30)[0].decode()
    lines = [json.loads(text) for text in output.splitlines() if text.startswith("{")]
    enqueue = [x for x in lines if x.get("route") == "/jobs"]
    assert len(enqueue) == 1 and enqueue[0]["status"] == 201 and enqueue[0]["queue"] == "served", output
    assert '"POST /jobs HTTP/1.1"' not in output  # uvicorn's own access line is off
    assert SECRET not in output
