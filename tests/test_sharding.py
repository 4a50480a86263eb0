"""Ready for a distributed jobs table (README: Scaling out): every claim, and every read of one queue's
keys, touches the rows of one queue only, found by equality on the queue (a router query under Citus
with the jobs distributed by `queue`). Read from PostgreSQL's own plans of the statements."""

from __future__ import annotations

import json

import pytest

from app import queries as q

pytestmark = pytest.mark.anyio

# Each statement with arguments that make it do its whole work.
ONE_QUEUE = {
    "lease": (q.LEASE, {"queue": "q", "worker_ids": ["w", "w"], "visibility_timeouts": [30.0, 30.0]}),
    "lease_flow": (
        q.LEASE_FLOW,
        {"queue": "q", "worker_ids": ["w"], "keys": ["k"], "lookahead": 10, "visibility_timeouts": [30.0]},
    ),
    "lease_flow_rated": (
        q.LEASE_FLOW_RATED,
        {"queue": "q", "worker_ids": ["w"], "keys": ["k"], "lookahead": 10, "visibility_timeouts": [30.0]},
    ),
    "flow_keys": (q.FLOW_KEYS, {"queue": "q", "after": "", "scan": 10, "reach": 10}),
    "flow_keys_rated": (q.FLOW_KEYS_RATED, {"queue": "q", "after": "", "scan": 10, "reach": 10}),
}
# jobq's tables a distributed schema would split by queue, and the column that holds it in each.
BY_QUEUE = {"jobs": "queue", "keys": "queue", "queues": "name"}


def scans(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from scans(child)


@pytest.mark.parametrize("name", sorted(ONE_QUEUE))
async def test_a_claim_reads_one_queue_by_equality(name, db):
    query, args = ONE_QUEUE[name]
    # Planned on a table with jobs in it, of two queues, as a claim is in service (on an empty table
    # PostgreSQL may join whole indexes instead).
    await db.execute("INSERT INTO jobq.queues (name, key_concurrency) VALUES ('q', 1), ('other', 1)")
    await db.execute(
        "INSERT INTO jobq.jobs (queue, key, payload) SELECT CASE WHEN g % 2 = 0 THEN 'q' ELSE 'other' END,"
        " 'k' || (g % 100), '{}' FROM generate_series(1, 5000) g"
    )
    await db.execute("ANALYZE jobq.jobs")
    async with db.transaction():  # the claims change rows: planned, not run
        (plan,) = json.loads(await db.fetchval(f"EXPLAIN (FORMAT JSON) {query.text}", *query.args(**args)))
    touched = [
        node
        for node in scans(plan["Plan"])
        if node.get("Relation Name") in BY_QUEUE
        and node["Node Type"] != "ModifyTable"  # its scans are checked
    ]
    assert touched
    for node in touched:
        column = BY_QUEUE[node["Relation Name"]]
        conditions = " ".join(node.get(k, "") for k in ("Index Cond", "Recheck Cond", "Filter"))
        # A job found by a scan of its queue may be looked up again by id in the same statement (to lock
        # it, to update it): a lookup of one row, on the shard the statement is routed to. Naming its
        # queue there too made PostgreSQL plan the claims ten times slower (a scan of the queue's index).
        looked_up = node.get("Index Cond", "").startswith("(id = ")
        assert f"{column} = " in conditions or looked_up, (
            f"{node['Node Type']} on {node['Relation Name']}: {conditions}"
        )
