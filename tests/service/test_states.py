"""The job state machine, table-driven: every statement that changes a job's status, run against a job in
every status on a real database, lands where app/core/states.py ``MOVES`` says, and no other statement
changes a status.

``CASES`` runs each statement of ``MOVES`` (some more than once: a case of each way it moves a status), and
its expected outcome is read from ``MOVES``: for each status, where the statement moves a job of it (GONE:
the row is deleted); a status ``MOVES`` does not name for it, it must leave alone. Every move of ``MOVES``
must be run by some case. A statement added to app/db/sql that writes a status fails
``test_every_status_change_is_in_the_table`` until ``MOVES`` has it, and the table in app/core/states.py's
docstring must say the same as ``MOVES``."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from app.core import states
from app.core.limits import MAX_JOB_ID
from app.core.states import JobStatus
from app.db import sql as q

pytestmark = pytest.mark.anyio

WAITING, PENDING, RUNNING, COMPLETED, DEAD, CANCELLED = JobStatus
GONE = "(deleted)"
QUEUE = "q"
TOKEN = uuid.UUID("00000000-0000-4000-8000-000000000001")

Run = Callable[[asyncpg.Connection, int], Awaitable[Any]]


def statement(query: q.Query, **args: Any) -> Run:
    """Run `query` with `args`; `:id` (or `:ids`) is the job's, `:queue(s)` its queue, `:lease_token(s)`
    the job's token."""

    async def run(conn: asyncpg.Connection, job_id: int) -> Any:
        given = dict(args)
        for name, value in {
            "id": job_id,
            "ids": [job_id],
            "queue": QUEUE,
            "queues": [QUEUE],
            "lease_token": TOKEN,
            "lease_tokens": [TOKEN],
            "deliveries": None,  # a push delivery's outcome: none, as for a worker's calls
            "delays": None,
        }.items():
            if name in query.params and name not in given:
                given[name] = value
        return await conn.fetch(query.text, *query.args(**given))

    return run


async def delete_queue(conn: asyncpg.Connection, job_id: int) -> None:
    async with conn.transaction():
        await statement(q.LOCK_QUEUE, queue=QUEUE)(conn, job_id)
        await statement(q.DELETE_QUEUE, queue=QUEUE)(conn, job_id)


@dataclass
class Case:
    query: q.Query | None  # None: an SQL function of app/db/functions.sql, named `jobq.<name>()`
    run: Run
    # Which of the statement's moves this case makes, where it moves a status more than one way (the
    # `when` of those moves); None: every move of the statement.
    when: str | None = None
    # Run first, against the job: what the case needs of it (a last attempt, an expired lease).
    given: str | None = None
    # The statement makes a job when it finds none to act on (a debounced enqueue): one more row is no
    # sign of a statement touching what it should not.
    makes: bool = False


def lease_flow(walk: q.Query, claim: q.Query) -> Run:
    async def run(conn: asyncpg.Connection, job_id: int) -> None:
        async with conn.transaction():
            looked = await statement(walk, queue=QUEUE, after="", scan=10, reach=40)(conn, job_id)
            keys = [r["key"] for r in looked if r["locked"]]
            await statement(
                claim, queue=QUEUE, keys=keys, visibility_timeouts=[30.0], worker_ids=["w"], lookahead=10
            )(conn, job_id)

    return run


LEASE_FLOW_FRONT = statement(
    q.LEASE_FLOW_FRONT, queue=QUEUE, lookahead=10, visibility_timeouts=[30.0], worker_ids=["w"], per_key=1
)
FLOW = "UPDATE jobq.queues SET flow = true, key_concurrency = 1"
REDRIVE = '{"deadLetterTargetArn": "arn:aws:sqs:us-east-1:000000000000:dlq", "maxReceiveCount": 1}'
COLUMNS = ", ".join(q.JOB_COLUMNS)
# A finished job where an older release leaves it: in jobq.jobs.
FINISHED_IN_JOBS = f"""
    WITH moved AS (DELETE FROM jobq.jobs_history RETURNING *)
    INSERT INTO jobq.jobs ({COLUMNS}) SELECT {COLUMNS} FROM moved
"""


DEBOUNCED_ARGS = dict(
    payload="{}",
    priority=None,
    seconds=60.0,
    max_attempts=None,
    kind=None,
    job_key=None,
    traceparent=None,
    tracestate=None,
    debounce_key="d",
    max_seconds=None,
)


async def decide(conn: asyncpg.Connection, job_id: int) -> None:
    """Decide the job as the end of its last parent (job 1, completed) does."""
    await conn.execute("SELECT jobq.decide(ARRAY[$1::bigint], NULL, NULL, ARRAY[1::bigint], NULL)", job_id)


async def decide_failed(conn: asyncpg.Connection, job_id: int) -> None:
    """Decide the job as the end of its last parent (job 1, dead) does."""
    await conn.execute(
        "SELECT jobq.decide(ARRAY[$1::bigint], ARRAY[1::bigint], ARRAY['dead'], ARRAY[1::bigint], NULL)",
        job_id,
    )


async def retry_workflow(conn: asyncpg.Connection, job_id: int) -> None:
    await conn.execute("SELECT jobq.retry_workflow(1)")


# The job is in workflow 1 (no row of that id is needed: nothing joins it).
IN_WORKFLOW = "UPDATE jobq.jobs SET workflow_id = 1; UPDATE jobq.jobs_history SET workflow_id = 1"

# The job awaits event 'e' (run_at, a second ago, is then the wait's deadline).
AWAITING = "UPDATE jobq.jobs SET wait_event = 'e'"

CASES: dict[str, Case] = {
    "LEASE": Case(q.LEASE, statement(q.LEASE, queue=QUEUE, visibility_timeouts=[30.0], worker_ids=["w"])),
    "LEASE_FLOW": Case(q.LEASE_FLOW, lease_flow(q.FLOW_KEYS, q.LEASE_FLOW), given=FLOW),
    "LEASE_FLOW with a key": Case(
        q.LEASE_FLOW, lease_flow(q.FLOW_KEYS, q.LEASE_FLOW), given=f"{FLOW}; UPDATE jobq.jobs SET key = 'k'"
    ),
    "LEASE_FLOW_FRONT": Case(q.LEASE_FLOW_FRONT, LEASE_FLOW_FRONT, given=FLOW),
    "LEASE_FLOW_FRONT with a key": Case(
        q.LEASE_FLOW_FRONT, LEASE_FLOW_FRONT, given=f"{FLOW}; UPDATE jobq.jobs SET key = 'k'"
    ),
    "LEASE_FLOW_RATED with a key": Case(
        q.LEASE_FLOW_RATED,
        lease_flow(q.FLOW_KEYS_RATED, q.LEASE_FLOW_RATED),
        given=f"{FLOW}, rate_limit = 5, rate_period = 1, key_rate_limit = 1, key_rate_period = 1;"
        " UPDATE jobq.jobs SET key = 'k'",
    ),
    "ACK": Case(q.ACK, statement(q.ACK, results=None)),
    "ACK with a result": Case(q.ACK, statement(q.ACK, results=['{"n": 1}'])),
    "NACK": Case(
        q.NACK, statement(q.NACK, errors=["e"], retry_afters=[0.0], deads=[False]), when="attempts left"
    ),
    "NACK dead": Case(
        q.NACK,
        statement(q.NACK, errors=["e"], retry_afters=[None], deads=[True]),
        when="dead, or out of attempts",
    ),
    "NACK out of attempts": Case(
        q.NACK,
        statement(q.NACK, errors=["e"], retry_afters=[None], deads=[False]),
        when="dead, or out of attempts",
        given="UPDATE jobq.jobs SET max_attempts = attempts",
    ),
    "RELEASE": Case(q.RELEASE, statement(q.RELEASE)),
    "EXTEND": Case(q.EXTEND, statement(q.EXTEND, visibility_timeout=60.0, progress=None)),
    "EXTEND with progress": Case(q.EXTEND, statement(q.EXTEND, visibility_timeout=60.0, progress="0.5")),
    "EXPIRE_LEASES": Case(
        q.EXPIRE_LEASES,
        statement(q.EXPIRE_LEASES, batch=10),
        when="attempts left",
        given="UPDATE jobq.jobs SET lease_expires_at = now() - interval '1 second'",
    ),
    "EXPIRE_LEASES out of attempts": Case(
        q.EXPIRE_LEASES,
        statement(q.EXPIRE_LEASES, batch=10),
        when="out of attempts",
        given="UPDATE jobq.jobs SET lease_expires_at = now() - interval '1 second', max_attempts = attempts",
    ),
    "REVIVE_LEASE": Case(q.REVIVE_LEASE, statement(q.REVIVE_LEASE, visibility_timeout=30.0)),
    "REDRIVE_DEAD": Case(
        q.REDRIVE_DEAD,
        statement(q.REDRIVE_DEAD, batch=10),
        given=f"""INSERT INTO jobq.queues (name) VALUES ('dlq');
                  UPDATE jobq.queues SET sqs_attributes = jsonb_build_object('RedrivePolicy', '{REDRIVE}')
                  WHERE name = '{QUEUE}'""",
    ),
    "RETURN_DEAD_LETTERS": Case(
        q.RETURN_DEAD_LETTERS,
        statement(q.RETURN_DEAD_LETTERS, dlq=QUEUE, sources=["elsewhere"], batch=10),
        given="INSERT INTO jobq.sqs_dead_letters (job_id, source) SELECT id, 'elsewhere' FROM jobq.jobs",
    ),
    "CANCEL": Case(q.CANCEL, statement(q.CANCEL, scope=None)),
    "CANCEL_JOBS": Case(q.CANCEL_JOBS, statement(q.CANCEL_JOBS, scope=None)),
    "RUN_NOW": Case(
        q.RUN_NOW,
        statement(q.RUN_NOW, scope=None),
        given="UPDATE jobq.jobs SET run_at = now() + interval '1 hour'",
    ),
    "RETRY_DEAD": Case(
        q.RETRY_DEAD, statement(q.RETRY_DEAD, queue=None, before_id=MAX_JOB_ID + 1, batch=10, scope=None)
    ),
    "PURGE_DEAD": Case(q.PURGE_DEAD, statement(q.PURGE_DEAD, scope=None)),
    "PURGE_DEAD_JOBS": Case(q.PURGE_DEAD_JOBS, statement(q.PURGE_DEAD_JOBS, scope=None)),
    "MOVE_FINISHED": Case(
        q.MOVE_FINISHED,
        statement(q.MOVE_FINISHED, batch=10),
        when="into jobq.jobs_history",
        given=FINISHED_IN_JOBS,
    ),
    "MOVE_FINISHED past its retention": Case(
        q.MOVE_FINISHED,
        statement(q.MOVE_FINISHED, batch=10),
        when="past its retention already",
        given=f"{FINISHED_IN_JOBS}; UPDATE jobq.jobs SET completed_at = now() - interval '2 days'",
    ),
    "PRUNE_HISTORY_DEFAULT": Case(
        q.PRUNE_HISTORY_DEFAULT,
        statement(q.PRUNE_HISTORY_DEFAULT, batch=10),
        # Past its purge_after, the row moves to the default partition (no day's partition takes it).
        given="UPDATE jobq.jobs_history SET purge_after = now() - interval '1 second'",
    ),
    "PURGE_QUEUE": Case(q.PURGE_QUEUE, statement(q.PURGE_QUEUE, queue=QUEUE)),
    "CANCEL_WORKFLOW_JOBS": Case(
        q.CANCEL_WORKFLOW_JOBS, statement(q.CANCEL_WORKFLOW_JOBS, id=1, scope=None), given=IN_WORKFLOW
    ),
    "jobq.retry_workflow()": Case(
        None,
        retry_workflow,
        given=f"""{IN_WORKFLOW}; UPDATE jobq.jobs_history SET depends_on = ARRAY[id],
                  last_error = 'cancelled: parent job ' || id || ' is dead (run_if completed)'""",
    ),
    "ENQUEUE_DEBOUNCED": Case(
        q.ENQUEUE_DEBOUNCED,
        statement(q.ENQUEUE_DEBOUNCED, **DEBOUNCED_ARGS),
        when="its key's pending job",
        given="UPDATE jobq.jobs SET debounce_key = 'd'",
        makes=True,
    ),
    "jobq.decide()": Case(None, decide, when="run_if holds"),
    "jobq.decide() a failed parent": Case(None, decide_failed, when="run_if does not hold"),
    "EXPIRE_MESSAGES": Case(
        q.EXPIRE_MESSAGES,
        statement(q.EXPIRE_MESSAGES, retention=60.0),
        given="UPDATE jobq.jobs SET created_at = now() - interval '61 seconds'",
    ),
    "DELETE_QUEUE": Case(q.DELETE_QUEUE, delete_queue),
    "AWAIT_EVENT": Case(q.AWAIT_EVENT, statement(q.AWAIT_EVENT, event="e", timeout=60.0), when="parked"),
    "AWAIT_EVENT after its event": Case(
        q.AWAIT_EVENT,
        statement(q.AWAIT_EVENT, event="e", timeout=60.0),
        when="an event sent before",
        given="INSERT INTO jobq.events (name) VALUES ('e')",
    ),
    "SEND_EVENT": Case(
        q.SEND_EVENT,
        statement(q.SEND_EVENT, name="e", payload=None, scope=None),
        given=AWAITING,
    ),
    "EXPIRE_WAITS": Case(q.EXPIRE_WAITS, statement(q.EXPIRE_WAITS, batch=10), given=AWAITING),
}


def expected(name: str) -> dict[JobStatus, JobStatus | str]:
    """Where the case `name` moves a job of each status, from MOVES (a status not named: left alone)."""
    case = CASES[name]
    moves: dict[JobStatus, JobStatus | str] = {}
    for move in states.MOVES:
        if move.statement == name.split()[0] and move.before is not None and case.when in (None, move.when):
            assert move.before not in moves, f"{name}: which way it moves {move.before} is for `when` to say"
            moves[move.before] = move.after or GONE
    return moves


# The statements that create jobs: each makes a pending one.
NO = [None]
SLOT = datetime(2026, 1, 1, tzinfo=UTC)  # a schedule's slot
ENQUEUE_ARGS = dict(
    queues=[QUEUE],
    payloads=["{}"],
    priorities=NO,
    run_ats=NO,
    delays=NO,
    max_attempts=NO,
    kinds=NO,
    job_keys=NO,
    traceparents=NO,
    tracestates=NO,
)
ONCE = dict(scope="", key="k", request_hash=b"h", ttl=60.0)
EACH_SECOND = dict(crons=["* * * * *"], timezones=["UTC"], catch_ups=["once"], last_run_ats=NO)
FIRE_DUE_ARGS = EACH_SECOND | dict(
    names=["s"], firsts=[SLOT], next_run_ats=[SLOT], slot_names=["s"], slots=[SLOT]
)
EACH_ONCE = dict(scopes=[""], keys=["k"], request_hashes=[b"h"], ttl=60.0)
WAITING_ARGS = ENQUEUE_ARGS | dict(parents=["{1}"], run_ifs=NO, workflow_id=None, ids=NO)
# Each enqueue, and the statuses of the jobs it leaves, in id order (a job with parents needs one).
ENQUEUES: dict[str, tuple[str, list[Any], list[JobStatus]]] = {
    name: (query.text, query.args(**args), [PENDING])
    for name, query, args in [
        ("ENQUEUE_NEW", q.ENQUEUE_NEW, ENQUEUE_ARGS),
        ("ENQUEUE", q.ENQUEUE, ENQUEUE_ARGS | {"dedup_keys": ["d"]}),
        ("ENQUEUE_NEW_ONCE", q.ENQUEUE_NEW_ONCE, ENQUEUE_ARGS | ONCE),
        ("ENQUEUE_NEW_EACH_ONCE", q.ENQUEUE_NEW_EACH_ONCE, ENQUEUE_ARGS | EACH_ONCE),
        ("FIRE_SCHEDULE", q.FIRE_SCHEDULE, {"name": "s", "slots": [datetime.now(UTC)]}),
        ("FIRE_DUE_SCHEDULES", q.FIRE_DUE_SCHEDULES, FIRE_DUE_ARGS),
        ("ENQUEUE_WAITING without parents", q.ENQUEUE_WAITING, WAITING_ARGS | {"parents": NO}),
        ("ENQUEUE_DEBOUNCED", q.ENQUEUE_DEBOUNCED, DEBOUNCED_ARGS | {"queue": QUEUE}),
    ]
} | {
    "ENQUEUE_WAITING with parents": (
        q.ENQUEUE_WAITING.text,
        q.ENQUEUE_WAITING.args(**WAITING_ARGS),
        [WAITING],
    ),
    "jobq.enqueue()": (f"SELECT jobq.enqueue('{QUEUE}', '{{}}')", [], [PENDING]),
    "jobq.enqueue() with parents": (
        f"SELECT jobq.enqueue('{QUEUE}', '{{}}', depends_on => ARRAY[jobq.enqueue('{QUEUE}', '{{}}')])",
        [],
        [PENDING, WAITING],
    ),
}


async def job_in(conn: asyncpg.Connection, status: JobStatus) -> int:
    """A job of QUEUE in `status` as the statements that lead there leave it: leased once, its token
    kept (as after an expiry), finished ones with completed_at, in jobq.jobs_history."""
    job_id = await conn.fetchval(
        """
        WITH queue AS (INSERT INTO jobq.queues (name) VALUES ($1) ON CONFLICT DO NOTHING)
        INSERT INTO jobq.jobs (queue, status, payload, run_at, attempts, max_attempts, lease_token,
                               lease_expires_at, completed_at)
        VALUES ($1, $2, '{}', now() - interval '1 second', 1, 3, $3,
                CASE WHEN $2 = 'running' THEN now() + interval '30 seconds' END,
                CASE WHEN $2 IN ('completed', 'cancelled') THEN now() END)
        RETURNING id
        """,
        QUEUE,
        status,
        TOKEN,
    )
    await conn.execute(q.MOVE_FINISHED.text, *q.MOVE_FINISHED.args(batch=10))
    return job_id


# Every job row, in either table, past its purge_after or not.
EVERY_ROW = "(SELECT id, status FROM jobq.all_jobs UNION ALL SELECT id, status FROM jobq.jobs_history)"


@pytest.mark.parametrize("status", list(JobStatus))
@pytest.mark.parametrize("name", list(CASES))
async def test_each_statement_moves_each_status_as_the_table_says(db, name: str, status: JobStatus):
    case = CASES[name]
    job_id = await job_in(db, status)
    if case.given:
        await db.execute(case.given)
    await case.run(db, job_id)
    now = await db.fetchval(f"SELECT status FROM {EVERY_ROW} j WHERE id = $1", job_id)
    assert (now or GONE) == expected(name).get(status, status)
    # Nothing else was created or touched.
    others = await db.fetchval(f"SELECT count(*) FROM {EVERY_ROW} j WHERE id <> $1", job_id)
    assert others == (1 if case.makes and status != PENDING else 0)


def test_every_move_is_run_by_a_case():
    """Each move of MOVES out of a status is made by some case above (and no case runs a statement under
    another's name); each that creates a job, by an enqueue below."""
    made = set()
    for name, case in CASES.items():
        statement_name = name.split()[0]
        if case.query is None:
            assert statement_name.startswith("jobq.") and statement_name.endswith("()"), name
        else:
            assert getattr(q, statement_name) is case.query, name
        made |= {
            (name.split()[0], before, None if after == GONE else after)
            for before, after in expected(name).items()
        }
    assert made == {(m.statement, m.before, m.after) for m in states.MOVES if m.before is not None}
    assert {
        (name.split()[0], status) for name, (_, _, statuses) in ENQUEUES.items() for status in statuses[-1:]
    } == {(m.statement, m.after) for m in states.MOVES if m.before is None}


@pytest.mark.parametrize("name", list(ENQUEUES))
async def test_each_enqueue_makes_the_jobs_it_says(db, name: str):
    sql, args, statuses = ENQUEUES[name]
    await db.execute("INSERT INTO jobq.queues (name) VALUES ($1)", QUEUE)
    await db.execute(  # FIRE_SCHEDULE's and FIRE_DUE_SCHEDULES'
        "INSERT INTO jobq.schedules (name, cron, queue, payload, next_run_at)"
        " VALUES ('s', '* * * * *', $1, '{}', $2)",
        QUEUE,
        SLOT,
    )
    await db.fetch(sql, *args)
    assert [r["status"] for r in await db.fetch("SELECT status FROM jobq.all_jobs ORDER BY id")] == statuses
