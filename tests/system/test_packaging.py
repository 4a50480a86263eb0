"""The two distributions as wheels, installed as a user installs them, not run from the checkout.

Both wheels are built from what a release ships (pyproject.toml, README.md and app/ at the root, and
clients/python/), copied out of the checkout so that no leftover build directory adds to them, and
installed into fresh virtual environments. Their dependencies are not downloaded again: a .pth line in
the new environment names the dev environment's site-packages, which adds that directory to the path
but runs none of the .pth files in it, so the dev environment's editable installs of app and jobq stay
out. Everything then runs from a directory outside the checkout.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import asyncpg
import httpx
import pytest
from packaging.requirements import Requirement

from app.db import migrations
from tests.service_process import free_port

pytestmark = [pytest.mark.slow, pytest.mark.any_server]

ROOT = Path(__file__).resolve().parents[2]
# What a release is built from; the Dockerfile copies the same.
SHIPPED = ["pyproject.toml", "README.md", "app", "clients/python"]
CLIENT_COMMANDS = ["worker", "enqueue", "stats", "dead", "queues"]
SERVER_COMMANDS = ["serve", "migrate", "openapi"]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The client's wheel and the server's, by distribution name."""
    source = tmp_path_factory.mktemp("source")
    ignore = shutil.ignore_patterns("__pycache__", "build", "*.egg-info", "tests")
    for name in SHIPPED:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("wheels")
    build = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w"]
    done = subprocess.run(
        [*build, str(out), str(source / "clients" / "python"), str(source)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    built = {path.name.split("-")[0]: path for path in out.glob("*.whl")}
    assert sorted(built) == ["jobq", "jobq_server"], built
    return built


def environment(path: Path, *wheels: Path) -> Path:
    """A fresh virtual environment with `wheels` installed and the dev environment's packages (but not its
    editable installs) importable; its bin directory."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps"]
    done = subprocess.run([*install, *map(str, wheels)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "dev-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return path / "bin"


def outside_env(**extra: str) -> dict[str, str]:
    """This environment without the checkout on the path nor any jobq setting, plus `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "DATABASE_URL", "VIRTUAL_ENV") and not k.startswith("JOBQ_")
    }
    return {**env, **extra}


def run(bin: Path, *command: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(bin / command[0]), *command[1:]],
        cwd=cwd,
        env=outside_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


async def schema_revision(dsn: str) -> str | None:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval("SELECT version_num FROM jobq.alembic_version")
    finally:
        await conn.close()


def test_the_wheels_migrate_and_serve(wheels, database_url, tmp_path):
    bin = environment(tmp_path / "venv", wheels["jobq"], wheels["jobq_server"])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    migrations.downgrade(database_url, "base")  # a database with no schema yet
    # Where the packages are imported from, asked while the schema is made: the two share nothing.
    with ThreadPoolExecutor(1) as pool:
        asked = pool.submit(
            run,
            bin,
            "python",
            "-c",
            "import app, jobq; print(app.__file__); print(jobq.__file__)",
            cwd=elsewhere,
        )
        migrated = run(bin, "jobq", "migrate", cwd=elsewhere, JOBQ_DATABASE_URL=database_url)
        where = asked.result()
    assert where.returncode == 0, where.stderr
    assert all(Path(line).is_relative_to(tmp_path / "venv") for line in where.stdout.split())

    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout == "schema at head\n"
    head = migrations.head_revision()
    assert asyncio.run(schema_revision(database_url)) == head

    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("w") as output:
        service = subprocess.Popen(
            [str(bin / "jobq"), "serve", "--port", str(port), "--log-level", "warning"],
            cwd=elsewhere,
            # Not migrating on start: ready only because `jobq migrate` did its work.
            env=outside_env(JOBQ_DATABASE_URL=database_url, JOBQ_MIGRATE_ON_START="false"),
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        ready = wait_ready(service, url, log).json()
        assert (ready["ready"], ready["schema_revision"], ready["expected_revision"]) == (True, head, head)
        css = httpx.get(f"{url}/ui/static/ui.css")
        assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
        assert css.content == (ROOT / "app" / "ui" / "static" / "ui.css").read_bytes()
        swagger = httpx.get(f"{url}/docs/assets/5.35.0/swagger-ui-bundle.js")  # /docs works offline
        assert swagger.status_code == 200
        assets = ROOT / "app" / "http" / "docs_assets"
        assert swagger.content == (assets / "swagger-ui-bundle.js").read_bytes()
    finally:
        service.send_signal(signal.SIGTERM)
        try:
            service.wait(20)
        except subprocess.TimeoutExpired:
            service.kill()
            raise


def wait_ready(service: subprocess.Popen, url: str, log: Path, timeout: float = 60) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if service.poll() is not None:
            raise AssertionError(f"jobq serve exited: {log.read_text()}")
        try:
            answer = httpx.get(f"{url}/readyz", timeout=1)
            if answer.status_code == 200:
                return answer
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"jobq serve did not become ready: {log.read_text()}")


def test_the_client_wheel_alone(wheels, tmp_path):
    bin = environment(tmp_path / "venv", wheels["jobq"])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # At once: they share nothing, and each is mostly the start of a Python.
    with ThreadPoolExecutor(3) as pool:
        client, server, listed = pool.map(
            lambda command: run(bin, *command, cwd=elsewhere),
            [
                ("python", "-c", "import jobq; print(jobq.__file__)"),
                ("python", "-c", "import app"),
                ("jobq", "--help"),
            ],
        )
    assert client.returncode == 0, client.stderr
    assert Path(client.stdout.strip()).is_relative_to(tmp_path / "venv")
    assert server.returncode == 1 and "No module named 'app'" in server.stderr

    assert listed.returncode == 0, listed.stderr
    for command in CLIENT_COMMANDS:
        assert f" {command} " in listed.stdout
    for command in SERVER_COMMANDS:
        assert f" {command} " not in listed.stdout


def test_each_package_has_one_version():
    """Each distribution's version is written once, in its pyproject.toml (or package.json), and read from
    there at run time; the server pins the client it is released with, at that version."""
    server = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    client = tomllib.loads((ROOT / "clients" / "python" / "pyproject.toml").read_text())["project"]
    pins = [spec for spec in server["dependencies"] if Requirement(spec).name == "jobq"]
    assert pins == [f"jobq=={client['version']}"], "the server's pin on jobq is not the client's version"

    import app
    import jobq

    assert (app.__version__, jobq.__version__) == (server["version"], client["version"])

    typescript = ROOT / "clients" / "typescript"
    package = json.loads((typescript / "package.json").read_text())
    lock = json.loads((typescript / "package-lock.json").read_text())
    assert lock["version"] == lock["packages"][""]["version"] == package["version"], (
        "package-lock.json is not package.json's version: run `npm install` in clients/typescript"
    )
