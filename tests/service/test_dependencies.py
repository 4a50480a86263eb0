"""Dependencies (API part 6): a job with parents waits, and is decided once, when its last parent ends, by
`run_if` (app/db/functions.sql: jobq.add_parents(), jobq.parents_ended(), jobq.decide(); the triggers
parent_dead and parent_gone). Called through the service on a real database, without HTTP."""

from __future__ import annotations

import asyncio

import asyncpg
import orjson
import pytest

from app import service
from app.core.errors import Invalid, NotFound
from app.service import workflows
from app.service.arguments import WorkflowJob
from tests.helpers import count, db_now, row, status_of
from tests.service.calls import ack, enqueue, expire, held, lease, lease_one, make_dead, nack
from tests.waiting import until

pytestmark = pytest.mark.anyio


async def child_of(runtime, *parents: int, run_if: str | None = None, queue: str = "c", **fields) -> dict:
    return await enqueue(
        runtime, queue, {"after": list(parents)}, depends_on=list(parents), run_if=run_if, **fields
    )


async def run_to_completion(runtime, queue: str = "q") -> int:
    """Lease the queue's one ready job and ack it; its id."""
    leased = await lease_one(runtime, queue)
    await ack(runtime, held(leased))
    return leased["id"]


async def bookkeeping(db: asyncpg.Connection) -> tuple[int, int]:
    """Rows left in jobq.job_edges and jobq.job_waits: none once every child is decided."""
    return (
        await db.fetchval("SELECT count(*) FROM jobq.job_edges"),
        await db.fetchval("SELECT count(*) FROM jobq.job_waits"),
    )


# --- waiting, then decided -------------------------------------------------------------------------


async def test_a_child_waits_for_its_parent_and_runs_once_it_completes(runtime, db):
    parent = await enqueue(runtime)
    child = await child_of(runtime, parent["id"])
    assert (child["status"], child["depends_on"], child["run_if"]) == ("waiting", [parent["id"]], "completed")
    assert await lease(runtime, "c") == []  # a waiting job is never leased
    await run_to_completion(runtime)
    assert await status_of(db, child["id"]) == "pending"
    assert (await lease_one(runtime, "c"))["id"] == child["id"]
    assert await bookkeeping(db) == (0, 0)


async def test_a_fan_in_child_is_decided_by_its_last_parent_alone(runtime, db):
    parents = [await enqueue(runtime) for _ in range(3)]
    child = await child_of(runtime, *(p["id"] for p in parents))
    for _ in range(2):
        await run_to_completion(runtime)
        assert await status_of(db, child["id"]) == "waiting"
    await run_to_completion(runtime)
    assert await status_of(db, child["id"]) == "pending"


@pytest.mark.parametrize(
    ("run_if", "parent_ends", "child_becomes"),
    [
        ("completed", "completed", "pending"),
        ("completed", "dead", "cancelled"),
        ("completed", "cancelled", "cancelled"),
        ("finished", "completed", "pending"),
        ("finished", "dead", "pending"),
        ("finished", "cancelled", "pending"),
        ("failed", "completed", "cancelled"),
        ("failed", "dead", "pending"),
        ("failed", "cancelled", "pending"),
    ],
)
async def test_run_if_decides_by_how_the_parents_ended(runtime, db, run_if, parent_ends, child_becomes):
    done = await enqueue(runtime, "done")
    await run_to_completion(runtime, "done")
    parent = await enqueue(runtime, max_attempts=1)
    child = await child_of(runtime, done["id"], parent["id"], run_if=run_if)
    assert await status_of(db, child["id"]) == "waiting"
    if parent_ends == "completed":
        await run_to_completion(runtime)
    elif parent_ends == "dead":
        await nack(runtime, await lease_one(runtime), error="boom")
    else:
        await service.cancel(runtime.db, parent["id"])
    assert await status_of(db, parent["id"]) == parent_ends
    assert await status_of(db, child["id"]) == child_becomes
    if child_becomes == "cancelled":
        last_error = (await row(db, child["id"]))["last_error"]
        if run_if == "failed":
            assert (
                last_error == f"cancelled: no parent failed (run_if failed; the last was job {parent['id']})"
            )
        else:
            assert last_error == f"cancelled: parent job {parent['id']} is {parent_ends} (run_if completed)"
    assert await bookkeeping(db) == (0, 0)


@pytest.mark.parametrize("parent_ends", ["completed", "dead", "cancelled"])
@pytest.mark.parametrize("run_if", ["completed", "finished", "failed"])
async def test_a_child_of_one_parent_is_decided_by_its_end(runtime, db, run_if, parent_ends):
    """A child of a single parent keeps no count (no job_waits row): the end of that parent, which takes
    its only edge, decides it, by the same rules."""
    parent = await enqueue(runtime, max_attempts=1)
    child = await child_of(runtime, parent["id"], run_if=run_if)
    assert await bookkeeping(db) == (1, 0)
    if parent_ends == "completed":
        await run_to_completion(runtime)
    elif parent_ends == "dead":
        await nack(runtime, await lease_one(runtime), error="boom")
    else:
        await service.cancel(runtime.db, parent["id"])
    runs = {"completed": parent_ends == "completed", "finished": True, "failed": parent_ends != "completed"}
    assert await status_of(db, child["id"]) == ("pending" if runs[run_if] else "cancelled")
    if not runs[run_if] and run_if == "completed":
        last_error = (await row(db, child["id"]))["last_error"]
        assert last_error == f"cancelled: parent job {parent['id']} is {parent_ends} (run_if completed)"
    assert await bookkeeping(db) == (0, 0)


async def test_parents_already_ended_decide_the_child_at_enqueue(runtime, db):
    done = await enqueue(runtime)
    await run_to_completion(runtime)
    dead = await make_dead(runtime, "d")
    assert (await child_of(runtime, done["id"]))["status"] == "pending"
    cancelled = await child_of(runtime, done["id"], dead)
    assert cancelled["status"] == "cancelled"
    assert cancelled["last_error"] == f"cancelled: parent job {dead} is dead (run_if completed)"
    assert (await child_of(runtime, dead, run_if="failed"))["status"] == "pending"
    assert await bookkeeping(db) == (0, 0)


async def test_a_delay_counts_from_the_decision(runtime, db):
    parent = await enqueue(runtime)
    child = await child_of(runtime, parent["id"], delay=600)
    await asyncio.sleep(0.2)
    await run_to_completion(runtime)
    decided = await db_now(db)
    run_at = (await row(db, child["id"]))["run_at"]
    assert 599 <= (run_at - decided).total_seconds() <= 601


async def test_an_attempt_that_fails_with_attempts_left_decides_nothing(runtime, db):
    parent = await enqueue(runtime, max_attempts=3)
    child = await child_of(runtime, parent["id"])
    await nack(runtime, await lease_one(runtime), error="try again", retry_after=0)
    leased = await lease_one(runtime)
    await expire(db, leased["id"])
    assert [r["status"] for r in await service.expire_leases(runtime)] == ["pending"]
    assert await status_of(db, child["id"]) == "waiting"
    assert await bookkeeping(db) == (1, 0)  # its edge; a child of one parent has no count to keep


async def test_a_retried_dead_parent_does_not_reopen_its_decided_children(runtime, db):
    parent = await enqueue(runtime, max_attempts=1)
    child = await child_of(runtime, parent["id"])
    await nack(runtime, await lease_one(runtime), error="boom")
    assert await status_of(db, child["id"]) == "cancelled"
    assert (await service.retry_dead(runtime.db, [parent["id"]], None))["retried"] == 1
    await run_to_completion(runtime)
    assert await status_of(db, parent["id"]) == "completed"
    assert await status_of(db, child["id"]) == "cancelled"


# --- cancellation reaching descendants -----------------------------------------------------------


async def test_a_dead_parent_cancels_its_grandchildren_through_the_chain(runtime, db):
    parent = await enqueue(runtime, max_attempts=1)
    chain = [parent["id"]]
    for _ in range(50):
        chain.append((await child_of(runtime, chain[-1]))["id"])
    await nack(runtime, await lease_one(runtime), error="boom")
    statuses = [await status_of(db, job_id) for job_id in chain]
    assert statuses == ["dead"] + ["cancelled"] * 50
    last_errors = [(await row(db, job_id))["last_error"] for job_id in chain[1:3]]
    assert last_errors == [
        f"cancelled: parent job {chain[0]} is dead (run_if completed)",
        f"cancelled: parent job {chain[1]} is cancelled (run_if completed)",
    ]
    assert await bookkeeping(db) == (0, 0)


async def test_cancelling_a_waiting_job_decides_its_own_children(runtime, db):
    parent = await enqueue(runtime)
    middle = await child_of(runtime, parent["id"])
    runs_anyway = await child_of(runtime, middle["id"], run_if="finished")
    cancelled = await child_of(runtime, middle["id"])
    assert (await service.cancel(runtime.db, middle["id"]))["status"] == "cancelled"
    assert await status_of(db, runs_anyway["id"]) == "pending"
    assert await status_of(db, cancelled["id"]) == "cancelled"
    # The cancelled job's parent ending later finds nothing left to decide.
    await run_to_completion(runtime)
    assert await status_of(db, middle["id"]) == "cancelled"
    assert await bookkeeping(db) == (0, 0)


async def test_a_deleted_parent_counts_as_cancelled(runtime, db):
    parent = await enqueue(runtime, "doomed")
    child = await child_of(runtime, parent["id"], run_if="failed")
    async with runtime.db.acquire() as conn:
        await conn.execute("DELETE FROM jobq.jobs WHERE id = $1", parent["id"])
    assert await status_of(db, child["id"]) == "pending"


# --- refusals ----------------------------------------------------------------------------------


async def test_unknown_parents_are_named_and_nothing_is_enqueued(runtime, db):
    parent = await enqueue(runtime)
    jobs = [
        service.NewJob("c", 1),
        service.NewJob("c", 2, depends_on=[parent["id"], 987_654_321, 987_654_322]),
    ]
    with pytest.raises(Invalid, match="depends_on names jobs that do not exist: 987654321, 987654322"):
        await service.enqueue_batch(runtime, jobs)
    assert await count(db, "queue = 'c'") == 0
    assert await db.fetchval("SELECT has_children FROM jobq.jobs WHERE id = $1", parent["id"]) is False


async def test_sql_enqueue_takes_parents_and_refuses_a_dedup_key_with_them(runtime, db):
    parent = await enqueue(runtime)
    child = await db.fetchval(
        "SELECT jobq.enqueue('c', '{}', depends_on => ARRAY[$1::bigint], run_if => 'finished')", parent["id"]
    )
    assert (await row(db, child))["run_if"] == "finished"
    assert await status_of(db, child) == "waiting"
    with pytest.raises(asyncpg.InvalidParameterValueError, match="takes no dedup_key"):
        await db.fetchval(
            "SELECT jobq.enqueue('c', '{}', dedup_key => 'd', depends_on => ARRAY[$1::bigint])", parent["id"]
        )
    await run_to_completion(runtime)
    assert await status_of(db, child) == "pending"


# --- at once --------------------------------------------------------------------------------------


async def test_many_parents_acked_at_once_decide_their_child_once(runtime, db):
    parents = [
        j["id"] for j in await service.enqueue_batch(runtime, [service.NewJob("q", i) for i in range(200)])
    ]
    children = await service.enqueue_batch(
        runtime, [service.NewJob("c", i, depends_on=parents) for i in range(3)]
    )
    leased = await lease(runtime, max_jobs=200)
    assert len(leased) == 200
    # Sixteen clients ack their share at the same moment, each in batches of its own.
    shares = [leased[i::16] for i in range(16)]
    await asyncio.gather(*(service.ack_batch(runtime, [held(j) for j in share]) for share in shares))
    assert [await status_of(db, c["id"]) for c in children] == ["pending"] * 3
    assert await bookkeeping(db) == (0, 0)


async def test_parents_shared_by_children_end_at_once_without_deadlock(runtime, db):
    """Two parents, each acked in its own transaction at the same moment, share a hundred children: each
    end locks the children it counts down in id order, so neither waits for the other in a circle."""
    for _ in range(5):
        a, b = await enqueue(runtime), await enqueue(runtime)
        children = await service.enqueue_batch(
            runtime, [service.NewJob("c", i, depends_on=[a["id"], b["id"]]) for i in range(100)]
        )
        first, second = await lease(runtime, max_jobs=2)
        await asyncio.gather(ack(runtime, held(first)), ack(runtime, held(second)))
        statuses = {await status_of(db, c["id"]) for c in children}
        assert statuses == {"pending"}
        await lease(runtime, "c", max_jobs=100)
    assert await bookkeeping(db) == (0, 0)


async def test_children_linked_while_their_parents_end_in_another_order_do_not_deadlock(
    runtime, db, database_url
):
    """Linking children locks their parents in id order (jobq.add_parents()); a statement that ends many
    parents (an ack of a batch) takes their rows in whatever order its plan meets them. Made to cross
    here: the linking holds the lower half and waits for the middle parent, which the ender, having
    deleted the upper half, waits for too. The linking gives up within its lock_timeout rather than
    deadlock the ender, and the service links the children again, after the ender committed."""
    KILL = "UPDATE jobq.jobs SET status = 'dead' WHERE id = $1"  # noqa: N806 - a statement, as a constant
    parents = sorted(
        j["id"] for j in await service.enqueue_batch(runtime, [service.NewJob("q", i) for i in range(200)])
    )
    middle = parents[100]
    leased = {j["id"]: j for j in await lease(runtime, max_jobs=200)}  # running, as parents being ended are
    ender = await asyncpg.connect(database_url)
    watch = await asyncpg.connect(database_url)

    async def waiting_for_a_row(what: str) -> bool:
        return bool(
            await watch.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1",
                f"%{what}%",
            )
        )

    try:
        blocker = db.transaction()
        await blocker.start()
        await db.execute("SELECT 1 FROM jobq.jobs WHERE id = $1 FOR NO KEY UPDATE", middle)
        children = asyncio.ensure_future(
            service.enqueue_batch(
                runtime, [service.NewJob("c", i, depends_on=parents, run_if="finished") for i in range(5)]
            )
        )
        await until(lambda: waiting_for_a_row("add_parents"))
        ending = ender.transaction()
        await ending.start()
        for parent in reversed(parents[101:]):
            await ender.execute(KILL, parent)
        killing = asyncio.ensure_future(ender.execute(KILL, middle))
        await until(lambda: waiting_for_a_row(KILL))
        await blocker.rollback()
        await killing  # no deadlock_detected: the linking gave way
        await ending.commit()
        made = await children
    finally:
        await ender.close()
        await watch.close()
    assert {await status_of(db, c["id"]) for c in made} == {"waiting"}
    await service.ack_batch(runtime, [held(leased[p]) for p in parents[:100]])
    assert {await status_of(db, c["id"]) for c in made} == {"pending"}
    assert await bookkeeping(db) == (0, 0)


# --- workflows outliving their jobs ----------------------------------------------------------------


async def test_a_workflow_goes_once_its_jobs_are_all_pruned(runtime, db):
    async def made(queue: str) -> int:
        jobs = [WorkflowJob(ref="a", queue=queue, payload=1)]
        return orjson.loads(orjson.dumps(await workflows.create_workflow(runtime, None, jobs)))["id"]

    done, live = await made("q"), await made("r")
    await run_to_completion(runtime, "q")
    for workflow in (done, live):
        await workflows.get_workflow(runtime, workflow)  # its status brought up to date
    assert await workflows.prune_workflows(runtime.db) == 0  # the finished one's job is still kept
    await db.execute("UPDATE jobq.jobs_history SET purge_after = now() - interval '1 second'")
    assert await workflows.prune_workflows(runtime.db) == 1
    assert await db.fetchval("SELECT array_agg(id) FROM jobq.workflows") == [live]
    with pytest.raises(NotFound):
        await workflows.get_workflow(runtime, done)
