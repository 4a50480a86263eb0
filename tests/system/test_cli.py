"""The `jobq` command: serve on the embedded PostgreSQL (jobs survive a restart), migrate, settings."""

import asyncio
import shutil
import subprocess
import sys

import asyncpg
import httpx
import pytest

from app.db import migrations
from app.settings import Settings
from tests.fixtures import tool_missing
from tests.service_process import JOBQ, ServiceProcess, jobq_env
from tests.service_process import ROOT as ROOT_DIR

pytestmark = pytest.mark.any_server


def test_serve_on_embedded_postgres_keeps_jobs_across_restarts(tmp_path):
    service = ServiceProcess(tmp_path)
    try:
        service.wait_ready()
        r = httpx.post(f"{service.url}/jobs", json={"queue": "survivors", "payload": {"n": 1}})
        assert r.status_code == 201
        job_id = r.json()["id"]
    finally:
        returncode = service.stop()
    assert ServiceProcess.clean_exit(returncode), service.output()
    assert (tmp_path / ".jobq" / "pgdata" / "PG_VERSION").exists()
    assert not (tmp_path / ".jobq" / "pgdata" / "postmaster.pid").exists(), "embedded PostgreSQL left running"

    # Stopped, the embedded server has no URL to give.
    stopped = database_url(tmp_path)
    assert stopped.returncode == 1 and stopped.stdout == "", stopped
    assert stopped.stderr.count("\n") == 1 and stopped.stderr.startswith("JOBQ_DATA_DIR: "), stopped.stderr

    service = ServiceProcess(tmp_path)
    try:
        service.wait_ready()
        job = httpx.get(f"{service.url}/jobs/{job_id}").json()
        assert job["status"] == "pending" and job["payload"] == {"n": 1}
        (leased,) = httpx.post(f"{service.url}/lease", json={"queue": "survivors"}).json()["jobs"]
        assert leased["id"] == job_id
        # While it runs, psql reaches it with the URL `jobq database-url` prints, and enqueues from SQL.
        url = database_url(tmp_path)
        assert url.returncode == 0, url.stderr
        psql = shutil.which("psql")
        if psql is None:
            tool_missing("psql is not installed (apt-get install postgresql-client)")
        sql = "SELECT jobq.enqueue('survivors', '{\"n\": 2}')"
        done = subprocess.run([psql, url.stdout.strip(), "-Atc", sql], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        (second,) = httpx.post(f"{service.url}/lease", json={"queue": "survivors"}).json()["jobs"]
        assert second["payload"] == {"n": 2} and str(second["id"]) == done.stdout.strip()
    finally:
        service.stop()
    # A configured database is its own URL.
    configured = database_url(tmp_path, JOBQ_DATABASE_URL="postgresql://app@db.example/app")
    assert configured.returncode == 0 and configured.stdout == "postgresql://app@db.example/app\n"


def database_url(cwd, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*JOBQ, "database-url"], cwd=cwd, env=jobq_env(**env), capture_output=True, text=True, timeout=60
    )


def test_migrate_command_and_plain_alembic(fresh_database, server_dsn):
    # `jobq migrate` on a database with no schema, and plain alembic down and up again on another, both
    # at once: they share nothing, and each command spends most of its time importing.
    dsn, alembic_dsn = fresh_database(), fresh_database()
    migrations.downgrade(dsn, "base")
    migrate = subprocess.Popen(
        [*JOBQ, "migrate"],
        env=jobq_env(JOBQ_DATABASE_URL=dsn),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        for command in (["downgrade", "base"], ["upgrade", "head"]):  # alembic, from the checkout
            done = subprocess.run(
                [sys.executable, "-m", "alembic", *command],
                cwd=ROOT_DIR,
                env=jobq_env(DATABASE_URL=alembic_dsn),
                capture_output=True,
            )
            assert done.returncode == 0, done.stderr.decode()
    finally:
        _, said = migrate.communicate(timeout=120)
    assert migrate.returncode == 0, said.decode()
    assert asyncio.run(revision(dsn)) == migrations.head_revision()
    assert asyncio.run(revision(alembic_dsn)) == migrations.head_revision()


async def revision(dsn: str) -> str:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval("SELECT version_num FROM jobq.alembic_version")
    finally:
        await conn.close()


@pytest.mark.parametrize("command", [[], ["serve"], ["migrate"], ["openapi"]])
def test_help(command):
    done = subprocess.run([*JOBQ, *command, "--help"], env=jobq_env(), capture_output=True, text=True)
    assert done.returncode == 0
    assert done.stdout.startswith(" ".join(["usage: jobq", *command]))
    if command == ["serve"]:
        assert "--host" in done.stdout and "--port" in done.stdout


def test_database_url_settings(monkeypatch):
    monkeypatch.delenv("JOBQ_DATABASE_URL", raising=False)
    monkeypatch.setenv("DATABASE_URL", "postgresql://fallback/db")
    assert Settings().database_url == "postgresql://fallback/db"
    monkeypatch.setenv("JOBQ_DATABASE_URL", "postgresql://preferred/db")
    assert Settings().database_url == "postgresql://preferred/db"
    monkeypatch.delenv("JOBQ_DATABASE_URL")
    monkeypatch.delenv("DATABASE_URL")
    assert Settings().database_url is None


def test_serve_refuses_to_listen_beyond_loopback_without_tokens(fresh_database):
    dsn = fresh_database()
    done = subprocess.run(
        [*JOBQ, "serve", "--host", "0.0.0.0", "--port", "1"],
        env=jobq_env(JOBQ_DATABASE_URL=dsn),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert "without tokens" in done.stderr and "--insecure" in done.stderr


def test_serve_beyond_loopback_with_tokens_or_insecure(fresh_database, tmp_path):
    dsn = fresh_database()
    # Both at once, each on a port of its own: most of a start is the import of the app.
    services = [
        ServiceProcess(tmp_path, *args, JOBQ_DATABASE_URL=dsn, JOBQ_HOST="0.0.0.0", **env)
        for env, args in (({"JOBQ_TOKENS": '{"t": "admin"}'}, []), ({}, ["--insecure"]))
    ]
    try:
        for service in services:
            service.wait_ready()
            assert httpx.get(f"{service.url}/healthz").status_code == 200
    finally:
        for service in services:
            service.stop()
