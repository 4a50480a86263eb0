"""Credentials no broader than the job: who may call each route (a decision per route, checked for every
role), the viewer role, tokens and SQS keys limited to queue-name patterns, and their configuration."""

from __future__ import annotations

import re

import httpx
import pytest
from pydantic import ValidationError

from app.settings import Settings
from tests.helpers import assert_problem, bearer

pytestmark = pytest.mark.anyio

# --- who may call what ---------------------------------------------------------------------------------

ANY_ROLE = {"producer", "worker", "viewer"}  # and admin: admins are admitted everywhere
OPEN = "open"  # no token needed
SQS = "sqs"  # AWS Signature Version 4 instead of a bearer token: tests/sqs/test_auth.py

# The decision for every route of the app: the roles admitted besides admin. A route added without a
# line here fails test_every_route_has_a_decision.
DECISIONS: dict[tuple[str, str], set[str] | str] = {
    ("POST", "/jobs"): {"producer"},
    ("POST", "/jobs/batch"): {"producer"},
    ("GET", "/jobs/{id}"): {"producer", "worker", "viewer"},
    ("GET", "/jobs/{id}/parents"): {"producer", "worker", "viewer"},
    ("DELETE", "/jobs/{id}"): set(),
    ("POST", "/workflows"): {"producer"},
    ("GET", "/workflows"): {"producer", "worker", "viewer"},
    ("GET", "/workflows/{id}"): {"producer", "worker", "viewer"},
    ("DELETE", "/workflows/{id}"): set(),
    ("POST", "/workflows/{id}/retry"): set(),
    ("POST", "/jobs/{id}/run"): set(),
    ("GET", "/workers"): {"viewer"},
    ("GET", "/ui/workers"): {"viewer"},
    ("POST", "/lease"): {"worker"},
    ("POST", "/ack"): {"worker"},
    ("POST", "/ack/batch"): {"worker"},
    ("POST", "/nack"): {"worker"},
    ("POST", "/nack/batch"): {"worker"},
    ("POST", "/extend"): {"worker"},
    ("POST", "/release"): {"worker"},
    ("POST", "/jobs/{id}/steps"): {"worker"},
    ("POST", "/jobs/{id}/await"): {"worker"},
    ("POST", "/events"): {"producer", "worker"},
    ("GET", "/events"): {"producer", "worker", "viewer"},
    ("GET", "/dead"): {"viewer"},
    ("GET", "/jobs"): {"viewer"},
    ("POST", "/dead/retry"): set(),
    ("DELETE", "/dead/{id}"): set(),
    ("GET", "/queues"): {"viewer"},
    ("GET", "/queues/{queue}"): {"viewer", "worker"},
    ("PATCH", "/queues/{queue}"): set(),
    ("POST", "/queues/{queue}/push/secret"): set(),
    ("POST", "/queues/{queue}/pause"): set(),
    ("POST", "/queues/{queue}/resume"): set(),
    ("GET", "/queues/{queue}/keys"): {"viewer", "worker"},
    ("GET", "/queues/{queue}/keys/{key:key}"): {"viewer", "worker"},
    ("PUT", "/queues/{queue}/keys/{key:key}"): set(),
    ("DELETE", "/queues/{queue}/keys/{key:key}"): set(),
    ("GET", "/schedules"): {"producer", "worker", "viewer"},
    ("GET", "/schedules/{name}"): {"producer", "worker", "viewer"},
    ("PUT", "/schedules/{name}"): set(),
    ("DELETE", "/schedules/{name}"): set(),
    ("POST", "/schedules/{name}/pause"): set(),
    ("POST", "/schedules/{name}/resume"): set(),
    ("POST", "/schedules/{name}/trigger"): set(),
    ("GET", "/healthz"): OPEN,
    ("GET", "/readyz"): OPEN,
    ("GET", "/metrics"): {"viewer"},
    ("GET", "/openapi.json"): ANY_ROLE,
    ("GET", "/docs"): ANY_ROLE,
    ("GET", "/docs/oauth2-redirect"): ANY_ROLE,
    ("GET", "/redoc"): ANY_ROLE,
    ("GET", "/docs/assets/5.35.0/{name}"): ANY_ROLE,
    ("GET", "/ui"): {"viewer"},
    ("GET", "/ui/dead"): {"viewer"},
    ("GET", "/ui/jobs"): {"viewer"},
    ("GET", "/ui/jobs/{id}"): {"viewer"},
    ("GET", "/ui/queues/{queue}"): {"viewer"},
    ("POST", "/ui/jobs/{id}/cancel"): set(),
    ("POST", "/ui/jobs/{id}/run"): set(),
    ("POST", "/ui/jobs/selected"): set(),
    ("POST", "/ui/jobs/matching"): set(),
    ("POST", "/ui/queues/{queue}/settings"): set(),
    ("GET", "/ui/static/{name}"): OPEN,  # the sign-in form's stylesheet and script
    ("GET", "/ui/sign-in"): OPEN,
    ("POST", "/ui/sign-in"): OPEN,
    ("POST", "/ui/sign-out"): OPEN,
    ("POST", "/ui/queues/{queue}/pause"): set(),
    ("POST", "/ui/queues/{queue}/resume"): set(),
    ("POST", "/ui/queues/{queue}/retry-dead"): set(),
    ("POST", "/ui/dead/{id}/retry"): set(),
    ("POST", "/ui/dead/{id}/purge"): set(),
    ("GET", "/ui/schedules"): {"viewer"},
    ("GET", "/ui/queues/{queue}/keys"): {"viewer"},
    ("POST", "/ui/schedules/{name}/pause"): set(),
    ("POST", "/ui/schedules/{name}/resume"): set(),
    ("POST", "/ui/schedules/{name}/trigger"): set(),
    ("GET", "/ui/workflows"): {"viewer"},
    ("GET", "/ui/workflows/{id}"): {"viewer"},
    ("POST", "/ui/workflows/{id}/cancel"): set(),
    ("POST", "/ui/workflows/{id}/retry"): set(),
    ("POST", "/"): SQS,
    ("POST", "/{account:int}/{queue}"): SQS,  # the Query protocol at a queue's URL
    ("GET", "/"): SQS,  # the Query protocol over GET
    ("GET", "/{account:int}/{queue}"): SQS,
    ("POST", "/queue/{region}/{account:int}/{queue}"): SQS,  # a queue's URL in another region than the first
    ("GET", "/queue/{region}/{account:int}/{queue}"): SQS,
}
ROLE_TOKENS = {f"t-{role}": role for role in ("producer", "worker", "viewer", "admin")}
PATH_VALUES = {"{id}": "1", "{queue}": "q", "{name}": "ui.js"}


def app_routes(app) -> set[tuple[str, str]]:
    """Every (method, path) the app answers, through the routers it includes."""
    from fastapi.routing import iter_route_contexts

    return {
        (method, route.path)
        for route in iter_route_contexts(app.routes)
        for method in route.methods or ()
        if method != "HEAD"
    }


async def test_every_route_has_a_decision(start_service):
    """Each route against each role (unscoped tokens) and no token: admitted roles get past the check
    (any answer but 401 and 403: bodies are empty, so most answers are 422), the others get 403, and
    no token gets 401, except on the open routes."""
    service = start_service(tokens=ROLE_TOKENS)
    routes = app_routes(service.app)
    assert routes == DECISIONS.keys(), (
        f"routes without a decision: {sorted(routes - DECISIONS.keys())}; "
        f"decisions without a route: {sorted(DECISIONS.keys() - routes)}"
    )
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as http:
        for (method, template), decision in sorted(DECISIONS.items()):
            if decision == SQS:
                continue
            path = template
            for name, value in PATH_VALUES.items():
                path = path.replace(name, value)
            body = {"json": {}} if method in ("POST", "PATCH") and not path.startswith("/ui") else {}
            anonymous = await http.request(method, path, **body)
            if decision == OPEN:
                assert anonymous.status_code not in (401, 403), (method, template)
                continue
            assert_problem(anonymous, 401, "unauthorized")
            for token, role in ROLE_TOKENS.items():
                r = await http.request(method, path, headers=bearer(token), **body)
                if role == "admin" or role in decision:
                    assert r.status_code not in (401, 403), (method, template, role, r.text)
                else:
                    assert r.status_code == 403, (method, template, role, r.status_code)
                    assert_problem(r, 403, "forbidden")


async def test_viewer_reads_docs_and_metrics(start_service):
    service = start_service(tokens=ROLE_TOKENS)
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as http:
        for path in ("/docs", "/openapi.json", "/docs/assets/5.35.0/swagger-ui-bundle.js"):
            assert_problem(await http.get(path), 401, "unauthorized")
            assert (await http.get(path, headers=bearer("t-producer"))).status_code == 200
        viewer = bearer("t-viewer")
        document = await http.get("/openapi.json", headers=viewer)
        assert document.status_code == 200
        assert document.json() == service.app.openapi()
        docs = await http.get("/docs", headers=viewer)
        assert docs.status_code == 200 and "swagger-ui" in docs.text and "/openapi.json" in docs.text
        redoc = await http.get("/redoc", headers=viewer)
        assert redoc.status_code == 308 and redoc.headers["location"] == "/docs"
        metrics = await http.get("/metrics", headers=viewer)
        assert metrics.status_code == 200 and "jobq_http_requests_total" in metrics.text
        assert (await http.get("/queues", headers=viewer)).status_code == 200
        assert_problem(await http.post("/queues/q/pause", headers=viewer), 403, "forbidden")
        assert_problem(
            await http.post("/jobs", json={"queue": "q", "payload": 1}, headers=viewer), 403, "forbidden"
        )


async def test_docs_stay_open_without_tokens(client):
    for path in ("/docs", "/openapi.json", "/docs/oauth2-redirect"):
        assert (await client.get(path)).status_code == 200, path
    assert (await client.get("/redoc")).status_code == 308


async def test_docs_load_nothing_from_elsewhere(client):
    """/docs names only the service's own files (Swagger UI ships in the package), each served with its
    type: the page works with no internet."""
    page = (await client.get("/docs")).text
    linked = re.findall(r"""(?:src|href)=["']([^"']+)["']|url: ?["']([^"']+)["']""", page)
    urls = {a or b for a, b in linked}
    assert urls and not [u for u in urls if "//" in u], urls
    types = {".js": "text/javascript", ".css": "text/css", ".png": "image/png", ".json": "application/json"}
    for url in urls:
        r = await client.get(url)
        assert r.status_code == 200, url
        assert r.headers["content-type"].startswith(types[url[url.rindex(".") :]]), url
    assert (await client.get("/docs/assets/5.35.0/nothing.js")).status_code == 404


# --- tokens limited to queues ----------------------------------------------------------------------------

PATTERNS = ["celery-*", "team_a.?"]
SCOPED = {
    "t-admin": "admin",
    # A producer, worker and viewer of its own queues; and an admin of the same queues.
    "t-scoped": {"roles": ["producer", "worker", "viewer"], "queues": PATTERNS},
    "t-scoped-admin": {"role": "admin", "queues": PATTERNS},
}


async def _dead(http, queue: str) -> int:
    admin = bearer("t-admin")
    job = (
        await http.post("/jobs", json={"queue": queue, "payload": "d", "max_attempts": 1}, headers=admin)
    ).json()
    (leased,) = (await http.post("/lease", json={"queue": queue}, headers=admin)).json()["jobs"]
    r = await http.post("/nack", json={"id": job["id"], "lease_token": leased["lease_token"]}, headers=admin)
    assert r.json()["status"] == "dead"
    return job["id"]


@pytest.fixture
async def scoped(start_service, db):
    """A service with scoped tokens, and jobs: in `native` and `teamXa.1` (outside the patterns: `_` in a
    pattern is no wildcard), and in `celery-a` and `team_a.1` (inside), one pending and one dead each."""
    service = start_service(tokens=SCOPED)
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as http:
        jobs: dict[str, dict[str, int]] = {}
        for queue in ("native", "teamXa.1", "celery-a", "team_a.1"):
            dead = await _dead(http, queue)
            r = await http.post("/jobs", json={"queue": queue, "payload": "p"}, headers=bearer("t-admin"))
            jobs[queue] = {"pending": r.json()["id"], "dead": dead}
        yield http, jobs


async def _snapshot(db) -> list[tuple]:
    rows = await db.fetch("SELECT id, queue, status, attempts FROM jobq.all_jobs ORDER BY id")
    queues = await db.fetch("SELECT name, paused, max_attempts FROM jobq.queues ORDER BY name")
    return [tuple(r) for r in rows] + [tuple(q) for q in queues]


def _refused(r: httpx.Response) -> None:
    body = assert_problem(r, 403, "forbidden")
    assert "celery-*" in body["detail"] and "team_a.?" in body["detail"], body
    assert body["allowed_queues"] == PATTERNS


async def test_scoped_tokens_are_refused_outside_their_patterns(scoped, db):
    http, jobs = scoped
    before = await _snapshot(db)
    user, admin = bearer("t-scoped"), bearer("t-scoped-admin")
    for outside in ("native", "teamXa.1"):
        # Calls that name the queue: 403 forbidden, naming the patterns.
        _refused(await http.post("/jobs", json={"queue": outside, "payload": 1}, headers=user))
        batch = {"jobs": [{"queue": "celery-a", "payload": 1}, {"queue": outside, "payload": 2}]}
        _refused(await http.post("/jobs/batch", json=batch, headers=user))
        _refused(await http.post("/lease", json={"queue": outside}, headers=user))
        _refused(await http.get(f"/queues/{outside}", headers=user))
        _refused(await http.get("/dead", params={"queue": outside}, headers=user))
        _refused(await http.get("/jobs", params={"queue": outside}, headers=user))
        _refused(await http.post("/dead/retry", json={"queue": outside}, headers=admin))
        _refused(
            await http.post(
                "/dead/retry", json={"queue": outside, "ids": [jobs[outside]["dead"]]}, headers=admin
            )
        )
        _refused(await http.patch(f"/queues/{outside}", json={"max_attempts": 9}, headers=admin))
        _refused(await http.post(f"/queues/{outside}/pause", headers=admin))
        _refused(await http.post(f"/queues/{outside}/resume", headers=admin))
        # Calls that name a job of the queue: as if it were not there.
        pending, dead = jobs[outside]["pending"], jobs[outside]["dead"]
        for token in (user, admin):
            assert_problem(await http.get(f"/jobs/{pending}", headers=token), 404, "not_found")
        assert_problem(await http.delete(f"/jobs/{pending}", headers=admin), 404, "not_found")
        assert_problem(await http.delete(f"/dead/{dead}", headers=admin), 404, "not_found")
        r = await http.post("/dead/retry", json={"ids": [dead]}, headers=admin)
        assert r.status_code == 200 and r.json() == {"retried": 0, "skipped": []}
    # The same through FastAPI's own routing (another JSON media type; tests/http/test_fastpath_hot.py does
    # every hot route both ways), where the same endpoint checks the queue.
    routed = {**user, "Content-Type": "application/x-test+json"}
    _refused(await http.post("/jobs", content=b'{"queue": "native", "payload": 1}', headers=routed))
    assert await _snapshot(db) == before


async def test_scoped_tokens_work_inside_their_patterns(scoped, db):
    http, jobs = scoped
    user, admin = bearer("t-scoped"), bearer("t-scoped-admin")
    r = await http.post("/jobs", json={"queue": "celery-b", "payload": 1}, headers=user)
    assert r.status_code == 201
    batch = {"jobs": [{"queue": "celery-b", "payload": 2}, {"queue": "team_a.1", "payload": 3}]}
    assert (await http.post("/jobs/batch", json=batch, headers=user)).status_code == 201
    leased = (await http.post("/lease", json={"queue": "celery-a", "max_jobs": 5}, headers=user)).json()[
        "jobs"
    ]
    assert [job["id"] for job in leased] == [jobs["celery-a"]["pending"]]
    ack = {"id": leased[0]["id"], "lease_token": leased[0]["lease_token"]}
    assert (await http.post("/ack", json=ack, headers=user)).status_code == 200
    assert (await http.get(f"/jobs/{jobs['team_a.1']['pending']}", headers=user)).status_code == 200
    assert (await http.get("/queues/celery-a", headers=user)).status_code == 200

    # Listings show the admitted queues only.
    listed = (await http.get("/queues", headers=user)).json()
    assert [row["queue"] for row in listed] == ["celery-a", "celery-b", "team_a.1"]
    dead = (await http.get("/dead", headers=user)).json()["jobs"]
    assert sorted(job["queue"] for job in dead) == ["celery-a", "team_a.1"]
    listed = (await http.get("/jobs", headers=user)).json()["jobs"]
    assert {job["queue"] for job in listed} == {"celery-a", "celery-b", "team_a.1"}
    assert_problem(await http.get("/metrics", headers=user), 403, "forbidden")  # covers every queue

    # The scoped admin administers its queues.
    assert (await http.post("/queues/celery-a/pause", headers=admin)).status_code == 200
    r = await http.post(
        "/dead/retry", json={"ids": [jobs["celery-a"]["dead"], jobs["native"]["dead"]]}, headers=admin
    )
    assert r.json() == {"retried": 1, "skipped": []}
    assert (await http.delete(f"/dead/{jobs['team_a.1']['dead']}", headers=admin)).json()["purged"] is True
    assert (await http.delete(f"/jobs/{jobs['team_a.1']['pending']}", headers=admin)).status_code == 200
    states = dict(await db.fetch("SELECT id, status FROM jobq.all_jobs"))
    assert states[jobs["native"]["dead"]] == "dead" and states[jobs["celery-a"]["dead"]] == "pending"
    assert jobs["team_a.1"]["dead"] not in states
    assert states[jobs["team_a.1"]["pending"]] == "cancelled"
    assert await db.fetchval("SELECT paused FROM jobq.queues WHERE name = 'celery-a'") is True


async def test_dashboard_of_a_scoped_token_shows_its_queues(scoped):
    http, jobs = scoped
    user = bearer("t-scoped")
    page = (await http.get("/ui", headers=user)).text
    assert 'data-queue="celery-a"' in page and 'data-queue="team_a.1"' in page
    assert 'data-queue="native"' not in page and "teamXa.1" not in page
    dead = (await http.get("/ui/dead", headers=user)).text
    assert f'data-job="{jobs["celery-a"]["dead"]}"' in dead and "native" not in dead
    assert (await http.get(f"/ui/jobs/{jobs['native']['dead']}", headers=user)).status_code == 404
    admin = bearer("t-scoped-admin")
    assert (await http.post("/ui/queues/native/pause", headers=admin)).status_code == 403


# --- configuration -----------------------------------------------------------------------------------------


def test_token_forms(tmp_path, monkeypatch):
    from app.core.access import Role, Tokens

    path = tmp_path / "tokens"
    path.write_text("# roles token queues\nadmin file-admin\nproducer,worker file-celery celery-*,emails\n")
    monkeypatch.setenv(
        "JOBQ_TOKENS",
        '{"plain": "viewer", "one": {"role": "producer"}, '
        '"several": {"roles": ["producer", "worker"], "queues": ["celery-*"]}}',
    )
    monkeypatch.setenv(
        "JOBQ_AWS_CREDENTIALS",
        '{"AKIAOLD": {"secret": "s1", "role": "worker"}, '
        '"AKIACELERY": {"secret": "s2", "roles": ["producer", "worker"], "queues": ["celery-*"]}}',
    )
    monkeypatch.setenv("JOBQ_TOKENS_FILE", str(path))
    settings = Settings()
    tokens = Tokens.load(settings.tokens, settings.tokens_file)
    grants = {t: tokens.grant_of(t) for t in ("plain", "one", "several", "file-admin", "file-celery")}
    assert grants["plain"].roles == {Role.VIEWER} and grants["plain"].queues is None
    assert grants["one"].roles == {Role.PRODUCER}
    assert grants["several"].roles == {Role.PRODUCER, Role.WORKER}
    assert grants["several"].queues == ("celery-*",)
    assert grants["file-admin"].roles == {Role.ADMIN} and grants["file-admin"].queues is None
    assert grants["file-celery"].queues == ("celery-*", "emails")
    assert tokens.grant_of("nobody") is None
    celery = settings.aws_credentials["AKIACELERY"].grant
    assert celery.roles == {Role.PRODUCER, Role.WORKER} and celery.admits("celery-x")
    assert not celery.admits("native")
    assert settings.aws_credentials["AKIAOLD"].grant.roles == {Role.WORKER}


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        ({"s3cr3t-token": "reader"}, "producer, worker, viewer, admin"),
        ({"s3cr3t-token": {"roles": []}}, "at least one role"),
        ({"s3cr3t-token": {"role": "admin", "roles": ["admin"]}}, "either"),
        ({"s3cr3t-token": {}}, "a role"),
        ({"s3cr3t-token": {"role": "admin", "queues": ["bad name"]}}, "queue pattern"),
        ({"s3cr3t-token": {"role": "admin", "queues": ["a[b]"]}}, "queue pattern"),
        ({"s3cr3t-token": {"role": "admin", "queues": []}}, "at least one pattern"),
        ({"s3cr3t-token": {"role": "admin", "queue": ["a"]}}, "queue"),
    ],
)
def test_bad_tokens_are_refused_at_start_up_without_showing_them(tokens, message):
    with pytest.raises(ValidationError) as exc:
        Settings(tokens=tokens)
    text = str(exc.value)
    assert message in text and "entry 1" in text
    assert "s3cr3t" not in text


def test_bad_credentials_and_token_file_lines_are_refused(tmp_path):
    from app.core.access import Tokens

    with pytest.raises(ValidationError) as exc:
        Settings(
            aws_credentials={"AKIAX": {"secret": "hidden-secret", "roles": ["admin"], "queues": ["*/x"]}}
        )
    assert "AKIAX" in str(exc.value) and "queue pattern" in str(exc.value)
    assert "hidden-secret" not in str(exc.value)
    for line, message in (
        ("reader sometoken", "producer, worker, viewer, admin"),
        ("admin", "expected"),
        ("admin sometoken a,,b", "queue pattern"),
        ("admin sometoken a b", "expected"),
    ):
        path = tmp_path / "tokens"
        path.write_text(f"# comment\n{line}\n")
        with pytest.raises(ValueError, match=r"tokens:2: ") as exc:
            Tokens.load({}, path)
        assert message in str(exc.value) and "sometoken" not in str(exc.value)


def test_patterns_match_like_globs_and_are_cached():
    from app.core.access import Grant, Role

    grant = Grant({Role.WORKER}, ["celery-*", "a_b.?"])
    assert grant.admits("celery-") and grant.admits("celery-tasks") and grant.admits("a_b.1")
    assert not grant.admits("celery") and not grant.admits("axb.1") and not grant.admits("a_b.12")
    assert grant.like == ["celery-%", "a\\_b._"]
    assert Grant({Role.ADMIN}, None).like is None
    for n in range(3 * Grant.MAX_CACHED):  # a client naming endless queues cannot grow the cache
        grant.admits(f"q{n}")
    assert len(grant._cached) <= Grant.MAX_CACHED


async def test_scoped_tokens_name_and_see_parents_and_workflows_only_in_their_queues(scoped):
    """A child carries its parents' results, so a scoped token may name only parents in its queues (any
    other is as unknown), pages only those, and lists only the workflows whose jobs are all in them."""
    http, jobs = scoped
    user, admin = bearer("t-scoped"), bearer("t-admin")
    outside, inside = jobs["native"]["pending"], jobs["celery-a"]["pending"]
    body = {"queue": "celery-b", "payload": 1, "depends_on": [inside, outside]}
    r = await http.post("/jobs", json=body, headers=user)
    assert (
        assert_problem(r, 422, "validation_error")["detail"]
        == f"depends_on names jobs that do not exist: {outside}"
    )
    made = {"jobs": [{"ref": "a", "queue": "celery-b", "payload": 1, "depends_on": [outside]}]}
    assert_problem(await http.post("/workflows", json=made, headers=user), 422, "validation_error")
    assert (await http.post("/jobs", json={**body, "depends_on": [inside]}, headers=user)).status_code == 201
    child = (await http.post("/jobs", json=body, headers=admin)).json()
    seen = (await http.get(f"/jobs/{child['id']}/parents", headers=user)).json()
    assert [p["id"] for p in seen["parents"]] == [inside]
    seen = (await http.get(f"/jobs/{child['id']}/parents", headers=user, params={"limit": 1})).json()
    assert ([p["id"] for p in seen["parents"]], seen["next_after_id"]) == ([inside], None)
    mixed = {
        "jobs": [
            {"ref": "a", "queue": "celery-b", "payload": 1},
            {"ref": "b", "queue": "native", "payload": 1},
        ]
    }
    hidden = (await http.post("/workflows", json=mixed, headers=admin)).json()["id"]
    own = (await http.post("/workflows", json={"jobs": mixed["jobs"][:1]}, headers=user)).json()["id"]
    listed = (await http.get("/workflows", headers=user)).json()["workflows"]
    assert [w["id"] for w in listed] == [own]
    assert {w["id"] for w in (await http.get("/workflows", headers=admin)).json()["workflows"]} == {
        own,
        hidden,
    }
