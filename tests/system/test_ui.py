"""The dashboard under /ui, clicked through in headless Chromium (Debian's, driven by Playwright) against
a live service; every effect is checked in the database. Screenshots go to test-artifacts/.

Without Chromium or Playwright these tests skip on a developer's machine, and fail under CI=true."""

import json
import os
import re
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from html import escape
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from tests.fixtures import tool_missing
from tests.helpers import enqueue, enqueue_many, lease, lease_one, make_dead
from tests.waiting import until

pytestmark = [pytest.mark.anyio, pytest.mark.any_server]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = os.environ.get("JOBQ_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
async def chromium() -> AsyncIterator[object]:
    """Headless Chromium, launched once for the module: starting Playwright's driver and the browser takes
    seconds, a new context (`open_page`) a fraction of one, and each test gets contexts of its own."""
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        tool_missing("the playwright package is not installed (pip install -e '.[test]')")
    if not (shutil.which(CHROMIUM) or Path(CHROMIUM).exists()):
        tool_missing(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    ARTIFACTS.mkdir(exist_ok=True)
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            await browser.close()


@pytest.fixture
async def open_page(chromium) -> AsyncIterator[Callable[..., Awaitable[object]]]:
    """Opens a page of the service at a url, in a browser context of its own (no cookies or storage of
    another test); the dashboard's confirm() questions are answered yes. Closed after the test."""
    contexts = []

    async def opened(url: str, width: int = 1280, height: int = 800) -> object:
        context = await chromium.new_context(base_url=url, viewport={"width": width, "height": height})
        contexts.append(context)
        page = await context.new_page()
        page.set_default_timeout(10_000)
        page.on("dialog", lambda dialog: dialog.accept())
        return page

    yield opened
    for context in contexts:
        await context.close()


@pytest.fixture
async def page(open_page, service) -> object:
    return await open_page(service.url)


async def shot(page, name: str) -> None:
    await page.screenshot(path=str(ARTIFACTS / f"ui-{name}.png"), full_page=True)


async def test_queue_paused_and_resumed_from_the_page(page, client, db):
    from playwright.async_api import expect

    await enqueue_many(client, "emails", 3)
    await enqueue(client, "emails", "later", delay=3600)
    await lease_one(client, "emails")  # one running
    await make_dead(client, "reports", payload={"month": "2024-05"}, error="timeout")

    await page.goto("/ui")
    row = page.locator('tr[data-queue="emails"]')
    rate = re.compile(r"^(—|[0-9.]+/s)$")
    lag = re.compile(r"^[0-9.]+ s$")
    done = re.compile(r"^\d+$")  # tests/http/test_rollups.py checks the count
    cells = ["2", "1", "1", "0", done, lag, rate, rate, "active", "", "Pause"]
    await expect(row.locator("td")).to_have_text(cells)
    await expect(page.locator('tr[data-queue="reports"] td.dead')).to_have_text("1")
    await shot(page, "queues")

    await row.get_by_role("button", name="Pause").click()
    await expect(page.locator(".flash")).to_contain_text("Paused emails")
    await expect(row.locator("td.state")).to_have_text("paused")
    assert await db.fetchval("SELECT paused FROM jobq.queues WHERE name = 'emails'") is True
    assert await lease(client, "emails") == []  # a paused queue leases nothing
    await shot(page, "queue-paused")

    await row.get_by_role("button", name="Resume").click()
    await expect(page.locator(".flash")).to_contain_text("Resumed emails")
    await expect(row.locator("td.state")).to_have_text("active")
    assert await db.fetchval("SELECT paused FROM jobq.queues WHERE name = 'emails'") is False
    assert len(await lease(client, "emails", max_jobs=5)) == 2


async def test_dead_job_retried_from_the_page(page, client, db):
    from playwright.async_api import expect

    job_id = await make_dead(
        client, "emails", payload={"to": "ada@example.com"}, error="mailbox does not exist"
    )
    other = await make_dead(client, "emails", payload={"to": "bob@example.com"}, error="over quota")

    await page.goto("/ui")
    await page.locator('tr[data-queue="emails"] td.dead a').click()
    await expect(page).to_have_url(f"{page.url.split('/ui')[0]}/ui/dead?queue=emails")
    dead = page.locator(f'tr[data-job="{job_id}"]')
    await expect(dead).to_contain_text("mailbox does not exist")
    await expect(dead).to_contain_text("1/1")  # attempts, of max_attempts
    await expect(dead.locator("code")).to_have_text('{"to": "ada@example.com"}')
    await shot(page, "dead-jobs")

    await dead.get_by_role("button", name="Retry").click()
    await expect(page.locator(".flash")).to_contain_text(f"Retried job {job_id}")
    await expect(dead).to_have_count(0)
    await expect(page.locator(f'tr[data-job="{other}"]')).to_have_count(1)
    row = await db.fetchrow("SELECT status, attempts FROM jobq.all_jobs WHERE id = $1", job_id)
    assert (row["status"], row["attempts"]) == ("pending", 0)
    assert await db.fetchval("SELECT status FROM jobq.all_jobs WHERE id = $1", other) == "dead"
    await shot(page, "dead-job-retried")

    # "Retry all" takes the rest of the queue (after a confirm(), answered yes).
    await page.get_by_role("button", name="Retry all dead jobs in emails").click()
    await expect(page.locator(".flash")).to_contain_text("Retried 1 dead jobs of emails")
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE status = 'dead'") == 0


async def test_job_page_and_purge(page, client, db):
    from playwright.async_api import expect

    job_id = await make_dead(
        client, "emails", payload={"to": "ada@example.com", "n": [1, 2]}, error="Traceback:\n boom"
    )
    await page.goto("/ui/dead")
    await page.get_by_role("link", name=str(job_id), exact=True).click()
    await expect(page.locator("h1")).to_have_text(f"Job {job_id}")
    await expect(page.locator(".status")).to_have_text("dead")
    await expect(page.locator("pre.error")).to_have_text("Traceback:\n  boom")
    assert '"to": "ada@example.com"' in await page.locator("pre.payload").inner_text()
    await shot(page, "job")

    await page.get_by_role("button", name="Purge").click()  # confirm() answered yes
    await expect(page.locator(".flash")).to_contain_text(f"Purged job {job_id}")
    await until(lambda: page.url.endswith("/ui/jobs?queue=emails&status=dead"))
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE id = $1", job_id) == 0

    # The header's lookup finds a job by id; an unknown one is a page saying so.
    other = (await enqueue(client, "emails"))["id"]
    await page.get_by_label("job id").fill(str(other))
    await page.get_by_role("button", name="Open").click()
    await expect(page.locator(".status")).to_have_text("pending")
    await page.goto(f"/ui/jobs/{job_id}")
    await expect(page.locator("h1")).to_have_text("Not found")


async def test_throughput_from_the_counters(start_service):
    """The queues page shows the rates this process counted over the last minute."""
    service = start_service(metrics_interval=0.1)
    async with httpx.AsyncClient(base_url=service.url) as http:
        await until(lambda: service.app.state.metrics.gauges.at)
        await enqueue_many(http, "fast", 20)
        leased = await lease(http, "fast", max_jobs=20)
        items = [{"id": j["id"], "lease_token": j["lease_token"]} for j in leased]
        acked = await http.post("/ack/batch", json={"items": items})
        assert acked.status_code == 200, acked.text

        async def rates() -> dict | None:
            seen = service.app.state.metrics.throughput().get("fast")
            return seen if seen and seen["acked"] > 0 and seen["enqueued"] > 0 else None

        await until(rates)
        text = (await http.get("/ui")).text
        row = text[text.index('data-queue="fast"') :].split("</tr>")[0]
        assert row.count("/s</td>") == 2 and "—" not in row


async def test_forms_from_other_sites_are_refused_and_text_is_escaped(client, db):
    await enqueue(client, "q")
    for headers in ({"Origin": "https://evil.example"}, {"Sec-Fetch-Site": "cross-site"}):
        r = await client.post("/ui/queues/q/pause", headers=headers)
        assert r.status_code == 403, r.text
    assert await db.fetchval("SELECT paused FROM jobq.queues WHERE name = 'q'") is False

    job_id = await make_dead(client, "q2", payload={"html": "<b>bold</b>"}, error="<script>alert(1)</script>")
    for path in ("/ui/dead", f"/ui/jobs/{job_id}"):
        r = await client.get(path)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert "<script>alert" not in r.text and "&lt;script&gt;alert(1)&lt;/script&gt;" in r.text
        assert "<b>bold" not in r.text
        assert "frame-ancestors 'none'" in r.headers["content-security-policy"]


async def test_admins_only_when_tokens_are_configured(start_service, db):
    service = start_service(tokens={"w-secret": "worker", "a-secret": "admin"})
    admin = {"Authorization": "Bearer a-secret"}
    async with httpx.AsyncClient(base_url=service.url) as client:
        for path in ("/ui", "/ui/dead", "/ui/jobs/1"):
            assert (await client.get(path)).status_code == 401, path
            assert (await client.get(path, headers={"Authorization": "Bearer w-secret"})).status_code == 403
        # The stylesheet and the script are the sign-in form's too, and no secret (the wheel ships them).
        assert (await client.get("/ui/static/ui.js")).status_code == 200
        assert (await client.post("/ui/queues/q/pause")).status_code == 401
        assert await db.fetchval("SELECT count(*) FROM jobq.queues") == 0
        assert (await client.get("/ui", headers=admin)).status_code == 200
        assert (await client.post("/ui/queues/q/pause", headers=admin)).status_code == 303
        assert await db.fetchval("SELECT paused FROM jobq.queues WHERE name = 'q'") is True


async def test_read_only_for_a_viewer(start_service, db):
    """A viewer sees every page with no button on it, and its posts are refused, changing nothing."""
    # Gauges refreshed often: the wait for them below stays well inside uvicorn's keep-alive (5 s). At the
    # default interval (5 s) the client's next request on its idle connection could meet the server
    # closing it ("Server disconnected without sending a response").
    service = start_service(tokens={"v-secret": "viewer", "a-secret": "admin"}, metrics_interval=0.1)
    viewer, admin = {"Authorization": "Bearer v-secret"}, {"Authorization": "Bearer a-secret"}
    async with httpx.AsyncClient(base_url=service.url, headers=admin) as client:
        job_id = await make_dead(client, "q", payload={"to": "ada"})
        await until(lambda: service.app.state.metrics.gauges.queues)  # the queues page lists q
        pages = (
            "/ui",
            "/ui/dead",
            "/ui/dead?queue=q",
            f"/ui/jobs/{job_id}",
            "/ui/jobs",
            "/ui/jobs?queue=q&status=dead",
            "/ui/queues/q",
        )
        for path in pages:
            shown = await client.get(path)
            assert shown.status_code == 200 and 'method="post"' in shown.text, path
        for path in (*pages, "/ui/workers", "/ui/static/ui.js", "/ui/static/ui.css"):
            r = await client.get(path, headers=viewer)
            assert r.status_code == 200, path
            assert 'method="post"' not in r.text and ">Retry<" not in r.text and ">Pause<" not in r.text, path
            assert 'type="checkbox" name="id"' not in r.text and '<input id="setting-' not in r.text, path
        assert 'data-queue="q"' in (await client.get("/ui", headers=viewer)).text
        assert f'data-job="{job_id}"' in (await client.get("/ui/dead", headers=viewer)).text
        before = await db.fetch("SELECT id, status, attempts, updated_at FROM jobq.all_jobs ORDER BY id")
        buttons = (
            "queues/q/pause",
            "queues/q/retry-dead",
            f"dead/{job_id}/retry",
            f"dead/{job_id}/purge",
            f"jobs/{job_id}/cancel",
            f"jobs/{job_id}/run",
            "jobs/selected",
            "jobs/matching?action=purge&status=dead",
            "queues/q/settings",
        )
        for action in buttons:
            r = await client.post(f"/ui/{action}", headers=viewer)
            assert r.status_code == 403, action
        assert (
            await db.fetch("SELECT id, status, attempts, updated_at FROM jobq.all_jobs ORDER BY id") == before
        )
        assert await db.fetchval("SELECT paused FROM jobq.queues WHERE name = 'q'") is False


async def test_job_page_shows_result_and_progress_escaped_and_cut(client, db):
    job = await enqueue(client, "q")
    held = await lease_one(client, "q", job["id"])
    token = {"id": job["id"], "lease_token": held["lease_token"]}
    r = await client.post("/extend", json=token | {"visibility_timeout": 30, "progress": {"at": "<i>1</i>"}})
    assert r.status_code == 200, r.text
    page = (await client.get(f"/ui/jobs/{job['id']}")).text
    assert "<i>1" not in page and "&quot;at&quot;: &quot;&lt;i&gt;1&lt;/i&gt;&quot;" in page  # escaped
    assert "<th>Result</th><td>—</td>" in page

    result = {"html": "<script>alert(1)</script>", "rows": ["x" * 100] * 60}  # > 4000 characters pretty
    assert (await client.post("/ack", json=token | {"result": result})).status_code == 200
    page = (await client.get(f"/ui/jobs/{job['id']}")).text
    shown = page[page.index("<th>Result</th>") : page.index("<th>Progress</th>")]
    assert "<script>alert" not in shown and "&lt;script&gt;alert(1)&lt;/script&gt;" in shown
    assert '<pre class="outcome">{\n  &quot;html&quot;' in shown
    assert f"more characters (GET /jobs/{job['id']} has all of it)" in shown
    assert shown.count("x" * 100) < 60


PUSH_PREFIX = "http://127.0.0.1:9/"  # the discard port: nothing answers there


async def test_queue_page_shows_its_push_target_and_never_its_secret(start_service, db):
    service = start_service(push_allowed_urls=[PUSH_PREFIX])
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        assert (await client.patch("/queues/plain", json={"max_attempts": 3})).status_code == 200
        assert "Push delivery" not in (await client.get("/ui/queues/plain")).text
        target = {"url": f"{PUSH_PREFIX}jobs?to=a&b=<i>", "timeout": 2.5, "concurrency": 3}
        r = await client.patch("/queues/pushed", json={"push": target})
        assert r.status_code == 200, r.text
        secret = r.json()["push_secret"]
        assert await db.fetchval("SELECT push_secret FROM jobq.queues WHERE name = 'pushed'") == secret
        page = (await client.get("/ui/queues/pushed")).text
        shown = page[page.index("<h2>Push delivery</h2>") :]
        assert f"<th>URL</th><td>{PUSH_PREFIX}jobs?to=a&amp;b=&lt;i&gt;</td>" in shown  # escaped
        assert "<th>Timeout</th><td>2.5 s</td>" in shown
        assert "<th>Deliveries at once</th><td>3, across every replica</td>" in shown
        assert secret not in page and secret.removeprefix("whsec_") not in page
        # Nor the one a rotation makes, nor the one it replaced (valid a day longer).
        rotated = (await client.post("/queues/pushed/push/secret")).json()["secret"]
        page = (await client.get("/ui/queues/pushed")).text
        assert "<h2>Push delivery</h2>" in page
        assert secret.removeprefix("whsec_") not in page and rotated.removeprefix("whsec_") not in page
        # A queue whose target is removed shows none.
        assert (await client.patch("/queues/pushed", json={"push": None})).status_code == 200
        assert "Push delivery" not in (await client.get("/ui/queues/pushed")).text


async def test_job_page_shows_its_last_delivery_escaped(client, db):
    job_id = (await enqueue(client, "emails"))["id"]
    assert "Last delivery" not in (await client.get(f"/ui/jobs/{job_id}")).text  # never pushed

    async def delivered(delivery: dict) -> str:
        await db.execute(
            "UPDATE jobq.jobs SET delivery = $1::jsonb WHERE id = $2", json.dumps(delivery), job_id
        )
        page = (await client.get(f"/ui/jobs/{job_id}")).text
        return page[page.index("<h2>Last delivery</h2>") : page.index("<h2>Payload</h2>")]

    shown = await delivered(
        {
            "at": "2024-05-01T12:00:00.5Z",
            "outcome": "failed",
            "status": 500,
            "ms": 12.5,
            "error": "HTTP 500: <script>alert(1)</script>",
        }
    )
    assert "<th>Outcome</th><td>failed <span" in shown and "<th>HTTP status</th><td>500</td>" in shown
    assert "<th>Took</th><td>12.5 ms</td>" in shown and ">2024-05-01 12:00:00Z</time>" in shown
    assert "<th>Error</th><td>HTTP 500: &lt;script&gt;alert(1)&lt;/script&gt;</td>" in shown
    assert "<script>alert" not in shown and "Retry after" not in shown and "Note" not in shown

    shown = await delivered(
        {"at": "2024-05-01T12:00:00Z", "outcome": "retry_later", "status": 503, "ms": 3, "retry_after": 90.0}
    )
    assert (
        "<th>Outcome</th><td>retry_later <span" in shown and "<th>Retry after</th><td>1 m 30 s</td>" in shown
    )
    assert "<th>Error</th>" not in shown

    shown = await delivered(
        {"at": "2024-05-01T12:00:00Z", "outcome": "completed", "status": 200, "ms": 4.2, "note": "not JSON"}
    )
    assert "<th>Note</th><td>not JSON</td>" in shown
    shown = await delivered({"at": "2024-05-01T12:00:00Z", "outcome": "released", "status": None, "ms": 0.0})
    assert "<th>HTTP status</th><td>— (no answer)</td>" in shown


async def test_job_page_shows_a_real_failed_delivery(start_service):
    """A delivery the service made itself (to a port where nothing listens) reaches the job's page."""
    service = start_service(push_allowed_urls=[PUSH_PREFIX])
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        r = await client.patch("/queues/pushed", json={"push": {"url": f"{PUSH_PREFIX}x", "timeout": 2}})
        assert r.status_code == 200, r.text
        job_id = (await enqueue(client, "pushed"))["id"]

        async def delivery() -> dict | None:
            return (await client.get(f"/jobs/{job_id}")).json()["delivery"]

        done = await until(delivery)
        assert done["outcome"] == "failed" and done["error"]
        page = (await client.get(f"/ui/jobs/{job_id}")).text
        shown = page[page.index("<h2>Last delivery</h2>") : page.index("<h2>Payload</h2>")]
        assert "<th>Outcome</th><td>failed <span" in shown and escape(done["error"]) in shown
        assert f">{_shown(done['at'])}</time>" in shown


async def test_limits_and_the_keys_with_most_waiting(client):
    r = await client.patch("/queues/f", json={"key_concurrency": 1, "key_rate": {"limit": 10, "period": 60}})
    assert r.status_code == 200, r.text
    await client.put("/queues/f/keys/vip <b>", json={"concurrency": 3})
    jobs = [{"queue": "f", "payload": 1, "key": k} for k in ["a", "b", "b", "vip <b>"]]
    r = await client.post("/jobs/batch", json={"jobs": jobs})
    assert r.status_code == 201, r.text
    overview = (await client.get("/ui")).text
    assert '<a href="/ui/queues/f/keys">1 per key, in order · 10 per 60 s per key</a>' in overview
    page = (await client.get("/ui/queues/f/keys")).text
    keys = re.findall(r'data-key="([^"]*)"', page)
    assert keys[0] == "b" and set(keys) == {"a", "b", "vip &lt;b&gt;"}  # most waiting first; escaped
    assert "3 at once" in page and "Limits of the queue: 1 per key, in order · 10 per 60 s per key" in page


def _shown(moment: str | None) -> str:
    """An RFC 3339 time of the API as the dashboard shows it."""
    if moment is None:
        return "—"
    return datetime.fromisoformat(moment).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


async def test_schedule_triggered_and_paused_from_the_page(page, client, db):
    from playwright.async_api import expect

    # Its slots (3:00 on January 1st) fall in no test run: the jobs counted are the page's alone.
    body = {"cron": "0 3 1 1 *", "timezone": "Europe/Berlin", "queue": "reports", "payload": {"m": 1}}
    created = await client.put("/schedules/yearly-report", json=body)
    assert created.status_code == 200, created.text
    next_run = created.json()["next_run_at"]

    await page.goto("/ui")
    await page.get_by_role("link", name="Schedules").click()
    row = page.locator('tr[data-schedule="yearly-report"]')
    await expect(row.locator("th")).to_have_text("yearly-report")
    cells = ["0 3 1 1 * Europe/Berlin", "reports", _shown(next_run), "—", "active", "PauseTrigger now"]
    await expect(row.locator("td")).to_have_text(cells)
    await shot(page, "schedules")

    await row.get_by_role("button", name="Trigger now").click()
    await expect(page.locator(".flash")).to_contain_text("Triggered schedule yearly-report")
    scheduled = "SELECT count(*) FROM jobq.all_jobs WHERE schedule = 'yearly-report'"
    assert await db.fetchval(scheduled) == 1
    job_id = await db.fetchval("SELECT id FROM jobq.all_jobs WHERE schedule = 'yearly-report'")
    await expect(page.locator(".flash")).to_contain_text(f"job {job_id} enqueued in reports")
    await expect(row.locator("td.last a")).to_have_text(f"job {job_id}")
    await shot(page, "schedule-triggered")

    await row.get_by_role("button", name="Pause").click()
    await expect(page.locator(".flash")).to_contain_text("Paused schedule yearly-report")
    await expect(row.locator("td.state")).to_have_text("paused")
    await expect(row.locator("td.next")).to_have_text("—")  # a paused schedule has no next run
    stored = await db.fetchrow("SELECT paused, next_run_at FROM jobq.schedules WHERE name = 'yearly-report'")
    assert (stored["paused"], stored["next_run_at"]) == (True, None)

    await row.get_by_role("button", name="Resume").click()
    await expect(page.locator(".flash")).to_contain_text("Resumed schedule yearly-report")
    await expect(row.locator("td.state")).to_have_text("active")
    assert await db.fetchval("SELECT paused FROM jobq.schedules WHERE name = 'yearly-report'") is False
    assert await db.fetchval(scheduled) == 1  # pausing and resuming enqueued nothing

    # The last run links to its job's page, which links back; the queue links to its dead jobs.
    await row.locator("td.last a").click()
    await expect(page.locator("h1")).to_have_text(f"Job {job_id}")
    await expect(page.locator("table.fields tr", has_text="Schedule").locator("td")).to_have_text(
        "yearly-report, triggered"
    )
    await page.get_by_role("link", name="yearly-report").click()
    await expect(page.locator("h1")).to_have_text("Schedules")
    await row.get_by_role("link", name="reports").click()
    await expect(page.locator("h1")).to_have_text("Dead jobs in reports")


async def test_schedules_read_only_for_a_viewer(start_service, db):
    """A viewer sees the schedules with no button (a token limited to some queues, their schedules only),
    and its posts are refused, changing nothing, as are posts another site makes an admin's browser send;
    an admin's post for a schedule that is not there comes back to the page saying so."""
    tokens = {"v-secret": "viewer", "a-secret": "admin", "o-secret": {"role": "viewer", "queues": ["other"]}}
    service = start_service(tokens=tokens)
    viewer, admin = {"Authorization": "Bearer v-secret"}, {"Authorization": "Bearer a-secret"}
    async with httpx.AsyncClient(base_url=service.url, headers=admin) as client:
        body = {"cron": "0 0 1 1 *", "queue": "q", "payload": None}
        assert (await client.put("/schedules/new-year", json=body)).status_code == 200
        shown = await client.get("/ui/schedules")
        assert shown.status_code == 200 and 'data-schedule="new-year"' in shown.text
        assert '<form method="post" action="/ui/schedules/new-year/trigger' in shown.text
        r = await client.get("/ui/schedules", headers=viewer)
        assert r.status_code == 200 and 'data-schedule="new-year"' in r.text
        assert 'method="post"' not in r.text and ">Trigger now<" not in r.text
        other = await client.get("/ui/schedules", headers={"Authorization": "Bearer o-secret"})
        assert other.status_code == 200 and "new-year" not in other.text  # of a queue it may not see
        for action in ("pause", "resume", "trigger"):
            r = await client.post(f"/ui/schedules/new-year/{action}", headers=viewer)
            assert r.status_code == 403, action
        cross_site = await client.post(
            "/ui/schedules/new-year/trigger", headers={"Sec-Fetch-Site": "cross-site"}
        )
        assert cross_site.status_code == 403  # an admin's browser, made to post by another site
        assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs") == 0
        assert await db.fetchval("SELECT paused FROM jobq.schedules WHERE name = 'new-year'") is False

        r = await client.post("/ui/schedules/nothing-here/trigger")
        assert r.status_code == 303 and r.headers["location"].startswith("/ui/schedules?flash=")
        flash = parse_qs(urlsplit(r.headers["location"]).query)["flash"][0]
        assert "nothing-here" in flash


async def test_jobs_browsed_filtered_and_acted_on_in_bulk(page, client, db):
    """Every state browsable with filters and search; a selection retried, purged or cancelled; every
    match of a filter at once. Each effect is checked in the database."""
    from playwright.async_api import expect

    full = await make_dead(client, "emails", payload={"to": "ada"}, error="mailbox full")
    timeout = await make_dead(client, "emails", payload={"to": "bob"}, error="timeout")
    report = await make_dead(client, "reports", payload={"month": "2024-05"}, error="timeout")
    ready = await enqueue_many(client, "emails", 3)
    scheduled = (await enqueue(client, "emails", {"to": "later"}, delay=3600))["id"]
    done = await enqueue(client, "reports", {"month": "2024-06"})
    held = await lease_one(client, "reports", done["id"])
    assert (await client.post("/ack", json={"id": done["id"], "lease_token": held["lease_token"]})).is_success
    everything = [*ready, scheduled, full, timeout, report, done["id"]]

    await page.goto("/ui")
    await page.get_by_role("link", name="Jobs", exact=True).click()
    rows = page.locator("tbody tr")
    await expect(rows).to_have_count(len(everything))
    ids = [int(i) for i in await rows.evaluate_all("rows => rows.map(r => r.dataset.job)")]
    assert ids == sorted(everything, reverse=True)  # newest first
    await expect(page.locator(f'tr[data-job="{scheduled}"] .status')).to_have_text("scheduled")
    await expect(page.locator(f'tr[data-job="{done["id"]}"] .status')).to_have_text("completed")
    await shot(page, "jobs")

    # Filters and search, from the form.
    await page.get_by_label("Status").select_option("dead")
    await page.get_by_role("button", name="Show").click()
    await expect(rows).to_have_count(3)
    await page.get_by_label("Search").fill("MAILBOX")
    await page.get_by_role("button", name="Show").click()
    await expect(rows).to_have_count(1)
    await expect(page.locator(f'tr[data-job="{full}"]')).to_contain_text("mailbox full")

    # A selection: the ticked dead job is purged, nothing else.
    await page.goto("/ui/jobs?queue=emails&status=dead")
    await expect(rows).to_have_count(2)
    await page.get_by_label(f"select job {full}").check()
    await page.get_by_role("button", name="Purge selected").click()  # confirm() answered yes
    await expect(page.locator(".flash")).to_contain_text("Purged 1 of 1 selected jobs.")
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE id = $1", full) == 0
    await expect(rows).to_have_count(1)

    # Every match of the filter, on every page: the dead jobs of emails, not those of reports.
    await page.get_by_role("button", name="Retry all matching").click()
    await expect(page.locator(".flash")).to_contain_text("Retried 1 dead jobs matching the filters.")
    assert await db.fetchval("SELECT status FROM jobq.all_jobs WHERE id = $1", timeout) == "pending"
    assert await db.fetchval("SELECT status FROM jobq.all_jobs WHERE id = $1", report) == "dead"

    # The header box ticks every job shown; a selection of mixed states changes only what it can.
    await page.goto("/ui/jobs")
    await page.get_by_label("select every job shown").check()
    await page.get_by_role("button", name="Cancel selected").click()
    pending = 3 + 1 + 1  # ready, scheduled, retried
    await expect(page.locator(".flash")).to_contain_text(
        f"Cancelled {pending} of {len(everything) - 1} selected jobs. {len(everything) - 1 - pending} left"
    )
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE status = 'cancelled'") == pending
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE status = 'pending'") == 0
    assert await db.fetchval("SELECT status FROM jobq.all_jobs WHERE id = $1", done["id"]) == "completed"
    await shot(page, "jobs-cancelled")

    # Completed jobs have nothing to retry, purge or cancel: no boxes, no buttons.
    await page.goto("/ui/jobs?status=completed")
    await expect(rows).to_have_count(1)
    await expect(page.locator("input[type=checkbox]")).to_have_count(0)
    await expect(page.locator("form.bulk")).to_have_count(0)

    # The remaining buttons: Retry selected, Cancel all matching, Purge all matching.
    await page.goto("/ui/jobs?queue=reports&status=dead")
    await page.get_by_label(f"select job {report}").check()
    await page.get_by_role("button", name="Retry selected").click()
    await expect(page.locator(".flash")).to_contain_text("Retried 1 of 1 selected jobs.")
    assert await db.fetchval("SELECT status FROM jobq.all_jobs WHERE id = $1", report) == "pending"
    await page.goto("/ui/jobs?queue=reports&status=pending")
    await page.get_by_role("button", name="Cancel all matching").click()
    await expect(page.locator(".flash")).to_contain_text("Cancelled 1 pending jobs matching the filters.")
    assert await db.fetchval("SELECT status FROM jobq.all_jobs WHERE id = $1", report) == "cancelled"
    doomed = [await make_dead(client, "reports", error=f"boom {n}") for n in range(2)]
    await page.goto("/ui/jobs?queue=reports&status=dead")
    await page.get_by_role("button", name="Purge all matching").click()
    await expect(page.locator(".flash")).to_contain_text("Purged 2 dead jobs matching the filters.")
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE id = ANY($1::bigint[])", doomed) == 0


async def test_queue_page_states_and_settings(page, client, db):
    from playwright.async_api import expect

    dead = await make_dead(client, "emails", error="boom")
    await enqueue_many(client, "emails", 2)
    await enqueue(client, "emails", "later", delay=3600)
    dropped = (await enqueue(client, "emails", "dropped"))["id"]
    assert (await client.delete(f"/jobs/{dropped}")).status_code == 200

    await page.goto("/ui")
    await page.locator('tr[data-queue="emails"] th a').click()
    await expect(page.locator("h1")).to_have_text("Queue emails")
    states = page.locator("table.states td")
    # Pending, scheduled, running, completed, dead, cancelled.
    await expect(states).to_have_text(["2", "1", "0", "0", "1", "1"])
    await page.locator('tr[data-state="cancelled"] a').click()
    await expect(page.locator("tbody tr")).to_have_count(1)
    await expect(page.locator(f'tr[data-job="{dropped}"] .status')).to_have_text("cancelled")
    await page.go_back()
    await expect(page.locator("figure.chart")).to_have_count(
        2
    )  # tests/http/test_rollups.py checks their data
    await page.get_by_role("link", name="Last day").click()
    await expect(page.locator(".spans b")).to_have_text("Last day")
    await expect(page.locator("figure.chart figcaption").first).to_contain_text("Jobs per 15 minutes")
    await shot(page, "queue")
    # An hour of rollups as a busy queue would leave them, drawn per minute (the documentation's
    # dashboard page shows this one).
    await db.execute(
        """INSERT INTO jobq.rollups (queue, minute, enqueued, completed, failed, dead, lag)
        SELECT 'emails', date_trunc('minute', now()) - make_interval(mins => m),
               600 + (300 * sin(m / 9.0))::int, 590 + (280 * sin((m - 2) / 9.0))::int,
               12 + m % 7, (m % 11 = 0)::int, 0.4 + greatest(0, 20 * sin((m - 30) / 6.0))
        FROM generate_series(1, 59) m
        ON CONFLICT DO NOTHING"""
    )
    await page.get_by_role("link", name="Last hour").click()
    await expect(page.locator('polyline[data-series="enqueued"]')).to_have_attribute(
        "data-total", re.compile(r"^[1-9]\d{4}")
    )
    await shot(page, "queue-charts")
    await page.locator('tr[data-state="dead"] a').click()
    await expect(page.locator("tbody tr")).to_have_count(1)
    await expect(page.locator(f'tr[data-job="{dead}"]')).to_have_count(1)

    await page.goto("/ui/queues/emails")
    await page.get_by_label("Max attempts").fill("7")
    await page.get_by_label("Visibility timeout").fill("45")
    await page.get_by_label("Jobs per key at once").fill("2")
    await page.get_by_role("button", name="Save settings").click()
    await expect(page.locator(".flash")).to_have_text("Saved the settings of emails.")
    columns = "max_attempts, visibility_timeout, key_concurrency, fair"
    row = await db.fetchrow(f"SELECT {columns} FROM jobq.queues WHERE name = 'emails'")
    assert dict(row) == {"max_attempts": 7, "visibility_timeout": 45, "key_concurrency": 2, "fair": False}
    await expect(page.get_by_label("Max attempts")).to_have_value("7")
    await expect(page.locator("main")).to_contain_text("2 per key")
    await page.get_by_role("link", name="its keys").click()  # the queue's keys, under its limits
    await expect(page.locator("h1")).to_have_text("Keys of emails")
    await expect(page.locator("main")).to_contain_text("Limits of the queue: 2 per key")
    await page.goto("/ui/queues/emails")

    # A value the API refuses is refused with its reason, and nothing changes.
    await page.get_by_label("Max attempts").fill("0")
    await page.get_by_role("button", name="Save settings").click()
    await expect(page.locator(".flash")).to_contain_text("Settings not saved: max_attempts")
    await page.get_by_label("Visibility timeout").fill("soon")
    await page.get_by_role("button", name="Save settings").click()
    await expect(page.locator(".flash")).to_contain_text("each must be a number")
    assert await db.fetchval("SELECT max_attempts FROM jobq.queues WHERE name = 'emails'") == 7

    # Rates, of the queue and per key.
    await page.goto("/ui/queues/emails")
    await page.get_by_label("Leases of the queue", exact=True).fill("100")
    await page.get_by_label("Leases of the queue: period").fill("60")
    await page.get_by_label("Leases per key", exact=True).fill("5")
    await page.get_by_label("Leases per key: period").fill("1")
    await page.get_by_role("button", name="Save settings").click()
    await expect(page.locator(".flash")).to_have_text("Saved the settings of emails.")
    rates = "SELECT rate_limit, rate_period, key_rate_limit, key_rate_period FROM jobq.queues"
    rates += " WHERE name = 'emails'"
    assert tuple(await db.fetchrow(rates)) == (100, 60, 5, 1)
    await expect(page.locator("main")).to_contain_text("100 per 60 s · 5 per 1 s per key")

    # Clearing a limit removes it; the others stay.
    await page.get_by_label("Jobs per key at once").fill("")
    await page.get_by_label("Leases per key", exact=True).fill("")
    await page.get_by_role("button", name="Save settings").click()
    await expect(page.locator(".flash")).to_have_text("Saved the settings of emails.")
    assert await db.fetchval("SELECT key_concurrency FROM jobq.queues WHERE name = 'emails'") is None
    assert tuple(await db.fetchrow(rates)) == (100, 60, None, None)


async def test_job_page_runs_a_scheduled_job_now_and_cancels_one(page, client, db):
    from playwright.async_api import expect

    later = (await enqueue(client, "emails", {"to": "ada"}, delay=3600))["id"]
    await page.goto(f"/ui/jobs/{later}")
    await expect(page.locator(".status")).to_have_text("scheduled")
    await expect(page.locator("table.fields a").first).to_have_attribute("href", "/ui/queues/emails")
    await shot(page, "job-scheduled")
    await page.get_by_role("button", name="Run now").click()
    await expect(page.locator(".flash")).to_contain_text(f"Job {later} is ready now")
    assert await db.fetchval("SELECT run_at <= now() FROM jobq.all_jobs WHERE id = $1", later) is True
    await expect(page.locator(".status")).to_have_text("pending")
    await expect(page.get_by_role("button", name="Run now")).to_have_count(0)

    await page.get_by_role("button", name="Cancel").click()  # confirm() answered yes
    await expect(page.locator(".flash")).to_contain_text(f"Cancelled job {later}")
    await expect(page.locator(".status")).to_have_text("cancelled")
    assert await db.fetchval("SELECT status FROM jobq.all_jobs WHERE id = $1", later) == "cancelled"
    await expect(page.get_by_role("button", name="Cancel")).to_have_count(0)


async def test_docs_render_with_no_internet(page, service):
    """Swagger UI at /docs draws the API's operations with every request to another host refused."""
    from playwright.async_api import expect

    elsewhere = []

    async def only_the_service(route):
        if route.request.url.startswith(service.url):
            await route.continue_()
        else:
            elsewhere.append(route.request.url)
            await route.abort()

    await page.route("**/*", only_the_service)
    await page.goto("/docs")
    await expect(page.locator(".opblock").first).to_be_visible()
    await expect(page.locator(".opblock-summary-path", has_text="/jobs/{id}/run")).to_have_count(1)
    assert elsewhere == []
    await shot(page, "docs")


async def test_workers_page(open_page, start_service):
    from playwright.async_api import expect

    # Sightings written every 0.1 s: the page shows when the worker was seen soon after its lease.
    service = start_service(metrics_interval=0.1)
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        job = await enqueue(client, "emails")
        await lease_one(client, "emails", job["id"], worker_id="host-a:41")
    page = await open_page(service.url)

    async def seen() -> bool:
        await page.goto("/ui/workers")
        cell = page.locator('tr[data-worker="host-a:41"] td.last-seen')
        return await cell.count() == 1 and await cell.inner_text() != "—"

    # Listed at once as the holder of a running job; seen leasing once its replica has written what it
    # saw (every metrics interval).
    await until(seen)
    row = page.locator('tr[data-worker="host-a:41"]')
    await expect(row.locator("td")).to_have_text(
        ["emails", re.compile(r"^\d{4}-"), "1", "1", re.compile(r"^\d{4}-")]
    )
    await shot(page, "workers")
    await row.get_by_role("link", name="emails").click()
    await expect(page.locator("h1")).to_have_text("Queue emails")


BAD = "rgb(180, 35, 24)"  # ui.css's --bad: what is failing now


async def color(locator) -> str:
    return await locator.evaluate("element => getComputedStyle(element).color")


async def test_a_retried_jobs_error_is_shown_as_history_not_in_red(page, client):
    """A dead job's error is red; once retried the job is pending again and its error is what an earlier
    attempt said, shown muted, on its page and in the list."""
    from playwright.async_api import expect

    job_id = await make_dead(client, "emails", error="mailbox full")
    await page.goto(f"/ui/jobs/{job_id}")
    error = page.locator("main pre", has_text="mailbox full")
    assert await color(error) == BAD
    await page.get_by_role("button", name="Retry").click()
    await expect(page.locator(".status")).to_have_text("pending")
    await expect(page.locator("h2", has_text="error")).to_have_text("Last error (an earlier attempt)")
    await expect(error).to_have_text("mailbox full")
    assert await color(error) != BAD
    await shot(page, "job-retried")

    other = await make_dead(client, "reports", error="disk full")
    await page.goto("/ui/jobs")
    retried = page.locator(f'tr[data-job="{job_id}"] td', has_text="mailbox full")
    still_dead = page.locator(f'tr[data-job="{other}"] td', has_text="disk full")
    await expect(retried).to_have_count(1)
    assert await color(retried) != BAD and await color(still_dead) == BAD


async def test_sign_in_in_the_browser(open_page, start_service, db):
    """With tokens, a browser is sent to the sign-in page, signs in once with a token and uses the
    dashboard (its buttons too) with the session cookie, which scripts cannot read; sign-out ends it."""
    from playwright.async_api import expect

    service = start_service(tokens={"a-secret": "admin", "v-secret": "viewer"})
    async with httpx.AsyncClient(base_url=service.url, headers={"Authorization": "Bearer a-secret"}) as api:
        await enqueue(api, "emails")
    page = await open_page(service.url, width=390, height=844)
    await page.goto("/ui/queues/emails")
    await expect(page).to_have_url(re.compile(r"/ui/sign-in\?next=%2Fui%2Fqueues%2Femails$"))
    assert await page.evaluate("document.documentElement.scrollWidth") <= 390
    await shot(page, "sign-in")
    await page.get_by_label("Token").fill("wrong")
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator(".flash")).to_contain_text("not one of this service")

    await page.get_by_label("Token").fill("a-secret")
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("h1")).to_have_text("Queue emails")
    (cookie,) = [c for c in await page.context.cookies() if c["name"] == "jobq_session"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui"
    assert cookie["expires"] > datetime.now(UTC).timestamp()
    assert await page.evaluate("document.cookie") == ""  # out of reach of scripts
    assert await page.evaluate("document.documentElement.scrollWidth") <= 390  # with Sign out in its header
    await page.get_by_role("button", name="Pause").click()
    await expect(page.locator(".flash")).to_contain_text("Paused emails")
    assert await db.fetchval("SELECT paused FROM jobq.queues WHERE name = 'emails'") is True

    await page.get_by_role("button", name="Sign out").click()
    await expect(page.locator(".flash")).to_contain_text("Signed out")
    assert [c for c in await page.context.cookies() if c["name"] == "jobq_session"] == []
    await page.goto("/ui")
    await expect(page).to_have_url(re.compile(r"/ui/sign-in\?next=%2Fui$"))


PHONE = 390  # CSS pixels: a phone held upright


async def test_every_page_fits_a_phone(open_page, start_service, db):
    """At 390 px wide no page scrolls sideways: wide tables scroll within themselves, long words wrap."""
    # Gauges and sightings refreshed often: the queues page lists the queue once they were read after it
    # was made, at most a metrics interval later.
    service = start_service(metrics_interval=0.1, push_allowed_urls=[PUSH_PREFIX])
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        long = "x" * 300
        dead = await make_dead(
            client, "emails-to-customers", payload={"body": long}, error=f"smtp said {long}"
        )
        await enqueue(client, "emails-to-customers", {"to": long}, delay=3600, key=long[:200])
        r = await client.patch("/queues/emails-to-customers", json={"key_concurrency": 1, "fair": True})
        assert r.status_code == 200, r.text
        body = {
            "cron": "0 3 1 1 *",
            "timezone": "Europe/Berlin",
            "queue": "emails-to-customers",
            "payload": 1,
        }
        assert (await client.put("/schedules/yearly-report", json=body)).status_code == 200
        await enqueue(client, "emails-to-customers", {"to": "now"})
        assert await lease(client, "emails-to-customers", worker_id=f"host-{long[:60]}:41")
        # A push target with a long URL (a queue of no jobs: nothing is delivered), and a long delivery error.
        r = await client.patch("/queues/pushed-to-customers", json={"push": {"url": f"{PUSH_PREFIX}{long}"}})
        assert r.status_code == 200, r.text
        failed = {"at": "2024-05-01T12:00:00Z", "outcome": "failed", "status": 500, "ms": 12.5}
        failed["error"] = f"HTTP 500: {long}"
        await db.execute("UPDATE jobq.jobs SET delivery = $1::jsonb WHERE id = $2", json.dumps(failed), dead)
        await until(lambda: service.app.state.metrics.gauges.queues)
    page = await open_page(service.url, width=PHONE, height=844)
    wide = {}
    for path in (
        "/ui",
        "/ui/jobs",
        "/ui/jobs?status=dead",
        "/ui/dead",
        f"/ui/jobs/{dead}",
        "/ui/queues/emails-to-customers",
        "/ui/queues/emails-to-customers/keys",
        "/ui/queues/pushed-to-customers",
        "/ui/schedules",
        "/ui/workers",
        "/ui/jobs/999999",
    ):
        await page.goto(path)
        width = await page.evaluate("document.documentElement.scrollWidth")
        if width > PHONE:
            wide[path] = width
    await page.goto("/ui")
    await shot(page, "phone-queues")
    await page.goto(f"/ui/jobs/{dead}")
    await shot(page, "phone-job")
    assert wide == {}


async def test_job_page_shows_steps_events_and_what_it_waits_for(client, db):
    job = (await client.post("/jobs", json={"queue": "orders", "payload": 7})).json()
    (leased,) = (await client.post("/lease", json={"queue": "orders"})).json()["jobs"]
    page = (await client.get(f"/ui/jobs/{job['id']}")).text
    assert "<h2>Steps" not in page and "<h2>Events</h2>" not in page
    for name, result in (("charge", {"id": "<script>x</script>"}), ("note", None)):
        body = {"lease_token": leased["lease_token"], "name": name, "result": result}
        assert (await client.post(f"/jobs/{job['id']}/steps", json=body)).status_code == 200
    body = {"lease_token": leased["lease_token"], "event": "paid:<7>", "timeout": 3600}
    assert (await client.post(f"/jobs/{job['id']}/await", json=body)).json()["status"] == "waiting"

    page = (await client.get(f"/ui/jobs/{job['id']}")).text
    assert '<span class="status waiting">waiting</span>' in page
    assert '<th>Waits for</th><td>event <code class="event">paid:&lt;7&gt;</code>, until' in page
    steps = page[page.index("<h2>Steps (2)</h2>") : page.index("<h2>Payload</h2>")]
    assert "<code>charge</code>" in steps and "&lt;script&gt;x&lt;/script&gt;" in steps
    assert "<script>x" not in steps and '<code>note</code></th><td><pre class="outcome">null</pre>' in steps

    await client.post("/events", json={"name": "paid:<7>", "payload": {"amount": 42}})
    (again,) = (await client.post("/lease", json={"queue": "orders"})).json()["jobs"]
    item = {"id": again["id"], "lease_token": again["lease_token"], "delay": 3600}
    assert (await client.post("/release", json={"items": [item]})).json()["results"][0]["ok"]
    page = (await client.get(f"/ui/jobs/{job['id']}")).text
    assert "<th>Waits for</th><td>sleeps until" in page
    assert '<span class="status scheduled">scheduled</span>' in page and "Run now" in page
    events = page[page.index("<h2>Events</h2>") : page.index("<h2>Payload</h2>")]
    assert "<code>paid:&lt;7&gt;</code>" in events and "&quot;amount&quot;: 42" in events
