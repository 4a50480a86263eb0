"""The `jobq` command: serve on the embedded PostgreSQL (jobs survive a restart), migrate, settings."""

import subprocess
import sys

import asyncpg
import httpx
import pytest
from service_process import JOBQ, ServiceProcess, jobq_env
from service_process import ROOT as ROOT_DIR

from app.db import migrations
from app.settings import Settings


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

    service = ServiceProcess(tmp_path)
    try:
        service.wait_ready()
        job = httpx.get(f"{service.url}/jobs/{job_id}").json()
        assert job["status"] == "pending" and job["payload"] == {"n": 1}
        (leased,) = httpx.post(f"{service.url}/lease", json={"queue": "survivors"}).json()["jobs"]
        assert leased["id"] == job_id
    finally:
        service.stop()


def test_migrate_command_and_plain_alembic(fresh_database, server_dsn):
    dsn = fresh_database()
    migrations.downgrade(dsn, "base")
    done = subprocess.run([*JOBQ, "migrate"], env=jobq_env(JOBQ_DATABASE_URL=dsn), capture_output=True)
    assert done.returncode == 0, done.stderr.decode()

    async def revision() -> str:
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetchval("SELECT version_num FROM jobq.alembic_version")
        finally:
            await conn.close()

    import asyncio

    assert asyncio.run(revision()) == migrations.head_revision()
    for command in (["downgrade", "base"], ["upgrade", "head"]):  # alembic, from the checkout
        done = subprocess.run(
            [sys.executable, "-m", "alembic", *command],
            cwd=ROOT_DIR,
            env=jobq_env(DATABASE_URL=dsn),
            capture_output=True,
        )
        assert done.returncode == 0, done.stderr.decode()
    assert asyncio.run(revision()) == migrations.head_revision()


@pytest.mark.parametrize("command", [[], ["serve"], ["migrate"], ["openapi"]])
def test_help(command):
    done = subprocess.run([*JOBQ, *command, "--help"], env=jobq_env(), capture_output=True, text=True)
    assert done.returncode == 0
    assert "Usage" in done.stdout
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
    for env, args in (({"JOBQ_TOKENS": '{"t": "admin"}'}, []), ({}, ["--insecure"])):
        service = ServiceProcess(tmp_path, *args, JOBQ_DATABASE_URL=dsn, JOBQ_HOST="0.0.0.0", **env)
        try:
            service.wait_ready()
            assert httpx.get(f"{service.url}/healthz").status_code == 200
        finally:
            service.stop()
