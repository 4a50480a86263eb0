"""The dashboard's workflow pages (app/ui/routes/workflows.py, app/ui/graph.py) and a job's parents and
children on its page, over HTTP against a live service, without a browser: the list and its filters, the
graph (one node per job, coloured by its status, linked to its page), escaping, and the Cancel and Retry
buttons with the session and cross-site checks every button has. tests/system/test_ui_workflows.py clicks
through them in Chromium."""

from __future__ import annotations

import re

import httpx
import pytest

from app.ui import graph
from app.ui.routes import workflows as workflow_routes
from tests.helpers import bearer, enqueue, lease_one
from tests.http.test_ui_session import BROWSER, signed_in

pytestmark = pytest.mark.anyio

SAME_ORIGIN = {"Sec-Fetch-Site": "same-origin"}
TOKENS = {"a-secret": "admin", "v-secret": "viewer", "mail": {"roles": ["admin"], "queues": ["mail-*"]}}
# A node of the graph: its status (its class), its job and ref.
NODE = re.compile(r'<a class="node ([a-z]+)" href="/ui/jobs/(\d+)" data-job="(\d+)" data-ref="([^"]*)"')
EDGE = re.compile(r'<path class="edge" data-from="(\d+)" data-to="(\d+)"')


def order(name: str = "order-7", prefix: str = "") -> dict:
    """A charge (one attempt) and a render, then a send after both; their queues' names start with
    `prefix`."""
    return {
        "name": name,
        "jobs": [
            {
                "ref": "charge",
                "queue": f"{prefix}payments",
                "kind": "charge",
                "payload": 7,
                "max_attempts": 1,
            },
            {"ref": "render", "queue": f"{prefix}pdf", "payload": 7},
            {"ref": "send", "queue": f"{prefix}emails", "payload": 7, "depends_on": ["charge", "render"]},
        ],
    }


async def make(client: httpx.AsyncClient, body: dict) -> dict:
    r = await client.post("/workflows", json=body)
    assert r.status_code == 201, r.text
    return r.json()


async def end(client: httpx.AsyncClient, queue: str, *, fail: bool = False) -> dict:
    """Lease the queue's one ready job and ack it, or nack it (dead: one attempt)."""
    job = await lease_one(client, queue)
    token = {"id": job["id"], "lease_token": job["lease_token"]}
    r = (
        await client.post("/nack", json=token | {"error": "declined"})
        if fail
        else await client.post("/ack", json=token)
    )
    assert r.is_success, r.text
    return job


async def workflow(client: httpx.AsyncClient, workflow_id: int) -> dict:
    r = await client.get(f"/workflows/{workflow_id}")
    assert r.status_code == 200, r.text
    return r.json()


def nodes(page: str) -> dict[str, tuple[int, str]]:
    """The graph's nodes: ref -> (job id, status class), each link naming the job it opens."""
    found = {}
    for status, href_id, job_id, ref in NODE.findall(page):
        assert href_id == job_id
        found[ref] = (int(job_id), status)
    return found


async def test_the_list_newest_first_filtered_and_paged(client, monkeypatch):
    first = await make(client, order("nightly"))
    second = await make(client, order("order-8", "b-"))
    third = await make(client, order("nightly", "c-"))
    await end(client, "b-payments", fail=True)
    await end(client, "b-pdf")
    await workflow(client, second["id"])  # read: its status, failed, kept for the list

    page = await client.get("/ui/workflows")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<a href="/ui/workflows">Workflows</a>' in page.text  # in the navigation, on every page
    listed = [int(i) for i in re.findall(r'data-workflow="(\d+)"', page.text)]
    assert listed == [third["id"], second["id"], first["id"]]
    assert f'<a href="/ui/workflows/{first["id"]}">nightly</a>' in page.text

    by_name = await client.get("/ui/workflows", params={"name": "nightly", "status": ""})
    assert re.findall(r'data-workflow="(\d+)"', by_name.text) == [str(third["id"]), str(first["id"])]
    failed = await client.get("/ui/workflows", params={"status": "failed", "name": ""})
    assert re.findall(r'data-workflow="(\d+)"', failed.text) == [str(second["id"])]
    assert '<option value="failed" selected>' in failed.text
    none = await client.get("/ui/workflows", params={"status": "completed"})
    assert "No workflows match." in none.text

    monkeypatch.setattr(workflow_routes, "WORKFLOWS_PAGE_SIZE", 2)
    page = await client.get("/ui/workflows", params={"name": "nightly"})
    assert re.findall(r'data-workflow="(\d+)"', page.text) == [str(third["id"]), str(first["id"])]
    assert 'rel="next"' not in page.text
    page = await client.get("/ui/workflows")
    assert re.findall(r'data-workflow="(\d+)"', page.text) == [str(third["id"]), str(second["id"])]
    older = re.search(r'<a rel="next" href="([^"]+)">', page.text)[1].replace("&amp;", "&")
    assert older == f"/ui/workflows?before_id={second['id']}"
    page = await client.get(older)
    assert re.findall(r'data-workflow="(\d+)"', page.text) == [str(first["id"])]
    assert 'rel="next"' not in page.text

    assert (await client.get("/ui/workflows", params={"status": "sleeping"})).status_code == 422


async def test_the_graph_has_a_node_per_job_coloured_by_its_status(client):
    made = await make(client, order())
    ids = {job["ref"]: job["id"] for job in made["jobs"]}
    await end(client, "payments")
    page = await client.get(f"/ui/workflows/{made['id']}")
    assert page.status_code == 200
    text = page.text
    assert "<h1>Workflow " + str(made["id"]) + ": order-7</h1>" in text
    assert nodes(text) == {
        "charge": (ids["charge"], "completed"),
        "render": (ids["render"], "pending"),
        "send": (ids["send"], "waiting"),
    }
    assert text.count('<a class="node ') == 3
    assert sorted(EDGE.findall(text)) == sorted(
        [(str(ids["charge"]), str(ids["send"])), (str(ids["render"]), str(ids["send"]))]
    )
    assert re.search(r'data-ref="send" data-layer="1">', text) and 'data-ref="charge" data-layer="0"' in text
    assert f"<title>send: job {ids['send']}, waiting</title>" in text
    assert re.search(r'class="status running">running</span>', text)
    assert "3: " in text and '<span class="status completed">completed</span> 1' in text
    # Running: Cancel, not Retry; and the page refreshes itself.
    assert f'action="/ui/workflows/{made["id"]}/cancel?next=' in text
    assert f"/ui/workflows/{made['id']}/retry" not in text
    assert 'data-refresh="5"' in text
    # The jobs table names each job's parents by ref.
    assert "<code>charge</code>, <code>render</code>" in text

    missing = await client.get("/ui/workflows/987654321")
    assert missing.status_code == 404 and "workflow 987654321 does not exist" in missing.text


async def test_a_jobs_page_shows_its_parents_children_run_if_and_workflow(client):
    made = await make(client, order())
    ids = {job["ref"]: job["id"] for job in made["jobs"]}
    await end(client, "payments")

    send = (await client.get(f"/ui/jobs/{ids['send']}")).text
    assert f'<a href="/ui/workflows/{made["id"]}">workflow {made["id"]}</a>' in send
    assert "<tr><th>Run if</th><td>completed</td></tr>" in send
    parents = send[send.index("<h2>Parents</h2>") :]
    assert "2 parents; it runs once every parent completed" in parents
    assert re.search(rf'<tr data-job="{ids["charge"]}">.*?class="status completed">completed<', parents)
    assert re.search(rf'<tr data-job="{ids["render"]}">.*?class="status pending">pending<', parents)
    assert f'<a href="/ui/jobs/{ids["charge"]}">' in parents
    assert "<h2>Children</h2>" not in send
    # A waiting job can be cancelled from its page, as DELETE /jobs/{id} cancels it.
    assert f'action="/ui/jobs/{ids["send"]}/cancel?next=' in send

    # The charge has ended: its child is found through its workflow; the render has not: through its edge.
    for ref in ("charge", "render"):
        shown = (await client.get(f"/ui/jobs/{ids[ref]}")).text
        children = shown[shown.index("<h2>Children</h2>") :]
        assert re.search(rf'<tr data-job="{ids["send"]}">.*?class="status waiting">waiting<', children), ref
        assert "<h2>Parents</h2>" not in shown and "<tr><th>Run if</th><td>—</td></tr>" in shown

    # A job outside any workflow: its waiting children, while it has not ended.
    parent = await enqueue(client, "solo")
    child = await enqueue(client, "solo", depends_on=[parent["id"]], run_if="finished")
    shown = (await client.get(f"/ui/jobs/{parent['id']}")).text
    assert f'<tr data-job="{child["id"]}">' in shown and "<tr><th>Workflow</th><td>—</td></tr>" in shown
    shown = (await client.get(f"/ui/jobs/{child['id']}")).text
    assert "1 parent; it runs once every parent ended, however they ended." in shown


async def test_past_a_hundred_parents_or_children_the_first_hundred_are_shown(client):
    r = await client.post("/jobs/batch", json={"jobs": [{"queue": "many", "payload": i} for i in range(101)]})
    assert r.status_code == 201, r.text
    parents = [job["id"] for job in r.json()["jobs"]]
    child = await enqueue(client, "fan-in", depends_on=parents)
    shown = (await client.get(f"/ui/jobs/{child['id']}")).text
    section = shown[shown.index("<h2>Parents</h2>") :]
    assert "101 parents;" in section and "The first 100 are shown" in section
    assert f"after_id={parents[99]}" in section
    assert section.count("<tr data-job=") == 100 and f'data-job="{parents[100]}"' not in section

    r = await client.post(
        "/jobs/batch",
        json={"jobs": [{"queue": "fan-out", "payload": i, "depends_on": [parents[0]]} for i in range(101)]},
    )
    assert r.status_code == 201, r.text
    shown = (await client.get(f"/ui/jobs/{parents[0]}")).text
    section = shown[shown.index("<h2>Children</h2>") :]
    assert "The first 100 are shown." in section
    # The fan-in child and the first 99 of the fan-out, in id order.
    assert section.count("<tr data-job=") == 100 and f'<tr data-job="{child["id"]}">' in section


async def test_hostile_names_and_refs_are_escaped(client):
    hostile = "<script>alert(1)</script>"
    ref = '"><img src=x onerror=alert(2)></svg>'
    body = {
        "name": hostile,
        "jobs": [
            {"ref": ref, "queue": "q", "payload": {"x": "<b>"}},
            {"ref": "</text><script>alert(3)</script>", "queue": "q", "payload": 1, "depends_on": [ref]},
        ],
    }
    made = await make(client, body)
    for path in ("/ui/workflows", f"/ui/workflows/{made['id']}"):
        r = await client.get(path)
        assert r.status_code == 200, path
        assert "<script>alert" not in r.text and "<img src=x" not in r.text, path
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in r.text, path
    page = (await client.get(f"/ui/workflows/{made['id']}")).text
    assert page.count('<a class="node ') == 2
    assert 'data-ref="&quot;&gt;&lt;img src=x onerror=alert(2)&gt;&lt;/svg&gt;"' in page
    assert "&lt;/text&gt;&lt;script&gt;alert(3)&lt;/script&gt;" in page
    assert page.count("</svg>") == page.count("<svg")


async def test_cancel_and_retry_need_an_admin_session_from_this_site(start_service):
    service = start_service(tokens=TOKENS)
    async with httpx.AsyncClient(base_url=service.url, headers=bearer("a-secret"), timeout=30) as api:
        running = await make(api, order("run", "r-"))
        failing = await make(api, order("fail", "f-"))
        await end(api, "r-payments")
        await end(api, "f-payments", fail=True)
        await end(api, "f-pdf")
        assert (await workflow(api, failing["id"]))["status"] == "failed"
        other = await make(api, order("mail", "mail-"))
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as http:
        admin = await signed_in(http, "a-secret")
        viewer = await signed_in(http, "v-secret")
        scoped = await signed_in(http, "mail")
        http.cookies.clear()  # each request below says which session it is of, if any
        cancel = f"/ui/workflows/{running['id']}/cancel?next=/ui/workflows/{running['id']}"
        retry = f"/ui/workflows/{failing['id']}/retry?next=/ui/workflows/{failing['id']}"

        # The buttons are on the admin's pages where they apply, and on no viewer's.
        page = (await http.get(f"/ui/workflows/{failing['id']}", headers=admin)).text
        assert f'action="/ui/workflows/{failing["id"]}/retry?next=' in page and "/cancel?" not in page
        for workflow_id in (running["id"], failing["id"]):
            page = await http.get(f"/ui/workflows/{workflow_id}", headers=viewer)
            assert page.status_code == 200 and 'method="post" action="/ui/workflows' not in page.text
        # Refused: no session (a program: 401; a browser: to the sign-in form, the press not carried out),
        # a viewer, another site's form, a token whose queues do not hold every job of it.
        assert (await http.post(cancel)).status_code == 401
        r = await http.post(cancel, headers={**BROWSER, **SAME_ORIGIN})
        assert r.status_code == 303 and r.headers["location"].startswith("/ui/sign-in?next=")
        assert (await http.post(cancel, headers={**viewer, **SAME_ORIGIN})).status_code == 403
        assert (await http.post(retry, headers={**viewer, **SAME_ORIGIN})).status_code == 403
        for elsewhere in ({"Sec-Fetch-Site": "cross-site"}, {"Origin": "https://evil.example"}):
            assert (await http.post(cancel, headers={**admin, **elsewhere})).status_code == 403
            assert (await http.post(retry, headers={**admin, **elsewhere})).status_code == 403
        r = await http.post(cancel, headers={**scoped, **SAME_ORIGIN})
        assert r.status_code == 303 and "does+not+exist" in r.headers["location"]
        assert (await http.get(f"/ui/workflows/{running['id']}", headers=scoped)).status_code == 404
        assert (await http.get(f"/ui/workflows/{other['id']}", headers=scoped)).status_code == 200
        async with httpx.AsyncClient(base_url=service.url, headers=bearer("a-secret")) as api:
            assert (await workflow(api, running["id"]))["status"] == "running"
            assert (await workflow(api, failing["id"]))["status"] == "failed"

        # Pressed by an admin: back to the workflow's page with a notice, and done.
        r = await http.post(cancel, headers={**admin, **SAME_ORIGIN})
        assert r.status_code == 303
        assert r.headers["location"].startswith(f"/ui/workflows/{running['id']}?flash=Cancelled+workflow")
        r = await http.post(retry, headers={**admin, **SAME_ORIGIN})
        assert r.status_code == 303
        assert r.headers["location"].startswith(f"/ui/workflows/{failing['id']}?flash=Retried+workflow")
        async with httpx.AsyncClient(base_url=service.url, headers=bearer("a-secret")) as api:
            cancelled = await workflow(api, running["id"])
            assert cancelled["status"] == "cancelled"
            assert {j["ref"]: j["status"] for j in cancelled["jobs"]} == {
                "charge": "completed",
                "render": "cancelled",
                "send": "cancelled",
            }
            resumed = await workflow(api, failing["id"])
            assert resumed["status"] == "running"
            assert {j["ref"]: j["status"] for j in resumed["jobs"]}["charge"] == "pending"

        # Pressed again, on a page shown before: each says why it does nothing.
        r = await http.post(cancel, headers={**admin, **SAME_ORIGIN})
        assert "only+a+running+one+can+be+cancelled" in r.headers["location"]
        r = await http.post(retry, headers={**admin, **SAME_ORIGIN})
        assert "only+a+failed+workflow+can+be+retried" in r.headers["location"]
        shown = await http.get(r.headers["location"], headers=admin)
        assert shown.status_code == 200 and "only a failed workflow can be retried" in shown.text


def test_the_layout_is_layered_capped_in_width_and_deterministic():
    # A chain, a diamond, a wide fan-out: layer = 1 + the largest of the parents' layers.
    jobs = [
        {"ref": "a", "id": 1, "status": "completed", "depends_on": []},
        {"ref": "b", "id": 2, "status": "running", "depends_on": ["a"]},
        {"ref": "c", "id": 3, "status": "pending", "depends_on": ["a"]},
        {"ref": "d", "id": 4, "status": "waiting", "depends_on": ["b", "c", "a", 99]},
        *({"ref": f"f{i}", "id": 10 + i, "status": "waiting", "depends_on": ["d"]} for i in range(30)),
    ]
    parents = graph.parents_within(jobs)
    assert parents[3] == [1, 2, 0]  # the id of a job outside the workflow is not a node
    assert graph.layers(parents)[:5] == [0, 1, 1, 2, 3]
    placed, width, height = graph.place(parents)
    assert width == 2 * graph.MARGIN + graph.PER_ROW * graph.NODE_W + (graph.PER_ROW - 1) * graph.GAP_X
    assert max(node.x for node in placed) + graph.NODE_W <= width - graph.MARGIN
    assert max(node.y for node in placed) + graph.NODE_H <= height
    for node in placed:  # every child below each of its parents
        assert all(placed[p].y < node.y for p in parents[node.index])
    assert graph.workflow_graph(jobs) == graph.workflow_graph(jobs)

    # A thousand jobs, each after every one of the previous ten: edges past EDGES_DRAWN are left out.
    many = [
        {
            "ref": f"j{i}",
            "id": i + 1,
            "status": "waiting",
            "depends_on": [f"j{p}" for p in range(max(0, i - 10), i)],
        }
        for i in range(1000)
    ]
    drawn = graph.workflow_graph(many)
    assert drawn.count('<a class="node ') == 1000
    assert drawn.count('<path class="edge"') == graph.EDGES_DRAWN
    assert f"{sum(len(j['depends_on']) for j in many) - graph.EDGES_DRAWN} of" in drawn
