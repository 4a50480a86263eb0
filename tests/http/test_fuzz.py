"""Fuzzing: schemathesis generates requests from the committed openapi.json, valid and invalid, and
sends them to a live service. No answer may be a 5xx, and every answer must match the document.

The admin token reaches schemathesis through its own auth hook, not as a header forced onto every case:
so the cases in which it leaves the credentials out or mangles them on purpose go out as generated, and
its checks of authentication (an answer to a request without valid credentials must be 401) see them."""

import json
import re
import zlib
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from pydantic import TypeAdapter
from schemathesis.checks import allow_header_conformance, positive_data_acceptance, unsupported_method

from app.http.schemas import RunAt

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # 36 operations of seconds each: started first
# The operations in PARTS tests, each run by whichever process is free. The schema is read and the cases
# made when a part runs, not when the tests are collected: made there, they took every test process 3 s
# at its start, for operations that one process runs.
PARTS = 4
RUNNING: list[int] = []  # the part being run: schemathesis applies the filter below once it has begun


@pytest.fixture(params=range(PARTS), ids=lambda n: f"part{n}")
def api_schema(request):
    RUNNING[:] = [request.param]
    # schemathesis (4.32) names each operation's subtest by rewriting the node's `_nodeid`, which pytest
    # 9.2 no longer has: given one, it reports under the part's name.
    request.node._nodeid = request.node.nodeid
    return schemathesis.openapi.from_path(ROOT / "openapi.json")


def _in_running_part(ctx) -> bool:
    return zlib.crc32(ctx.operation.label.encode()) % PARTS == RUNNING[0]


schema = schemathesis.pytest.from_fixture("api_schema").include(_in_running_part)
TOKEN = "fuzz-admin-token"
RunAtCheck = TypeAdapter(RunAt)
FRAMING = {"transfer-encoding", "content-length", "connection", "host", "te", "trailer", "upgrade", "expect"}
NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
STATUSES: list[int] = []  # every answer's status, checked once the module's cases have run


@schema.auth()
class AdminToken:
    def get(self, case, context) -> str:
        return TOKEN

    def set(self, case, data: str, context) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


@pytest.fixture(scope="module")
def fuzz_service(server_dsn, databases):
    """One service for every operation's examples (a database per example would be slow)."""
    from tests.fixtures import Service, test_settings, with_database

    name = databases.take()
    settings_ = test_settings(with_database(server_dsn, name), tokens={TOKEN: "admin"})
    service = Service(settings_).start()
    yield service
    service.stop()
    databases.drop([name])
    # The hook's credentials reached the service: most answers were not 401.
    assert STATUSES and sum(s != 401 for s in STATUSES) > len(STATUSES) / 2, sorted(STATUSES)


def _run_ats_in_range(body) -> bool:
    """Whether every run_at of an enqueue body that has any is one the service takes
    (app/http/schemas/common.py)."""
    jobs = body.get("jobs") if isinstance(body, dict) else None
    for job in jobs if isinstance(jobs, list) else [body]:
        run_at = job.get("run_at") if isinstance(job, dict) else None
        if isinstance(run_at, str):
            try:
                RunAtCheck.validate_python(run_at)
            except ValueError:
                return False
    return True


@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms(case, fuzz_service):
    if case.headers:
        # Headers that frame the message are the HTTP server's (uvicorn answers a bad one with its own
        # 400), not the API's: generated ones are dropped.
        case.headers = {k: v for k, v in case.headers.items() if k.lower() not in FRAMING}
    if "\\u0000" in json.dumps(case.body, default=str):
        return  # PostgreSQL cannot store U+0000 in text or jsonb: refused with 422, as documented
    if case.path == "/lease" and isinstance(case.body, dict):
        wait = case.body.get("wait")
        if type(wait) in (int, float) and 0.2 < wait <= 60:
            case.body["wait"] = 0.2  # valid long-polls would only make the run slow
    if case.path == "/jobs/{id}" and isinstance(case.query, dict) and "wait" in case.query:
        # Only a number as JSON writes one: Python's float() also reads "1_0", " 5" and "٣", which a
        # negative case sends to be refused, and which made 0.2 would be accepted.
        wait = str(case.query["wait"])
        if NUMBER.fullmatch(wait) and 0.2 < float(wait) <= 60:
            case.query["wait"] = 0.2  # so would waits for a job that does not finish
    # FastAPI routes by path first: GET /jobs/batch is GET /jobs/{id} with a bad id (422, not 405), and
    # 405's Allow header names only the first route on a path. Both are the framework's.
    excluded = [unsupported_method, allow_header_conformance]
    if case.path == "/schedules/{name}" and case.method == "PUT":
        # A cron expression and a time zone are strings whose validity no JSON schema can state (croniter
        # and the zone database decide), so a "valid" body may rightly be refused with 422.
        excluded.append(positive_data_acceptance)
    if case.path in ("/jobs", "/jobs/batch") and case.method == "POST" and not _run_ats_in_range(case.body):
        # Nor can it bound a date-time: a run_at before 1970 or in the last day of 9999 is refused.
        excluded.append(positive_data_acceptance)
    if (
        case.path in ("/jobs", "/jobs/batch")
        and case.method == "POST"
        and "depends_on" in json.dumps(case.body, default=str)
    ):
        # Nor can it say whether a parent's id names a job: one that does not is refused with 422.
        excluded.append(positive_data_acceptance)
    if case.path == "/workflows" and case.method == "POST":
        # Nor whether a workflow's refs make a graph (each used once, no cycle), nor its parents' ids jobs.
        excluded.append(positive_data_acceptance)
    if case.path == "/queues/{queue}" and isinstance(case.body, dict) and case.body.get("push"):
        # Nor whether a push URL is one that the service's JOBQ_PUSH_ALLOWED_URLS admits (here none is).
        excluded.append(positive_data_acceptance)
    response = case.call_and_validate(base_url=fuzz_service.url, excluded_checks=excluded)
    STATUSES.append(response.status_code)
