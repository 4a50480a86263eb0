"""Ready for a distributed jobs table (docs/operations/scaling.md): every claim, every read of one
queue's keys, and every statement that ends or extends a lease touches the rows of one queue only,
found by equality on the queue (a router query under Citus with the jobs distributed by `queue`).
Read from PostgreSQL's own plans of the statements."""

from __future__ import annotations

import json

import pytest

from app.db import sql as q
from tests.helpers import front_claim_statements, index_columns

pytestmark = pytest.mark.anyio

FRONT, FRONT_LEASE = front_claim_statements()
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
    "flow_front": (FRONT, {"queue": "q", "lookahead": 10}),
    "flow_front_lease": (
        FRONT_LEASE,
        {"queue": "q", "worker_ids": ["w"], "ids": [2], "keys": ["k2"], "visibility_timeouts": [30.0]},
    ),
    "flow_keys": (q.FLOW_KEYS, {"queue": "q", "after": "", "scan": 10, "reach": 10}),
    "flow_keys_rated": (q.FLOW_KEYS_RATED, {"queue": "q", "after": "", "scan": 10, "reach": 10}),
}
# The statements that end or extend leases: each item names its job by queue and id (the queue from its
# lease token), so every scan of jobs has the queue too.
TOKEN = "00000000-0000-4000-8000-000000000000"
BY_LEASE = {
    "ack": (
        q.ACK,
        {"ids": [1], "queues": ["q"], "lease_tokens": [TOKEN], "results": None, "deliveries": None},
    ),
    "nack": (
        q.NACK,
        {
            "ids": [1],
            "queues": ["q"],
            "lease_tokens": [TOKEN],
            "errors": [None],
            "retry_afters": [None],
            "deads": [False],
            "deliveries": None,
        },
    ),
    "release": (
        q.RELEASE,
        {"ids": [1], "queues": ["q"], "lease_tokens": [TOKEN], "delays": None, "deliveries": None},
    ),
    "extend": (
        q.EXTEND,
        {"id": 1, "queue": "q", "lease_token": TOKEN, "visibility_timeout": 30.0, "progress": None},
    ),
}
# jobq's tables a distributed schema would split by queue, and the column that holds it in each.
BY_QUEUE = {"jobs": "queue", "keys": "queue", "push_holds": "queue", "queues": "name"}


JOIN_CONDITIONS = ("Hash Cond", "Merge Cond", "Join Filter")


def scans(plan: dict, joined: str = ""):
    """Every node of `plan`, with its conditions: its own, and those of the join it feeds (a hash or
    merge join matches a scan's rows to the items by the join's condition; a Hash node passes it on)."""
    yield plan, f"{conditions(plan)} {joined}"
    through = joined if plan["Node Type"] == "Hash" else " ".join(plan.get(k, "") for k in JOIN_CONDITIONS)
    for child in plan.get("Plans", []):
        yield from scans(child, through)


async def planned_scans(db, query, args) -> list[tuple[dict, str]]:
    """The scans of jobq's tables in the plan of `query`, with their conditions, planned on a table with
    jobs in it, of two queues, as in service (on an empty table PostgreSQL may join whole indexes
    instead)."""
    await db.execute("INSERT INTO jobq.queues (name, key_concurrency) VALUES ('q', 1), ('other', 1)")
    await db.execute(
        "INSERT INTO jobq.jobs (queue, key, payload) SELECT CASE WHEN g % 2 = 0 THEN 'q' ELSE 'other' END,"
        " 'k' || (g % 100), '{}' FROM generate_series(1, 5000) g"
    )
    await db.execute("ANALYZE jobq.jobs")
    async with db.transaction():  # the statements change rows: planned, not run
        (plan,) = json.loads(await db.fetchval(f"EXPLAIN (FORMAT JSON) {query.text}", *query.args(**args)))
    touched = [
        (node, conds)
        for node, conds in scans(plan["Plan"])
        if node.get("Relation Name") in BY_QUEUE
        and node["Node Type"] != "ModifyTable"  # its scans are checked
    ]
    assert touched
    return touched


def conditions(node: dict) -> str:
    return " ".join(node.get(k, "") for k in ("Index Cond", "Recheck Cond", "Filter"))


@pytest.mark.parametrize("name", sorted(BY_LEASE))
async def test_ending_or_extending_a_lease_reads_one_queue_by_equality(name, db):
    query, args = BY_LEASE[name]
    for node, conds in await planned_scans(db, query, args):
        column = BY_QUEUE[node["Relation Name"]]
        assert f"{column} = " in conds, f"{node['Node Type']} on {node['Relation Name']}: {conds}"


@pytest.mark.parametrize("name", sorted(ONE_QUEUE))
async def test_a_claim_reads_one_queue_by_equality(name, db):
    query, args = ONE_QUEUE[name]
    for node, conds in await planned_scans(db, query, args):
        column = BY_QUEUE[node["Relation Name"]]
        # A job found by a scan of its queue may be looked up again by id in the same statement (to lock
        # it, to update it): a lookup of one row, on the shard the statement is routed to. Naming its
        # queue there too lets PostgreSQL plan the claims badly (app/db/sql/claim.py, LEASE).
        looked_up = node.get("Index Cond", "").startswith("(id = ")
        where = f"{node['Node Type']} on {node['Relation Name']}: {conds}"
        assert f"{column} = " in conds or looked_up, where


# The tables a distributed schema splits by queue, with their queue column; a unique index of such a
# table must hold it (Citus enforces uniqueness within a shard only).
DISTRIBUTED = {"jobs": "queue", "jobs_history": "queue", "keys": "queue", "queues": "name"}


async def test_every_unique_index_of_a_table_split_by_queue_holds_the_queue(db):
    rows = await index_columns(db, "i.indisunique AND t.relname = ANY($1::text[])", list(DISTRIBUTED))
    assert {r["table_name"] for r in rows} == set(DISTRIBUTED)
    lacking = [
        (r["table_name"], r["index_name"]) for r in rows if DISTRIBUTED[r["table_name"]] not in r["columns"]
    ]
    # jobs' primary key stays on id on one server, since the claims' plans rely on it (app/db/sql/claim.py,
    # LEASE); uq_jobs_queue_id is the key a distributed table would have.
    assert lacking == [("jobs", "pk_jobs")]
    keys = {
        r["index_name"]: r["columns"]
        for r in rows
        if r["index_name"] in ("uq_jobs_queue_id", "pk_jobs_history")
    }
    assert keys == {"uq_jobs_queue_id": ["queue", "id"], "pk_jobs_history": ["queue", "id", "purge_after"]}
