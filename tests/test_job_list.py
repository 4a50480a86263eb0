"""GET /jobs: jobs of every status, filtered, searched and paged newest first (API additions, part 5)."""

import pytest
from helpers import assert_problem, enqueue, lease_one, make_dead

from app.jobs import operators

pytestmark = pytest.mark.anyio


async def listed(client, **params) -> dict:
    r = await client.get("/jobs", params=params)
    assert r.status_code == 200, r.text
    return r.json()


async def ids(client, **params) -> list[int]:
    return [job["id"] for job in (await listed(client, **params))["jobs"]]


async def test_every_status_newest_first_and_each_filter(client):
    pending = (await enqueue(client, "mail", {"to": "ada@example.com"}, kind="send", key="ada"))["id"]
    other = (await enqueue(client, "mail", {"to": "bob@example.com"}, kind="send", key="bob"))["id"]
    running = (
        await enqueue(client, "mail", {"to": "cy"}, kind="digest", dedup_key="Weekly-Digest", priority=-1)
    )["id"]
    await lease_one(client, "mail", running)
    dead = await make_dead(client, "reports", error="Timeout talking to S3", kind="build")
    cancelled = (await enqueue(client, "reports", "x", run_at="2099-01-01T00:00:00Z"))["id"]
    assert (await client.delete(f"/jobs/{cancelled}")).status_code == 200

    assert await ids(client) == [cancelled, dead, running, other, pending]
    page = await listed(client)
    assert page["next_before_id"] is None
    assert [job["status"] for job in page["jobs"]] == ["cancelled", "dead", "running", "pending", "pending"]
    assert page["jobs"][1]["last_error"] == "Timeout talking to S3" and page["jobs"][1]["kind"] == "build"

    assert await ids(client, queue="mail") == [running, other, pending]
    assert await ids(client, status="pending") == [other, pending]
    assert await ids(client, status="running") == [running]
    assert await ids(client, queue="reports", status="dead") == [dead]
    assert await ids(client, kind="send") == [other, pending]
    assert await ids(client, key="ada") == [pending]
    assert await ids(client, queue="mail", kind="send", key="bob") == [other]
    assert await ids(client, status="completed") == []
    # The search: payload text, last error and dedup_key, in any case; LIKE's own characters are literal.
    assert await ids(client, q="ADA@example") == [pending]
    assert await ids(client, q="timeout") == [dead]
    assert await ids(client, q="weekly-digest") == [running]
    assert await ids(client, q="example.com", queue="mail") == [other, pending]
    assert await ids(client, q="%") == [] and await ids(client, q="_") == []


async def test_pages_follow_next_before_id_to_the_end(client):
    made = [
        job["id"]
        for job in (
            await client.post("/jobs/batch", json={"jobs": [{"queue": "p", "payload": i} for i in range(7)]})
        ).json()["jobs"]
    ]
    seen, before = [], None
    while True:
        page = await listed(client, queue="p", limit=3, **({"before_id": before} if before else {}))
        seen += [job["id"] for job in page["jobs"]]
        before = page["next_before_id"]
        if before is None:
            break
        assert len(page["jobs"]) == 3
    assert seen == sorted(made, reverse=True)


async def test_a_page_reads_a_bounded_window_and_says_where_to_go_on(client, db, monkeypatch):
    """A rare match among many jobs: each page reads at most LIST_SCAN jobs, comes back short (or empty)
    with the window's oldest id, and following it finds the match without skipping or repeating."""
    monkeypatch.setattr(operators, "LIST_SCAN", 5)
    rare = (await enqueue(client, "w", "needle"))["id"]
    for i in range(12):
        await enqueue(client, "w", f"hay {i}")
    pages, found, before = 0, [], None
    while True:
        page = await listed(client, q="needle", **({"before_id": before} if before else {}))
        pages += 1
        found += [job["id"] for job in page["jobs"]]
        before = page["next_before_id"]
        if before is None:
            break
    assert found == [rare] and pages == 3  # 13 jobs in windows of 5
    empty = await listed(client, q="needle")
    assert empty["jobs"] == [] and empty["next_before_id"] == rare + 8  # the 5 newest read, none matched


async def test_bad_filters_are_refused_in_words(client):
    await enqueue(client, "q")
    r = await client.get("/jobs", params={"status": "finished"})
    body = assert_problem(r, 422, "validation_error")
    assert "pending" in r.text and "status" in r.text, body
    assert_problem(await client.get("/jobs", params={"limit": 501}), 422, "validation_error")
    assert_problem(await client.get("/jobs", params={"q": ""}), 422, "validation_error")
    assert_problem(await client.get("/jobs", params={"sort": "id"}), 422, "validation_error")
    r = await client.get("/jobs", params={"queue": "nosuch"})
    assert_problem(r, 404, "not_found")
    assert "nosuch" in r.json()["detail"]
