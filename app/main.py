"""The application: ``create_app(settings)`` builds it; its lifespan owns the pool, the process's Runtime
(app/service/runtime.py) and background work."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.middleware import Middleware

from app import __version__, startup
from app.core.access import Tokens
from app.db import embedded, migrations
from app.db.pool import Database, create_pool
from app.http import openapi, problems
from app.http.fastpath.hot import HotRoutes
from app.http.middleware import access_log
from app.http.middleware.origin import OriginCheck, allowed_hosts
from app.http.routers import docs, durable, health, keys, metrics, operators, producers, workers, workflows
from app.http.routers import schedules as schedule_routes
from app.http.web import BodyLimit
from app.service import schedules
from app.service.loops import background
from app.service.loops.pusher import Pusher
from app.service.loops.scheduler import Scheduler
from app.service.runtime import Runtime
from app.service.wakeups import Wakeups
from app.settings import Settings
from app.sqs import router as sqs
from app.telemetry import tracing
from app.telemetry.metrics import Metrics
from app.ui import routes as ui
from app.ui.session import Sessions

log = logging.getLogger("jobq")


async def resolve_database_url(settings: Settings) -> str:
    """The configured database, or the embedded one started (or joined) under data_dir."""
    if settings.database_url:
        return settings.database_url
    return await asyncio.to_thread(embedded.start, settings.data_dir)


def _answer_waiters_on_signals(wakeups: Wakeups) -> None:
    """On SIGTERM or SIGINT, answer waiting long-polls at once with no jobs, then let the server's own
    graceful shutdown run: it finishes requests in flight, which long-polls would otherwise hold for up
    to a minute. (Only in the main thread, where signal handlers live.)"""
    if threading.current_thread() is not threading.main_thread():
        return
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)
        if not callable(previous):
            continue

        def handler(signum: int, frame: object, previous: Callable = previous) -> None:
            loop.call_soon_threadsafe(wakeups.shutdown)
            previous(signum, frame)

        signal.signal(sig, handler)


def _settle_garbage_collection() -> None:
    """Spare the request path from collecting what startup built.

    The modules, models, routes and pool made while starting (over 100,000 objects) live as long as
    the process, yet each full collection walks them all again. ``gc.freeze`` sets them aside, and a
    larger first generation lets a request of 1,000 jobs finish before the collector runs at all:
    validating such a batch took 2.5 ms with the defaults and 1.1 ms this way. Reference counting still
    frees everything at once; only cycles wait a little longer."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # A schedules file with a mistake stops the start, before anything else, saying what is wrong.
        try:
            declared = schedule_routes.declared(settings.schedules_file) if settings.schedules_file else {}
        except ValueError as mistake:
            raise startup.StartupFailed(str(mistake)) from mistake
        dsn = await resolve_database_url(settings)
        session_url = settings.session_url(dsn)  # LISTEN, migrations, maintenance
        if settings.migrate_on_start:
            try:
                with startup.reaching(startup.session_setting(settings), session_url):
                    if not await migrations.at_head(session_url):
                        await asyncio.to_thread(migrations.upgrade, session_url, settings=settings)
            except migrations.SchemaAhead as ahead:
                # A newer release migrated (a rolling upgrade, or this build rolled back): nothing to
                # upgrade. Serve; /readyz says whether this build can run on that schema.
                log.warning("%s", ahead)
        tracing.start()  # when the OpenTelemetry environment asks for it (app/telemetry/tracing.py)
        with startup.reaching(startup.database_setting(settings), dsn):
            pool = await create_pool(dsn, settings)
        read_pool = None
        if settings.read_database_url:
            with startup.reaching("JOBQ_READ_DATABASE_URL", settings.read_database_url):
                read_pool = await create_pool(settings.read_database_url, settings)
        db = Database(pool, settings, session_url=session_url, read_pool=read_pool)
        # What the process keeps beside the pool, handed to what needs it; the routes that need only the
        # pool find it as app.state.db.
        app.state.runtime = runtime = Runtime(db, app.state.metrics)
        app.state.db = db
        wakeups = runtime.wakeups
        await wakeups.start()
        _answer_waiters_on_signals(wakeups)
        tasks = background.start(runtime)
        if settings.schedules_file is not None:
            await schedules.apply(db, declared)
        app.state.scheduler = scheduler = Scheduler(runtime)
        tasks.append(asyncio.create_task(scheduler.run(), name="jobq-scheduler"))
        app.state.pusher = pusher = Pusher(runtime)
        runtime.settings_listeners.append(pusher.settings_changed)
        pusher.start()
        _settle_garbage_collection()
        log.info("jobq %s ready", __version__)
        try:
            yield
        finally:
            await pusher.stop(settings.push_stop_grace)
            await wakeups.close()
            await background.stop(tasks)
            await background.last_writes(runtime)
            await scheduler.stop()
            await pool.close()
            await asyncio.to_thread(tracing.stop)  # exports the spans still held
            if read_pool is not None:
                await read_pool.close()
            if not settings.database_url:
                await asyncio.to_thread(embedded.release, settings.data_dir)

    app = FastAPI(
        title="jobq",
        version=__version__,
        summary="An HTTP job queue on PostgreSQL.",
        lifespan=lifespan,
        # FastAPI's built-in OpenTelemetry hooks look up their providers on every request; jobq exports
        # its own Prometheus metrics instead.
        telemetry={"tracing": False, "metrics": False, "logs": False},
        # FastAPI's own /openapi.json, /docs and /redoc are public whatever the tokens;
        # app/http/routers/docs.py serves the same behind a role check.
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        generate_unique_id_function=openapi.operation_id,
        servers=openapi.SERVERS,
        # Innermost of all (those added below go outside it), where only the lifespan stops: a start
        # that failed on a setting is told in one line, not a traceback (app/startup.py).
        middleware=[Middleware(startup.OneLineStartupFailures)],
    )
    app.state.settings = settings
    app.state.tokens = Tokens.load(settings.tokens, settings.tokens_file)
    secret = settings.session_secret.get_secret_value() if settings.session_secret else None
    app.state.sessions = Sessions(app.state.tokens, secret, settings.session_max_age)
    # Innermost: inside the body limit and the observation of requests.
    app.add_middleware(HotRoutes, routers=[producers.router, workers.router, operators.router])
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    # Outside the hot routes and the body limit: a request naming another host, or sent by a page of
    # another site, is refused before any of it is read or any route answers (app/http/middleware/origin.py).
    app.add_middleware(
        OriginCheck, allowed_hosts=allowed_hosts(settings), trusted_origins=settings.trusted_origins
    )
    app.state.metrics = Metrics()
    if settings.access_log:
        access_log.install()
    # Outermost: it times every request, also those a middleware inside it answers.
    app.add_middleware(access_log.ObserveRequests, metrics=app.state.metrics, access_log=settings.access_log)
    problems.install(app)
    routers = [
        m.router
        for m in (producers, workers, durable, workflows, operators, keys, schedule_routes)
        + (health, metrics, ui, docs)
    ]
    # The routers' own routes, made once as their modules were imported, serve every app: FastAPI's
    # include_router would make a copy of each route per app, at its first request (0.165) or at once
    # (before), rebuilding every model and dependency (70 ms of CPU, the first request's latency). Their
    # routers carry what an include would add (tags, role checks, operation ids); the committed
    # openapi.json's drift test holds the document to that.
    for router in [*routers, sqs.router]:  # sqs: the SQS API at POST / (app/sqs)
        app.router.routes.extend(router.routes)
    openapi.install(app, routers)
    return app
