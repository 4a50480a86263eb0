"""Start-up failures (app/startup.py): `jobq serve` and `jobq migrate`, run as a user runs them, say in
one line which setting is at fault and what to do, exit non-zero, and keep the traceback for
`--log-level debug`."""

from __future__ import annotations

import subprocess

import pytest
from service_process import JOBQ, free_port, jobq_env

from tests.fixtures import with_database
from tests.pgbouncer import through_pooler


def run(cwd, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*JOBQ, *args], cwd=cwd, env=jobq_env(**env), capture_output=True, text=True, timeout=120
    )


def serve(cwd, *args: str, **env: str) -> subprocess.CompletedProcess:
    return run(cwd, "serve", "--port", str(free_port()), *args, **env)


def told_in_one_line(done: subprocess.CompletedProcess, *words: str) -> str:
    """The one line of stderr that says what is wrong, checked: the command failed, nothing of a
    traceback was printed, and beside that line only uvicorn's own few lines of starting and giving up."""
    lines = done.stderr.splitlines()
    assert done.returncode != 0, done.stderr
    assert "Traceback" not in done.stderr and not any(line.startswith(" ") for line in lines), done.stderr
    told = [line for line in lines if all(word in line for word in words)]
    assert len(told) == 1, done.stderr
    (line,) = told
    assert len(lines) <= 4, done.stderr  # Started server process, Waiting for startup, the line, Exiting
    return line


def test_a_bad_role_in_tokens_is_one_line(tmp_path):
    done = serve(tmp_path, JOBQ_TOKENS='{"t0k3n": "admn"}')
    line = told_in_one_line(done, "JOBQ_TOKENS", "'admn' is not a role", "admin")
    assert done.stderr.splitlines() == [line] and "t0k3n" not in line
    done = serve(tmp_path, JOBQ_TOKENS='{"t0k3n": ')  # not JSON at all
    line = told_in_one_line(done, "JOBQ_TOKENS", "not valid JSON")
    assert done.stderr.splitlines() == [line] and "t0k3n" not in line
    # A setting that needs another names both.
    done = serve(tmp_path, JOBQ_DATABASE_URL="postgresql://x/y", JOBQ_DATABASE_POOL_MODE="transaction")
    assert done.stderr.splitlines() == [told_in_one_line(done, "JOBQ_DATABASE_POOL_MODE", "JOBQ_LISTEN_URL")]
    done = run(tmp_path, "migrate", JOBQ_PORT="eighty")
    assert done.stderr.splitlines() == [told_in_one_line(done, "JOBQ_PORT", "integer")]


def test_a_missing_database_is_one_line(tmp_path, server_dsn):
    missing = with_database(server_dsn, "jobq_test_no_such_database")
    for migrate in ("true", "false"):  # found missing by the migration, or else by the pool
        done = serve(tmp_path, JOBQ_DATABASE_URL=missing, JOBQ_MIGRATE_ON_START=migrate)
        line = told_in_one_line(done, "JOBQ_DATABASE_URL", "jobq_test_no_such_database", "does not exist")
        assert "createdb jobq_test_no_such_database" in line
    done = run(tmp_path, "migrate", JOBQ_DATABASE_URL=missing)
    assert done.stderr.splitlines() == [told_in_one_line(done, "JOBQ_DATABASE_URL", "does not exist")]
    # Several processes: uvicorn's supervisor stops when one fails to start, and so does the command.
    done = serve(tmp_path, "--workers", "2", JOBQ_DATABASE_URL=missing)
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr
    assert "JOBQ_DATABASE_URL: database" in done.stderr
    # The traceback is for those who ask for it.
    done = serve(tmp_path, "--log-level", "debug", JOBQ_DATABASE_URL=missing)
    assert done.returncode != 0 and "Traceback" in done.stderr and "InvalidCatalogNameError" in done.stderr


def test_a_refused_connection_is_one_line(tmp_path):
    nobody = f"postgresql://postgres@127.0.0.1:{free_port()}/jobq"  # nothing listens there
    line = told_in_one_line(serve(tmp_path, JOBQ_DATABASE_URL=nobody), "JOBQ_DATABASE_URL", "cannot reach")
    assert "127.0.0.1" in line and "start it" in line
    # A listen URL of its own is named when it is the one at fault.
    done = serve(
        tmp_path,
        JOBQ_DATABASE_URL=nobody,
        JOBQ_LISTEN_URL=nobody.replace("/jobq", "/other"),
        JOBQ_DATABASE_POOL_MODE="transaction",
    )
    told_in_one_line(done, "JOBQ_LISTEN_URL", "cannot reach")


def test_pgbouncer_in_transaction_mode_unannounced_is_one_line(tmp_path, database_url, pgbouncer):
    pooled = through_pooler(database_url, pgbouncer)
    for migrate in ("true", "false"):
        done = serve(tmp_path, JOBQ_DATABASE_URL=pooled, JOBQ_MIGRATE_ON_START=migrate)
        told_in_one_line(
            done,
            "JOBQ_DATABASE_URL",
            "this looks like PgBouncer in transaction mode: set JOBQ_DATABASE_POOL_MODE=transaction and "
            "JOBQ_LISTEN_URL",
        )


@pytest.mark.parametrize("url", ["not a url", "mysql://root@127.0.0.1/app", "postgres:s3cr3t@127.0.0.1/app"])
def test_a_database_url_that_is_not_postgresql_is_one_line(tmp_path, url):
    done = serve(tmp_path, JOBQ_DATABASE_URL=url)
    line = told_in_one_line(done, "JOBQ_DATABASE_URL", "not a PostgreSQL URL", "postgresql://")
    assert done.stderr.splitlines() == [line] and "s3cr3t" not in done.stderr  # never repeated


def test_a_mistake_in_the_schedules_file_is_one_line(tmp_path, database_url):
    mistaken = '[schedules.nightly]\ncron = "0 3 * *"\nqueue = "q"\npayload = 1\n'  # 4 fields
    (tmp_path / "schedules.toml").write_text(mistaken)
    done = serve(tmp_path, JOBQ_DATABASE_URL=database_url, JOBQ_SCHEDULES_FILE="schedules.toml")
    told_in_one_line(done, "schedules.toml", "'nightly'", "cron")
