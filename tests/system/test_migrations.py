"""Migrations on a live service: lock timeouts and retries that never stall traffic, no deadlock with the
service's statements, and old code on a newer schema (rolling upgrades and rollbacks).

A second "build" is this build's revisions copied into a temporary versions directory plus test-only
revisions on top of today's head (computed, so a revision landing meanwhile changes nothing here), run
through the same app/db/alembic/env.py. The real app, this build, then faces the schema that build left.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import shutil
import subprocess
import textwrap
from pathlib import Path

import asyncpg
import httpx
import pytest
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from app.db import migrations
from app.http.deps import Unready
from app.settings import Settings
from tests.helpers import assert_problem, index_columns
from tests.service_process import JOBQ, jobq_env
from tests.waiting import until

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = ROOT / "app" / "db" / "alembic" / "versions"
HEAD = migrations.head_revision()


def this_build() -> ScriptDirectory:
    return ScriptDirectory.from_config(migrations.alembic_config("postgresql://unused"))


def floor_of(revision: str) -> str:
    """The compatible_from a revision declares (an expand-only revision on top keeps it)."""
    return getattr(this_build().get_revision(revision).module, "compatible_from", revision)


def revision(rev: str, down: str, compatible_from: str, upgrade: str, downgrade: str = "pass") -> str:
    """The source of a test-only revision module."""

    def body(code: str) -> str:
        return textwrap.indent(textwrap.dedent(code).strip(), "    ")

    uses = "from app.db.migrations import lock_tables\n" if "lock_tables" in upgrade + downgrade else ""
    return (
        f'"""test-only revision {rev}"""\n'
        f"from alembic import op\n{uses}\n"
        f"revision = {rev!r}\ndown_revision = {down!r}\nbranch_labels = None\ndepends_on = None\n"
        f"compatible_from = {compatible_from!r}\n\n\n"
        f"def upgrade() -> None:\n{body(upgrade)}\n\n\n"
        f"def downgrade() -> None:\n{body(downgrade)}\n"
    )


# Expand-only: a nullable column; old code ignores it, so the floor stays where today's head put it.
EXPAND = revision(
    "t_expand",
    HEAD,
    floor_of(HEAD),
    'op.execute("ALTER TABLE jobq.jobs ADD COLUMN test_note text")',
    'op.execute("ALTER TABLE jobq.jobs DROP COLUMN test_note")',
)
# Contract: code from before t_expand cannot run on it (as if it dropped something today's code reads).
CONTRACT = revision(
    "t_contract",
    "t_expand",
    "t_expand",
    'op.execute("ALTER TABLE jobq.jobs DROP COLUMN test_note")',
    'op.execute("ALTER TABLE jobq.jobs ADD COLUMN test_note text")',
)
# A step like the (0002 altered jobs, then queues), written to the rule: both tables locked
# first, in the service's order, whatever order the arguments name them in.
BOTH = revision(
    "t_both",
    HEAD,
    floor_of(HEAD),
    """\
    lock_tables("jobs", "queues")
    op.execute("ALTER TABLE jobq.jobs ADD COLUMN test_both text")
    op.execute("ALTER TABLE jobq.queues ADD COLUMN test_both text")
    """,
    """\
    lock_tables("jobs", "queues")
    op.execute("ALTER TABLE jobq.jobs DROP COLUMN test_both")
    op.execute("ALTER TABLE jobq.queues DROP COLUMN test_both")
    """,
)


def newer_build(tmp_path: Path, *sources: str) -> Path:
    """A versions directory holding this build's revisions and `sources`."""
    versions = tmp_path / "versions"
    versions.mkdir()
    for path in VERSIONS.glob("*.py"):
        shutil.copy(path, versions / path.name)
    for n, source in enumerate(sources):
        (versions / f"9{n:03}_test.py").write_text(source)
    return versions


def run_build(dsn: str, versions: Path, target: str = "head", *, down: bool = False, **settings) -> None:
    """`jobq migrate` as that build would run it: this env.py, its versions, these settings."""
    config: Config = migrations.alembic_config(dsn)
    config.set_main_option("version_locations", str(versions))
    config.attributes["settings"] = Settings(database_url=dsn, **settings)
    (command.downgrade if down else command.upgrade)(config, target)


class Retries(logging.Handler):
    """The migration's log lines about retries."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "retry" in record.getMessage():
            self.lines.append(record.getMessage())


@pytest.fixture
def retries():
    handler = Retries()
    logger = logging.getLogger("jobq.migrations")
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(previous)


async def blocker(dsn: str) -> asyncpg.Connection:
    """Another client's transaction left open on jobq.jobs (it read the table, so it holds a lock)."""
    conn = await asyncpg.connect(dsn, server_settings={"application_name": "test-blocker"})
    await conn.execute("BEGIN")
    await conn.fetchval("SELECT count(*) FROM jobq.jobs")
    return conn


async def schema(db) -> tuple[str, list[str]]:
    revision = await db.fetchval("SELECT version_num FROM jobq.alembic_version")
    columns = await db.fetch(
        "SELECT column_name FROM information_schema.columns"
        " WHERE table_schema = 'jobq' AND table_name = 'jobs'"
    )
    return revision, sorted(c["column_name"] for c in columns)


class LockWaits:
    """Samples pg_stat_activity: the longest any of the service's statements has waited for a lock."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.longest = 0.0
        self.samples = 0
        self.stop = asyncio.Event()

    async def run(self) -> None:
        conn = await asyncpg.connect(self.dsn)
        try:
            while not self.stop.is_set():
                waited = await conn.fetchval(
                    """
                    SELECT coalesce(max(extract(epoch FROM clock_timestamp() - query_start)), 0)::float8
                    FROM pg_stat_activity
                    WHERE datname = current_database() AND application_name = 'jobq'
                      AND wait_event_type = 'Lock'
                    """
                )
                self.longest = max(self.longest, waited)
                self.samples += 1
                await asyncio.sleep(0.02)
        finally:
            await conn.close()


# --- point 5: lock_timeout, retries, lock order -----------------------------------------------------


async def test_a_blocked_migration_retries_without_stalling_traffic(
    tmp_path, database_url, service, client, db, retries
):
    """An ALTER TABLE queued behind an open transaction used to hold every later statement on jobq.jobs
    (a POST /jobs waited 15 s). Now the migration gives up its place after lock_timeout and retries,
    traffic is answered meanwhile, and the step completes once the blocker goes."""
    lock_timeout = 0.5
    versions = newer_build(tmp_path, EXPAND)
    holder = await blocker(database_url)
    waits = LockWaits(database_url)
    sampler = asyncio.create_task(waits.run())
    migration = asyncio.create_task(
        asyncio.to_thread(
            run_build, database_url, versions, migration_lock_timeout=lock_timeout, migration_attempts=1000
        )
    )
    try:
        # The migration has asked for its lock at least once.
        await until(
            lambda: db.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND query ILIKE 'ALTER TABLE jobq.jobs%'"
            )
        )
        rounds = 0
        while rounds < 10 or len(retries.lines) < 3:
            assert not migration.done(), "the migration ended while the blocker was still there"
            r = await client.post("/jobs", json={"queue": "live", "payload": rounds}, timeout=10)
            assert r.status_code == 201, r.text
            r = await client.post("/lease", json={"queue": "live"}, timeout=10)
            assert r.status_code == 200 and len(r.json()["jobs"]) == 1, r.text
            rounds += 1
        # The blocker was there all along, and the schema is still today's.
        assert (await schema(db))[0] == HEAD
    finally:
        await holder.execute("COMMIT")
        await holder.close()
    await asyncio.wait_for(migration, 60)
    waits.stop.set()
    await sampler
    revision_after, columns = await schema(db)
    assert revision_after == "t_expand" and "test_note" in columns
    assert waits.samples > 10
    # A service statement waits behind the migration's lock request at most about lock_timeout (here
    # 0.5 s; the margin is for a busy test machine), never until the blocker ends.
    assert waits.longest < lock_timeout + 2.5, waits.longest


async def test_a_migration_gives_up_on_a_blocker_that_stays(tmp_path, database_url, service, client, db):
    """Attempts are bounded: then a clear error naming the blocking session, and the schema unchanged."""
    versions = newer_build(tmp_path, EXPAND)
    holder = await blocker(database_url)
    pid = await holder.fetchval("SELECT pg_backend_pid()")
    before = await schema(db)
    migration = asyncio.create_task(
        asyncio.to_thread(run_build, database_url, versions, migration_lock_timeout=0.2, migration_attempts=3)
    )
    try:
        await until(migration.done, timeout=30)
    finally:
        await holder.execute("ROLLBACK")
        await holder.close()
    error = migration.exception()
    assert isinstance(error, migrations.MigrationBlocked), repr(error)
    message = str(error)
    assert f"pid {pid}" in message and "test-blocker" in message, message
    assert "3 attempts" in message and HEAD in message, message
    assert await schema(db) == before
    # And the service never noticed.
    r = await client.post("/jobs", json={"queue": "after", "payload": 1}, timeout=10)
    assert r.status_code == 201


async def test_each_step_commits_on_its_own(tmp_path, database_url, db):
    """A retry repeats only the step that failed: the one before it stays applied."""
    second = revision(
        "t_second", "t_expand", floor_of(HEAD), 'op.execute("ALTER TABLE jobq.queues ADD COLUMN test_q text")'
    )
    versions = newer_build(tmp_path, EXPAND, second)
    # Blocks only the second step: it needs jobq.queues, which the first does not touch.
    holder = await asyncpg.connect(database_url)
    await holder.execute("BEGIN")
    await holder.fetchval("SELECT count(*) FROM jobq.queues")
    try:
        with pytest.raises(migrations.MigrationBlocked):
            await asyncio.to_thread(
                run_build, database_url, versions, migration_lock_timeout=0.2, migration_attempts=2
            )
    finally:
        await holder.execute("ROLLBACK")
        await holder.close()
    revision_after, columns = await schema(db)
    assert revision_after == "t_expand" and "test_note" in columns
    await asyncio.to_thread(run_build, database_url, versions)
    assert (await schema(db))[0] == "t_second"


async def test_no_deadlock_under_mixed_load_while_migrating(
    tmp_path, database_url, start_service, db, retries
):
    """Enqueues (queues, then jobs), leases, acks, nacks, lease expiry (jobs, then queues) and queue
    settings, from many clients, while a step that needs both tables is applied and undone again and
    again: every call is answered, the migration completes, and PostgreSQL reports no deadlock."""
    service = start_service(expire_interval=0.05)
    versions = newer_build(tmp_path, BOTH)
    deadlocks_before = await db.fetchval(
        "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
    )
    failures: list[str] = []
    answered = {"n": 0}
    stop = asyncio.Event()

    async def call(http: httpx.AsyncClient, method: str, path: str, **kw) -> httpx.Response | None:
        try:
            r = await http.request(method, path, timeout=20, **kw)
        except httpx.HTTPError as exc:
            failures.append(f"{method} {path}: {exc!r}")
            return None
        if r.status_code >= 500:
            failures.append(f"{method} {path}: {r.status_code} {r.text}")
        answered["n"] += 1
        return r

    async def producer(n: int) -> None:
        async with httpx.AsyncClient(base_url=service.url) as http:
            i = 0
            while not stop.is_set():
                i += 1
                queue = f"mix{i % 3}"
                if i % 4:
                    await call(http, "POST", "/jobs", json={"queue": queue, "payload": [n, i]})
                else:
                    jobs = [{"queue": queue, "payload": [n, i, k]} for k in range(5)]
                    await call(http, "POST", "/jobs/batch", json={"jobs": jobs})

    async def worker(n: int) -> None:
        rng = random.Random(n)
        async with httpx.AsyncClient(base_url=service.url) as http:
            while not stop.is_set():
                lease = {"queue": f"mix{n % 3}", "max_jobs": 5, "visibility_timeout": 0.5}
                r = await call(http, "POST", "/lease", json=lease)
                for job in r.json()["jobs"] if r is not None and r.status_code == 200 else []:
                    token = {"id": job["id"], "lease_token": job["lease_token"]}
                    choice = rng.random()
                    if choice < 0.5:
                        await call(http, "POST", "/ack", json=token)
                    elif choice < 0.8:
                        await call(http, "POST", "/nack", json={**token, "error": "x", "retry_after": 0})
                    # else: left for lease expiry

    async def operator() -> None:
        async with httpx.AsyncClient(base_url=service.url) as http:
            i = 0
            while not stop.is_set():
                i += 1
                await call(http, "PATCH", f"/queues/mix{i % 3}", json={"max_attempts": 3 + i % 3})
                await call(http, "GET", "/queues")

    load = [asyncio.create_task(producer(n)) for n in range(3)]
    load += [asyncio.create_task(worker(n)) for n in range(3)]
    load.append(asyncio.create_task(operator()))

    def migrate_back_and_forth() -> None:
        settings = {"migration_lock_timeout": 1.0, "migration_attempts": 50}
        for _ in range(5):
            run_build(database_url, versions, **settings)
            run_build(database_url, versions, HEAD, down=True, **settings)

    try:
        await until(lambda: answered["n"] > 50)
        await asyncio.wait_for(asyncio.to_thread(migrate_back_and_forth), 240)
        applied = await db.fetchval("SELECT version_num FROM jobq.alembic_version")
        seen = answered["n"]
        await until(lambda: answered["n"] > seen + 50)
    finally:
        stop.set()
        await asyncio.gather(*load)
    service.stop()
    assert applied == HEAD
    assert failures == [], failures[:5]
    assert not [line for line in retries.lines if "deadlock" in line], retries.lines
    # Every session of the test has ended (their statistics are written when they end).
    conn = await asyncpg.connect(database_url)
    try:
        deadlocks = await conn.fetchval(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        )
    finally:
        await conn.close()
    assert deadlocks == deadlocks_before


def test_lock_tables_takes_the_service_order():
    assert migrations.LOCK_ORDER == ("queues", "jobs", "jobs_history")
    with pytest.raises(ValueError, match="LOCK_ORDER"):
        migrations.lock_order(["jobs", "unheard_of"])
    assert migrations.lock_order(["jobs_history", "jobs", "queues"]) == ["queues", "jobs", "jobs_history"]


# --- point 6: rolling upgrades and rollbacks --------------------------------------------------------


def test_every_revision_declares_compatible_from():
    script = this_build()
    for rev in script.walk_revisions():
        floor = getattr(rev.module, "compatible_from", None)
        assert floor is not None, f"{rev.path} has no compatible_from"
        ancestors = {a.revision for a in script.iterate_revisions(rev.revision, "base")}
        assert floor in ancestors, f"{rev.path}: compatible_from {floor} is not {rev.revision} or before it"
    assert script.get_revision("0001").module.compatible_from == "0001"
    assert script.get_revision("0002").module.compatible_from == "0001"


def test_the_chain_is_a_line_numbered_by_its_files():
    """What migrations.head_revision() and compatibility() read from the files' names, without loading
    Alembic, is Alembic's reading of the chain."""
    script = this_build()
    revisions = sorted(rev.revision for rev in script.walk_revisions())
    assert script.get_heads() == [HEAD] == [revisions[-1]]
    assert migrations._lineage() == frozenset(revisions)
    for rev in script.walk_revisions():
        assert Path(rev.path).name.startswith(f"{rev.revision}_"), rev.path
        assert rev.down_revision == (None if rev.revision == "0001" else f"{int(rev.revision) - 1:04}")


async def test_the_migration_records_its_floor(database_url, start_service, db):
    recorded = await db.fetchval("SELECT obj_description('jobq.alembic_version'::regclass, 'pg_class')")
    assert recorded is not None
    assert json.loads(recorded) == {"revision": HEAD, "compatible_from": floor_of(HEAD)}
    assert await migrations.at_head(database_url)  # a start has nothing to run
    # A schema migrated before floors were recorded gets its floor from the next run, which has no
    # step to apply; a start runs it.
    await db.execute("COMMENT ON TABLE jobq.alembic_version IS NULL")
    assert not await migrations.at_head(database_url)
    start_service(migrate_on_start=True)
    recorded = await db.fetchval("SELECT obj_description('jobq.alembic_version'::regclass, 'pg_class')")
    assert json.loads(recorded) == {"revision": HEAD, "compatible_from": floor_of(HEAD)}
    assert await migrations.at_head(database_url)
    # Behind the head, or no schema at all: a start migrates.
    await asyncio.to_thread(migrations.downgrade, database_url, "0021")
    assert not await migrations.at_head(database_url)
    await asyncio.to_thread(migrations.downgrade, database_url, "base")
    assert not await migrations.at_head(database_url)
    start_service(migrate_on_start=True)
    assert await db.fetchval("SELECT version_num FROM jobq.alembic_version") == HEAD


async def test_old_code_stays_ready_on_a_newer_compatible_schema(tmp_path, database_url, start_service, db):
    versions = newer_build(tmp_path, EXPAND)
    await asyncio.to_thread(run_build, database_url, versions)
    assert (await schema(db))[0] == "t_expand"
    # A replica of this build that was already running,
    running = start_service()
    # and one that (re)starts now, migrating on start as replicas do: nothing to upgrade, no crash.
    restarted = start_service(migrate_on_start=True)
    for service in (running, restarted):
        async with httpx.AsyncClient(base_url=service.url, timeout=10) as http:
            r = await http.get("/readyz")
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["ready"] is True and body["database"] is True
            assert body["schema_revision"] == "t_expand" and body["expected_revision"] == HEAD
            assert body["compatible"] is True and body["compatible_from"] == floor_of(HEAD)
            r = await http.post("/jobs", json={"queue": "old", "payload": 1})
            assert r.status_code == 201, r.text
            r = await http.post("/lease", json={"queue": "old"})
            assert len(r.json()["jobs"]) == 1
    assert (await schema(db))[0] == "t_expand"


async def test_old_code_is_unready_on_an_incompatible_schema(tmp_path, database_url, start_service, db):
    versions = newer_build(tmp_path, EXPAND, CONTRACT)
    await asyncio.to_thread(run_build, database_url, versions)
    service = start_service(migrate_on_start=True)  # starts: nothing it can upgrade
    async with httpx.AsyncClient(base_url=service.url, timeout=10) as http:
        body = assert_problem(await http.get("/readyz"), 503, "unavailable")
    Unready.model_validate(body)  # as openapi.json describes the 503
    assert body["ready"] is False and body["database"] is True and body["compatible"] is False
    assert body["schema_revision"] == "t_contract" and body["expected_revision"] == HEAD
    assert body["compatible_from"] == "t_expand"
    for word in ("t_contract", HEAD, "t_expand", "upgrade"):
        assert word in body["detail"], body["detail"]
    assert (await schema(db))[0] == "t_contract"


async def test_old_schema_is_not_ready(database_url, start_service, db):
    previous = this_build().get_revision(HEAD).down_revision
    await asyncio.to_thread(migrations.downgrade, database_url, previous)
    service = start_service()
    async with httpx.AsyncClient(base_url=service.url, timeout=10) as http:
        body = assert_problem(await http.get("/readyz"), 503, "unavailable")
    assert body["schema_revision"] == previous and body["expected_revision"] == HEAD
    assert "jobq migrate" in body["detail"]


def test_migrate_command_of_an_old_build_on_a_newer_schema(tmp_path, database_url):
    versions = newer_build(tmp_path, EXPAND)
    run_build(database_url, versions)
    done = subprocess.run(
        [*JOBQ, "migrate"], env=jobq_env(JOBQ_DATABASE_URL=database_url), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "t_expand" in done.stdout + done.stderr and HEAD in done.stdout + done.stderr


def test_the_newer_build_can_roll_the_schema_back(tmp_path, database_url):
    """A rollback of the schema is the newer build's `jobq migrate --down <revision>`; afterwards the
    recorded floor is the older revision's."""
    versions = newer_build(tmp_path, EXPAND, CONTRACT)
    run_build(database_url, versions)
    run_build(database_url, versions, HEAD, down=True)

    async def recorded():
        conn = await asyncpg.connect(database_url)
        try:
            return await conn.fetchrow(
                "SELECT (SELECT version_num FROM jobq.alembic_version) AS revision,"
                " obj_description('jobq.alembic_version'::regclass, 'pg_class') AS compat"
            )
        finally:
            await conn.close()

    row = asyncio.run(recorded())
    assert row["revision"] == HEAD
    assert json.loads(row["compat"]) == {"revision": HEAD, "compatible_from": floor_of(HEAD)}


# --- revision 0004: kind ----------------------------------------------------------------------------


async def kind_state(db) -> tuple[str, bool, bool | None, int]:
    """The revision, whether jobs has `kind`, whether its CHECK is validated, how many enqueue functions."""
    revision = await db.fetchval("SELECT version_num FROM jobq.alembic_version")
    has_kind = await db.fetchval(
        "SELECT count(*) = 1 FROM information_schema.columns"
        " WHERE table_schema = 'jobq' AND table_name = 'jobs' AND column_name = 'kind'"
    )
    validated = await db.fetchval(
        "SELECT convalidated FROM pg_constraint WHERE conname = 'ck_jobs_kind_format'"
    )
    functions = await db.fetchval(
        "SELECT count(*) FROM pg_proc WHERE proname = 'enqueue' AND pronamespace = 'jobq'::regnamespace"
    )
    return revision, has_kind, validated, functions


async def test_0004_adds_kind_beside_existing_jobs_and_goes_back(database_url, db):
    await asyncio.to_thread(migrations.downgrade, database_url, "0003")
    assert await kind_state(db) == ("0003", False, None, 1)
    # Jobs enqueued before, the way applications called jobq.enqueue() then.
    before = [
        await db.fetchval("SELECT jobq.enqueue('q', '1', 0, NULL, NULL, 'k1')"),
        await db.fetchval("SELECT jobq.enqueue(queue => 'q', payload => '2')"),
    ]

    await asyncio.to_thread(migrations.upgrade, database_url, "0004")
    assert await kind_state(db) == ("0004", True, True, 1)
    kinds = await db.fetch("SELECT id, kind FROM jobq.jobs ORDER BY id")
    assert [(r["id"], r["kind"]) for r in kinds] == [(before[0], None), (before[1], None)]
    # The same calls still resolve, and a kind can be given.
    assert await db.fetchval("SELECT jobq.enqueue('q', '3', 0, NULL, NULL, 'k1')") == before[0]
    with_kind = await db.fetchval("SELECT jobq.enqueue('q', '4', kind => 'send_email')")
    assert await db.fetchval("SELECT kind FROM jobq.jobs WHERE id = $1", with_kind) == "send_email"
    with pytest.raises(asyncpg.CheckViolationError):
        await db.execute("UPDATE jobq.jobs SET kind = 'no spaces' WHERE id = $1", with_kind)

    await asyncio.to_thread(migrations.downgrade, database_url, "0003")
    assert await kind_state(db) == ("0003", False, None, 1)
    assert await db.fetchval("SELECT jobq.enqueue('q', '5', dedup_key => 'k5')") is not None
    assert await db.fetchval("SELECT count(*) FROM jobq.jobs") == 4
    await asyncio.to_thread(migrations.upgrade, database_url)
    assert (await kind_state(db))[1:] == (True, True, 1)


async def test_0004_runs_again_after_its_validation_gave_up(database_url, db):
    """0004 commits the column, its NOT VALID check and the new function before it validates the
    check (so no exclusive lock is held while validation scans the table). A validation that timed out
    on its lock leaves that part committed and the revision at 0003; the step's retry (or the next
    `jobq migrate`) runs it all again, and finishes."""
    await asyncio.to_thread(migrations.downgrade, database_url, "0003")
    await db.fetchval("SELECT jobq.enqueue('q', '1')")
    step = this_build().get_revision("0004").module
    await db.execute(step.ADD_KIND)
    await db.execute(f"DROP FUNCTION {step.OLD_SIGNATURE}")
    await db.execute(step.ENQUEUE_FUNCTION.format(**step.WITH_KIND))
    assert await kind_state(db) == ("0003", True, False, 1)

    await asyncio.to_thread(migrations.upgrade, database_url, "0004")
    assert await kind_state(db) == ("0004", True, True, 1)
    assert await db.fetchval("SELECT count(*) FROM jobq.jobs WHERE kind IS NULL") == 1


# --- revision 0005: result and progress -------------------------------------------------------------


async def outcome_columns(db) -> tuple[str, list[str]]:
    """The revision, and which of `result` and `progress` jobs has."""
    revision = await db.fetchval("SELECT version_num FROM jobq.alembic_version")
    columns = await db.fetch(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = 'jobq'"
        " AND table_name = 'jobs' AND column_name IN ('result', 'progress') ORDER BY column_name"
    )
    return revision, [c["column_name"] for c in columns]


async def test_0005_adds_result_and_progress_beside_existing_jobs_and_goes_back(database_url, db):
    await asyncio.to_thread(migrations.downgrade, database_url, "0004")
    assert await outcome_columns(db) == ("0004", [])
    before = await db.fetchval("SELECT jobq.enqueue('q', '1', kind => 'k')")

    await asyncio.to_thread(migrations.upgrade, database_url, "0005")
    assert await outcome_columns(db) == ("0005", ["progress", "result"])
    kept = await db.fetchrow("SELECT kind, result, progress FROM jobq.jobs WHERE id = $1", before)
    assert tuple(kept) == ("k", None, None)
    await db.execute("UPDATE jobq.jobs SET result = '{\"n\": 1}', progress = '0.5' WHERE id = $1", before)

    await asyncio.to_thread(migrations.downgrade, database_url, "0004")
    assert await outcome_columns(db) == ("0004", [])
    assert await db.fetchval("SELECT count(*) FROM jobq.jobs") == 1
    # A step retried after giving up on its lock runs its statement again: it finds nothing to do.
    step = this_build().get_revision("0005").module
    await db.execute(step.ADD_COLUMNS)
    await asyncio.to_thread(migrations.upgrade, database_url)
    assert (await outcome_columns(db))[1] == ["progress", "result"]


# --- revision 0006: awaited -------------------------------------------------------------------------


async def awaited_column(db) -> tuple[str, bool]:
    revision = await db.fetchval("SELECT version_num FROM jobq.alembic_version")
    present = await db.fetchval(
        "SELECT count(*) = 1 FROM information_schema.columns"
        " WHERE table_schema = 'jobq' AND table_name = 'jobs' AND column_name = 'awaited'"
    )
    return revision, present


async def test_0006_adds_awaited_to_existing_jobs_and_goes_back(database_url, db):
    await asyncio.to_thread(migrations.downgrade, database_url, "0005")
    assert await awaited_column(db) == ("0005", False)
    before = await db.fetchval("SELECT jobq.enqueue('q', '1')")

    await asyncio.to_thread(migrations.upgrade, database_url, "0006")
    assert await awaited_column(db) == ("0006", True)
    assert await db.fetchval("SELECT awaited FROM jobq.jobs WHERE id = $1", before) is False
    after = await db.fetchval("SELECT jobq.enqueue('q', '2')")  # the SQL function leaves it to the default
    assert await db.fetchval("SELECT awaited FROM jobq.jobs WHERE id = $1", after) is False

    await asyncio.to_thread(migrations.downgrade, database_url, "0005")
    assert await awaited_column(db) == ("0005", False)
    assert await db.fetchval("SELECT count(*) FROM jobq.jobs") == 2
    step = this_build().get_revision("0006").module
    await db.execute(step.ADD_COLUMN)  # a retried step runs its statement again: nothing to do
    await db.execute(step.ADD_COLUMN)
    await asyncio.to_thread(migrations.upgrade, database_url)
    assert (await awaited_column(db))[1]


# --- revision 0008: key -----------------------------------------------------------------------------


async def test_0008_adds_key_and_the_sql_functions_argument_and_goes_back(database_url, db):
    await asyncio.to_thread(migrations.downgrade, database_url, "0007")
    before = await db.fetchval("SELECT jobq.enqueue('q', '1', kind => 'k')")
    with pytest.raises(asyncpg.UndefinedFunctionError):
        await db.execute("SELECT jobq.enqueue('q', '1', key => 'x')")

    await asyncio.to_thread(migrations.upgrade, database_url, "0008")
    after = await db.fetchval("SELECT jobq.enqueue('q', '2', kind => 'k', key => 'tenant')")
    rows = await db.fetch("SELECT id, kind, key FROM jobq.jobs ORDER BY id")
    assert [tuple(r) for r in rows] == [(before, "k", None), (after, "k", "tenant")]
    validated = await db.fetchval(
        "SELECT convalidated FROM pg_constraint WHERE conname = 'ck_jobs_key_length'"
    )
    assert validated is True

    await asyncio.to_thread(migrations.downgrade, database_url, "0007")
    assert await db.fetchval("SELECT jobq.enqueue('q', '3', kind => 'k')") is not None
    assert await db.fetchval("SELECT count(*) FROM jobq.jobs") == 3
    await asyncio.to_thread(migrations.upgrade, database_url)


# --- revision 0009: flow control ---------------------------------------------------------------------


async def test_0009_adds_flow_control_and_builds_its_indexes_without_blocking_and_goes_back(database_url, db):
    await asyncio.to_thread(migrations.downgrade, database_url, "0008")
    await db.execute("SELECT jobq.enqueue('q', '1', key => 'tenant')")
    await asyncio.to_thread(migrations.upgrade, database_url, "0009")
    indexes = await db.fetch(
        "SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
        " WHERE c.relname IN ('ix_jobs_key_ready', 'ix_jobs_key_held') ORDER BY 1"
    )
    assert [tuple(r) for r in indexes] == [("ix_jobs_key_held", True), ("ix_jobs_key_ready", True)]
    row = await db.fetchrow("SELECT flow, fair, key_concurrency FROM jobq.queues WHERE name = 'q'")
    assert tuple(row) == (False, False, None)
    assert await db.fetchval("SELECT count(*) FROM jobq.keys") == 0

    await asyncio.to_thread(migrations.downgrade, database_url, "0008")
    assert await db.fetchval("SELECT to_regclass('jobq.keys')") is None
    assert await db.fetchval("SELECT count(*) FROM jobq.jobs WHERE key = 'tenant'") == 1
    await asyncio.to_thread(migrations.upgrade, database_url)


# --- revision 0010: SQS FIFO receive attempts ------------------------------------------------------


async def test_0010_adds_the_receive_attempts_table_beside_existing_jobs_and_goes_back(database_url, db):
    await asyncio.to_thread(migrations.downgrade, database_url, "0009")
    assert await db.fetchval("SELECT to_regclass('jobq.sqs_receive_attempts')") is None
    job = await db.fetchval("SELECT jobq.enqueue('q.fifo', '\"body\"', key => 'group')")
    await asyncio.to_thread(migrations.upgrade, database_url, "0010")
    await db.execute(
        "INSERT INTO jobq.sqs_receive_attempts (queue, attempt_id, ids, lease_tokens, expires_at)"
        " VALUES ('q.fifo', 'a', ARRAY[$1::bigint], ARRAY[gen_random_uuid()], now())",
        job,
    )
    await asyncio.to_thread(migrations.downgrade, database_url, "0009")
    assert await db.fetchval("SELECT to_regclass('jobq.sqs_receive_attempts')") is None
    assert await db.fetchval("SELECT key FROM jobq.jobs WHERE id = $1", job) == "group"
    await asyncio.to_thread(migrations.upgrade, database_url)
    assert await db.fetchval("SELECT count(*) FROM jobq.sqs_receive_attempts") == 0


# --- revision 0019: keys that name the queue ---------------------------------------------------------


async def primary_keys(db) -> dict[str, list[str]]:
    """Each jobs table's (and each jobs_history partition's) primary key, its columns in order."""
    rows = await index_columns(db, "i.indisprimary AND t.relname LIKE 'jobs%'")
    return {r["table_name"]: r["columns"] for r in rows}


FINISHED_JOB = """
INSERT INTO jobq.jobs_history (id, queue, status, payload, priority, run_at, attempts, created_at,
                               updated_at, completed_at, awaited, purge_after)
VALUES (nextval('jobq.jobs_id_seq'), 'q', 'completed', '"done"', 0, now(), 1, now(), now(), now(), false, $1)
RETURNING id
"""


async def make_partition(db, day) -> None:
    """`day`'s partition of jobs_history, made as the service makes it (app/service/history.py: a table of
    its own, then attached), which is how a partition takes its parent's keys and indexes."""
    from app.service import history

    async with db.transaction():
        for statement in history._make(day):
            await db.execute(statement)


async def test_0019_keys_the_history_by_queue_without_a_rebuild_under_lock_and_goes_back(database_url, db):
    from datetime import UTC, datetime, timedelta

    from app.service import history

    await asyncio.to_thread(migrations.downgrade, database_url, "0018")
    today = datetime.now(UTC).date()
    await make_partition(db, today)
    waiting = await db.fetchval("SELECT jobq.enqueue('q', '1')")
    in_day = await db.fetchval(FINISHED_JOB, datetime.now(UTC) + timedelta(hours=1))
    in_default = await db.fetchval(FINISHED_JOB, datetime(2100, 1, 1, tzinfo=UTC))
    day = history.partition_name(today)

    await asyncio.to_thread(migrations.upgrade, database_url, "0019")
    by_queue = ["queue", "id", "purge_after"]
    assert await primary_keys(db) == {
        "jobs": ["id"],
        "jobs_history": by_queue,
        day: by_queue,
        "jobs_history_default": by_queue,
    }
    invalid = await db.fetch(
        "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
        " WHERE c.relnamespace = 'jobq'::regnamespace AND NOT i.indisvalid"
    )
    assert invalid == []
    gone = ["uq_jobs_schedule_slot", "ix_jobs_history_queue_id"]
    assert [await db.fetchval("SELECT to_regclass($1)", f"jobq.{name}") for name in gone] == [None] * 2
    # Every job is where it was, and a finished one found by id alone through the new index.
    found = await db.fetch("SELECT id, status FROM jobq.all_jobs ORDER BY id")
    assert [tuple(r) for r in found] == [
        (waiting, "pending"),
        (in_day, "completed"),
        (in_default, "completed"),
    ]
    by_id = await db.fetchval(
        "SELECT count(*) FROM pg_inherits WHERE inhparent = 'jobq.ix_jobs_history_id'::regclass"
    )
    assert by_id == 2  # each partition's index on id, attached
    # A partition the service makes afterwards takes the new key from its parent.
    tomorrow = history.partition_name(today + timedelta(days=1))
    await make_partition(db, today + timedelta(days=1))
    assert (await primary_keys(db))[tomorrow] == by_queue
    # The key refuses a second row of one job in one partition.
    with pytest.raises(asyncpg.UniqueViolationError):
        await db.execute(
            "INSERT INTO jobq.jobs_history SELECT * FROM jobq.jobs_history WHERE id = $1", in_default
        )

    await asyncio.to_thread(migrations.downgrade, database_url, "0018")
    by_id = ["id", "purge_after"]
    assert await primary_keys(db) == {
        "jobs": ["id"],
        "jobs_history": by_id,
        day: by_id,
        tomorrow: by_id,
        "jobs_history_default": by_id,
    }
    assert all([await db.fetchval("SELECT to_regclass($1)", f"jobq.{name}") for name in gone])
    assert await db.fetchval("SELECT to_regclass('jobq.ix_jobs_history_id')") is None
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs") == 3
    await asyncio.to_thread(migrations.upgrade, database_url)


# --- revision 0020: the index of keys' held slots by id -----------------------------------------------


async def key_held(db) -> list[tuple[list[str], bool, str]]:
    """ix_jobs_key_held (and its build under another name, if left): columns, validity, predicate."""
    rows = await index_columns(db, "c.relname LIKE 'ix_jobs_key_held%'")
    valid = await db.fetch(
        "SELECT c.relname, i.indisvalid, pg_get_expr(i.indpred, i.indrelid) AS held"
        " FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname LIKE 'ix_jobs_key_held%'"
    )
    by_name = {r["relname"]: (r["indisvalid"], r["held"]) for r in valid}
    return [(r["index_name"], r["columns"], *by_name[r["index_name"]]) for r in rows]


async def test_0020_rebuilds_the_key_held_index_by_id_and_goes_back(database_url, db):
    await asyncio.to_thread(migrations.downgrade, database_url, "0019")
    (before,) = await key_held(db)
    assert before[:3] == ("ix_jobs_key_held", ["queue", "key"], True)
    running = await db.fetchval("SELECT jobq.enqueue('q', '1', key => 'tenant')")
    await db.execute("UPDATE jobq.jobs SET status = 'running' WHERE id = $1", running)
    await db.fetchval("SELECT jobq.enqueue('q', '2', key => 'tenant')")  # waiting: holds nothing

    await asyncio.to_thread(migrations.upgrade, database_url, "0020")
    (after,) = await key_held(db)
    assert after == ("ix_jobs_key_held", ["queue", "key", "id"], True, before[3])
    # The running job holds its key in the new index, built with its one entry.
    entries = await db.fetchval("SELECT reltuples FROM pg_class WHERE relname = 'ix_jobs_key_held'")
    assert entries == 1
    await asyncio.to_thread(migrations.downgrade, database_url, "0019")
    assert await key_held(db) == [before]
    await asyncio.to_thread(migrations.upgrade, database_url)


# --- revision 0021: the claim from the front in one function ------------------------------------------


async def test_0021_adds_the_front_claim_function_that_leases_and_goes_back(database_url, db):
    await asyncio.to_thread(migrations.downgrade, database_url, "0020")
    exists = "SELECT to_regprocedure('jobq.lease_flow_front(text, integer, double precision[], text[])')"
    assert await db.fetchval(exists) is None
    await db.execute("INSERT INTO jobq.queues (name, key_concurrency, flow) VALUES ('q', 1, true)")
    first, second = [await db.fetchval("SELECT jobq.enqueue('q', '1', key => 'k')") for _ in range(2)]

    await asyncio.to_thread(migrations.upgrade, database_url, "0021")
    call = "SELECT id, slot, looked, passed FROM jobq.lease_flow_front('q', 5, '{NULL, NULL}', '{w, w}')"
    # The key runs in order: its first job, and nothing more while it runs.
    assert [tuple(r) for r in await db.fetch(call)] == [(first, 1, 2, 0)]
    assert [tuple(r) for r in await db.fetch(call)] == [(None, None, 1, 0)]
    assert await db.fetchval("SELECT status FROM jobq.jobs WHERE id = $1", second) == "pending"

    await asyncio.to_thread(migrations.downgrade, database_url, "0020")
    assert await db.fetchval(exists) is None
    await asyncio.to_thread(migrations.upgrade, database_url)


# --- revision 0022: a fair queue's turn in its row ---------------------------------------------------


async def test_0022_keeps_a_fair_queues_turn_in_its_row_and_goes_back(database_url, db):
    await asyncio.to_thread(migrations.downgrade, database_url, "0021")
    column = (
        "SELECT count(*) FROM information_schema.columns"
        " WHERE table_schema = 'jobq' AND table_name = 'queues' AND column_name = 'fair_last_key'"
    )
    assert await db.fetchval(column) == 0
    await db.execute("INSERT INTO jobq.queues (name, fair, flow) VALUES ('q', true, true)")

    await asyncio.to_thread(migrations.upgrade, database_url, "0022")
    assert await db.fetchval("SELECT fair_last_key FROM jobq.queues WHERE name = 'q'") is None

    await asyncio.to_thread(migrations.downgrade, database_url, "0021")
    assert await db.fetchval(column) == 0
    assert await db.fetchval("SELECT fair FROM jobq.queues WHERE name = 'q'") is True
    await asyncio.to_thread(migrations.upgrade, database_url)
