"""The dashboard's workflow pages in headless Chromium (Playwright, as tests/system/test_ui.py drives it,
with its fixtures) against a live service: from the navigation to a workflow's graph, from a node to its
job's page and back, Cancel and Retry pressed; a thousand jobs drawn; a phone's width. Effects are
checked through the API and in the database; screenshots go to test-artifacts/.

Without Chromium or Playwright these tests skip on a developer's machine, and fail under CI=true."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.helpers import lease_one
from tests.system import test_ui as ui
from tests.system.test_ui import shot

pytestmark = [pytest.mark.anyio, pytest.mark.any_server]

# The browser and its pages as tests/system/test_ui.py opens them: its fixtures, registered here by name.
chromium = ui.chromium
open_page = ui.open_page
page = ui.page

ORDER = {
    "name": "order-7",
    "jobs": [
        {"ref": "charge", "queue": "payments", "kind": "charge", "payload": 7, "max_attempts": 1},
        {"ref": "render", "queue": "pdf", "payload": 7},
        {"ref": "send", "queue": "emails", "payload": 7, "depends_on": ["charge", "render"]},
    ],
}


async def make(client: httpx.AsyncClient, body: dict) -> dict:
    r = await client.post("/workflows", json=body)
    assert r.status_code == 201, r.text
    return r.json()


async def end(client: httpx.AsyncClient, queue: str, *, fail: bool = False) -> None:
    job = await lease_one(client, queue)
    token = {"id": job["id"], "lease_token": job["lease_token"]}
    r = await client.post("/nack" if fail else "/ack", json=token | ({"error": "declined"} if fail else {}))
    assert r.is_success, r.text


async def statuses(client: httpx.AsyncClient, workflow_id: int) -> tuple[str, dict[str, str]]:
    view = (await client.get(f"/workflows/{workflow_id}")).json()
    return view["status"], {job["ref"]: job["status"] for job in view["jobs"]}


async def test_a_workflows_graph_from_the_navigation_to_a_job_and_cancelled(page, client, db):
    from playwright.async_api import expect

    made = await make(client, ORDER)
    ids = {job["ref"]: job["id"] for job in made["jobs"]}
    await end(client, "payments")

    await page.goto("/ui")
    await page.get_by_role("navigation").get_by_role("link", name="Workflows").click()
    await expect(page.locator("h1")).to_have_text("Workflows")
    row = page.locator(f'tr[data-workflow="{made["id"]}"]')
    await expect(row.locator(".status")).to_have_text("running")
    await shot(page, "workflows")
    await row.get_by_role("link", name="order-7").click()

    await expect(page.locator("h1")).to_have_text(f"Workflow {made['id']}: order-7")
    graph = page.locator("svg.graph")
    await expect(graph).to_be_visible()
    await expect(graph.locator("a.node")).to_have_count(3)
    await expect(graph.locator("path.edge")).to_have_count(2)
    node = {ref: graph.locator(f'a.node[data-job="{job_id}"]') for ref, job_id in ids.items()}
    await expect(node["charge"]).to_have_class("node completed")
    await expect(node["render"]).to_have_class("node pending")
    await expect(node["send"]).to_have_class("node waiting")
    await expect(node["send"].locator("text.ref")).to_have_text("send")
    # Coloured by its status, by the stylesheet; the child drawn below both parents.
    fill = await node["charge"].locator("rect").evaluate("r => getComputedStyle(r).fill")
    assert fill == "rgb(236, 253, 243)"
    boxes = {ref: await locator.bounding_box() for ref, locator in node.items()}
    assert boxes["charge"]["y"] == boxes["render"]["y"] < boxes["send"]["y"]
    await shot(page, "workflow")

    # A node opens its job's page, which names its parents and links back to the workflow.
    await node["send"].click()
    await expect(page.locator("h1")).to_have_text(f"Job {ids['send']}")
    parents = page.locator("table.parents")
    await expect(parents.locator(f'tr[data-job="{ids["charge"]}"] .status')).to_have_text("completed")
    await expect(parents.locator(f'tr[data-job="{ids["render"]}"] .status')).to_have_text("pending")
    await shot(page, "job-with-parents")
    await page.get_by_role("link", name=f"workflow {made['id']}").click()
    await expect(page.locator("h1")).to_have_text(f"Workflow {made['id']}: order-7")

    await page.get_by_role("button", name="Cancel").click()  # confirm() answered yes
    await expect(page.locator(".flash")).to_contain_text(f"Cancelled workflow {made['id']}")
    await expect(page.locator("table.fields .status").first).to_have_text("cancelled")
    await expect(page.locator('svg.graph a.node[class="node cancelled"]')).to_have_count(2)
    await expect(page.get_by_role("button", name="Cancel")).to_have_count(0)
    assert await statuses(client, made["id"]) == (
        "cancelled",
        {"charge": "completed", "render": "cancelled", "send": "cancelled"},
    )
    assert await db.fetchval("SELECT status FROM jobq.workflows WHERE id = $1", made["id"]) == "cancelled"


async def test_a_failed_workflow_retried_from_its_page(page, client, db):
    from playwright.async_api import expect

    made = await make(client, ORDER)
    await end(client, "payments", fail=True)
    await end(client, "pdf")
    await page.goto(f"/ui/workflows/{made['id']}")
    await expect(page.locator("table.fields .status").first).to_have_text("failed")
    await expect(page.locator("svg.graph a.node.dead")).to_have_count(1)
    await expect(page.get_by_role("button", name="Cancel")).to_have_count(0)
    await shot(page, "workflow-failed")

    await page.get_by_role("button", name="Retry").click()
    await expect(page.locator(".flash")).to_contain_text(f"Retried workflow {made['id']}")
    await expect(page.locator("table.fields .status").first).to_have_text("running")
    assert await statuses(client, made["id"]) == (
        "running",
        {"charge": "pending", "render": "completed", "send": "waiting"},
    )
    charge = made["jobs"][0]["id"]
    assert await db.fetchval("SELECT attempts FROM jobq.all_jobs WHERE id = $1", charge) == 0


async def test_a_thousand_jobs_drawn_within_a_bounded_width(open_page, service, client):
    """A fan-out and fan-in of a thousand jobs: every node drawn, the drawing no wider than its rows of
    nodes allow, scrolling within its frame; the page no wider than a phone at 390 px."""
    from playwright.async_api import expect

    jobs = [{"ref": "start", "queue": "big", "payload": 0}]
    jobs += [{"ref": f"part-{i}", "queue": "big", "payload": i, "depends_on": ["start"]} for i in range(998)]
    jobs += [{"ref": "end", "queue": "big", "payload": 0, "depends_on": [f"part-{i}" for i in range(998)]}]
    made = await make(client, {"name": "big", "jobs": jobs})

    page = await open_page(service.url)
    await page.goto(f"/ui/workflows/{made['id']}")
    graph = page.locator("svg.graph")
    await expect(graph.locator("a.node")).to_have_count(1000)
    await expect(page.locator("figure.graph figcaption")).to_contain_text("1000 jobs in 3 layers")
    assert await graph.evaluate("g => g.width.baseVal.value") <= 1300
    frame = await page.locator(".graph-frame").bounding_box()
    assert frame["height"] <= 800
    last = graph.locator(f'a.node[data-job="{made["jobs"][-1]["id"]}"]')
    await last.scroll_into_view_if_needed()
    await last.click()
    await expect(page.locator("h1")).to_have_text(f"Job {made['jobs'][-1]['id']}")
    await expect(page.locator("h2", has_text="Parents")).to_be_visible()

    phone = await open_page(service.url, width=390, height=844)
    for path in (f"/ui/workflows/{made['id']}", "/ui/workflows", f"/ui/jobs/{made['jobs'][0]['id']}"):
        await phone.goto(path)
        assert await phone.evaluate("document.documentElement.scrollWidth") <= 390, path
    await phone.goto(f"/ui/workflows/{made['id']}")
    await shot(phone, "phone-workflow")
    assert re.search(r"big", await phone.locator("h1").inner_text())
