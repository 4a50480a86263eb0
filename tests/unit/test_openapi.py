"""The OpenAPI document as code generators read it (app/http/openapi.py): short operation ids, error bodies
typed under the media type the service sends, the roles each operation takes, a description on every
operation and property. tests/system/test_generated_clients.py turns it into clients and runs them."""

import json
import re
from pathlib import Path

import pytest

from app.core import errors
from app.http.problems import _HTTP_CODES, PROBLEM_JSON, ProblemCode
from app.main import create_app
from app.settings import Settings
from tests.http.test_scopes import DECISIONS, OPEN

ROOT = Path(__file__).resolve().parents[2]
DOCUMENT = json.loads((ROOT / "openapi.json").read_text())
OPERATIONS = [
    (method, path, operation)
    for path, item in DOCUMENT["paths"].items()
    for method, operation in item.items()
]


def test_operation_ids_are_short_names():
    ids = [operation["operationId"] for _, _, operation in OPERATIONS]
    assert len(ids) == len(set(ids))
    for method, _, operation in OPERATIONS:
        name = operation["operationId"]
        assert re.fullmatch(r"[a-z]+(_[a-z]+)*", name), name
        assert not name.endswith(f"_{method}"), (name, "FastAPI's path-and-method default")
    assert {
        "enqueue",
        "enqueue_batch",
        "get_job",
        "list_jobs",
        "lease",
        "ack",
        "nack",
        "extend",
        "release",
    } < set(ids)
    assert {"retry_dead", "list_dead", "list_queues", "get_queue", "pause_queue", "resume_queue"} < set(ids)


def test_error_answers_are_problems_under_the_media_type_sent():
    for method, path, operation in OPERATIONS:
        for status, response in operation["responses"].items():
            if int(status) < 400 or path == "/metrics" and status == "200":
                continue
            assert list(response["content"]) == [PROBLEM_JSON], (method, path, status)
            schema = response["content"][PROBLEM_JSON]["schema"]
            # /readyz's 503 is a problem with the readiness fields beside it.
            model = "Unready" if (path, status) == ("/readyz", "503") else "Problem"
            assert schema == {"$ref": f"#/components/schemas/{model}"}, (method, path, status)
    schemas = DOCUMENT["components"]["schemas"]
    assert "HTTPValidationError" not in schemas
    assert set(schemas["Problem"]["properties"]) < set(schemas["Unready"]["properties"])


def test_problem_codes_are_an_enum_of_every_code_the_service_sends():
    """Every code an error class, an HTTP status or a `problem(...)` call in app/ gives is listed."""
    problem = DOCUMENT["components"]["schemas"]["Problem"]
    code = problem["properties"]["code"]
    assert code["$ref"] == "#/components/schemas/ProblemCode" and "Open to additions" in code["description"]
    assert DOCUMENT["components"]["schemas"]["ProblemCode"]["enum"] == list(ProblemCode)
    # A batch item's result names its code from the same list.
    item_code = DOCUMENT["components"]["schemas"]["ItemResult"]["properties"]["code"]
    assert {"$ref": "#/components/schemas/ProblemCode"} in item_code["anyOf"]
    sent = {
        cls.code
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, errors.JobqError)
    }
    sent |= set(_HTTP_CODES.values()) | {"error"}
    for source in (ROOT / "app").rglob("*.py"):
        sent |= set(re.findall(r'problem\(\s*\d+,\s*"([a-z_]+)"', source.read_text()))
    assert sent - set(ProblemCode) == set()
    # Validation errors are described, item by item.
    errors_schema = problem["properties"]["errors"]
    assert errors_schema["items"] == {"$ref": "#/components/schemas/FieldError"}
    assert set(DOCUMENT["components"]["schemas"]["FieldError"]["required"]) == {"loc", "msg", "type"}


def test_only_routes_that_take_input_list_a_422():
    for method, path, operation in OPERATIONS:
        takes_input = bool(operation.get("parameters")) or "requestBody" in operation
        assert ("422" in operation["responses"]) == takes_input, (method, path)
    assert list(DOCUMENT["paths"]["/healthz"]["get"]["responses"]) == ["200"]


def test_each_operation_says_which_roles_call_it_as_the_service_enforces():
    """x-jobq-roles is read from the same role checks test_scopes.py holds the service to."""
    for method, path, operation in OPERATIONS:
        route = re.sub(r"\{(\w+)\}", lambda m: "{key:key}" if m[1] == "key" else m[0], path)  # a convertor
        decision = DECISIONS[(method.upper(), route)]
        if decision == OPEN:
            assert "x-jobq-roles" not in operation and "No token needed." in operation["description"]
        else:
            assert set(operation["x-jobq-roles"]) == decision | {"admin"}, (method, path)
            assert (
                f"Roles, when tokens are configured: {', '.join(operation['x-jobq-roles'])}."
                in (operation["description"])
            )


def test_every_operation_and_property_is_described():
    for method, path, operation in OPERATIONS:
        text = operation["description"].split("\n\n")
        assert len(text) >= 2 and text[0].strip(), (method, path, "no description of its own")
    missing = [
        (name, prop)
        for name, schema in DOCUMENT["components"]["schemas"].items()
        for prop, value in schema.get("properties", {}).items()
        if not value.get("description")
    ]
    assert missing == []


@pytest.mark.parametrize(
    "name",
    ["EnqueueRequest", "EnqueueBatchRequest", "LeaseRequest", "AckRequest", "NackRequest", "Job", "Problem"],
)
def test_main_bodies_have_examples(name):
    assert DOCUMENT["components"]["schemas"][name].get("examples"), name


def test_job_status_is_an_enum_and_servers_are_named():
    job = DOCUMENT["components"]["schemas"]["Job"]
    assert job["properties"]["status"] == {"$ref": "#/components/schemas/JobStatus"} or (
        job["properties"]["status"]["$ref"] == "#/components/schemas/JobStatus"
    )
    assert DOCUMENT["components"]["schemas"]["JobStatus"]["enum"] == [
        "waiting",
        "pending",
        "running",
        "completed",
        "dead",
        "cancelled",
    ]
    assert DOCUMENT["servers"][0]["url"] == "http://127.0.0.1:8000"


def test_openapi_json_is_current():
    """openapi.json is generated from the app (`make openapi`); this fails when it drifts."""
    committed = json.loads((ROOT / "openapi.json").read_text())
    assert committed == create_app(Settings(database_url="postgresql://unused/x")).openapi(), (
        "openapi.json is stale: run `make openapi`"
    )
