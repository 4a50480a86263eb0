"""Work each service process does on its own: expiring leases and waits for events (and moving the dead jobs
of queues with an SQS RedrivePolicy into their dead-letter queues, app/service/redrive.py), finished jobs'
retention, expired idempotency keys, workers long gone and old rollups, reading the metrics' database
gauges, writing the workers it saw lease and the rollups of what it counted (every metrics interval; with
the gauges, what holds back vacuum and the jobs table's state), and vacuuming the jobs table where
autovacuum does not (app/service/loops/vacuum.py).

Every replica runs these loops; the statements claim rows with SKIP LOCKED and re-check states, so replicas
share the work instead of colliding. A failing step (database down) is logged and retried on the next tick;
the loops end only when the app shuts down."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from app import service
from app.core.errors import DATABASE_UNAVAILABLE
from app.service import durable, flow, push, redrive, sqs_fifo, workflows
from app.service.loops import vacuum as maintenance
from app.service.runtime import Runtime
from app.telemetry.metrics import QueueGauges

log = logging.getLogger("jobq.background")


async def _every(interval: float, step: Callable[[], Awaitable[object]], name: str) -> None:
    while True:
        try:
            await step()
        except asyncio.CancelledError:
            raise
        except DATABASE_UNAVAILABLE as exc:
            log.warning("%s: database unavailable (%r)", name, exc)
        except Exception:
            log.exception("%s failed", name)
        await asyncio.sleep(interval)


def start(runtime: Runtime) -> list[asyncio.Task]:
    db = runtime.db

    async def expire_leases() -> None:
        changed = await service.expire_leases(runtime)
        if changed:
            log.info("returned %d expired leases", len(changed))
        waited = await durable.expire_waits(runtime)
        if waited:
            log.info("%d waits for an event ran out", waited)
        moved = await redrive.move_dead_letters(db)
        if moved:
            log.info("moved %d dead jobs into their SQS dead-letter queues", moved)

    async def prune() -> None:
        kept = await service.keep_history(db)
        if kept.moved or kept.made or kept.dropped or kept.pruned:
            log.info(
                "finished jobs: %d moved to jobs_history, partitions made %s, dropped %s, %d pruned",
                kept.moved,
                [str(d) for d in kept.made],
                [str(d) for d in kept.dropped],
                kept.pruned,
            )
        await redrive.forget_dead_letters(db)
        forgotten = await service.prune_idempotency_keys(db)
        if forgotten:
            log.info("forgot %d expired idempotency keys", forgotten)
        gone = await workflows.prune_workflows(db)
        if gone:
            log.info("forgot %d workflows whose jobs are all gone", gone)
        attempts = await sqs_fifo.prune_receive_attempts(db)
        if attempts:
            log.info("forgot %d expired SQS receive attempts", attempts)
        await service.forget_workers(db)
        await service.forget_rollups(db)
        await push.prune_holds(db)
        events = await durable.prune_events(db)
        if events:
            log.info("forgot %d events past their retention", events)
        journals = await durable.prune_journals(db)
        if journals:
            log.info("forgot the steps and events of %d jobs gone", journals)

    async def refresh_gauges() -> None:
        queues = await service.queue_gauges(db)
        held = await flow.flow_gauges(db) if any(q["flow"] for q in queues) else []
        locks = await service.lock_waits(db)
        health = await service.database_health(db)
        runtime.metrics.refreshed(
            QueueGauges(
                queues, locks["waiting"], locks["longest_seconds"], time.time(), held=held, health=health
            )
        )
        await service.write_rollups(runtime)  # with the lag just read
        finished = await workflows.refresh_running(runtime)
        if finished:
            log.info("%d workflows finished", finished)

    async def write_sightings() -> None:
        await service.write_sightings(runtime)

    async def vacuum() -> None:
        await maintenance.vacuum_if_needed(db)

    settings = runtime.settings
    tasks = [
        asyncio.create_task(
            _every(settings.expire_interval, expire_leases, "lease expiry"), name="jobq-expire-leases"
        ),
        asyncio.create_task(_every(settings.prune_interval, prune, "retention pruning"), name="jobq-prune"),
        asyncio.create_task(
            _every(settings.metrics_interval, refresh_gauges, "metrics gauges"), name="jobq-gauges"
        ),
        asyncio.create_task(
            _every(settings.metrics_interval, write_sightings, "workers seen"), name="jobq-workers-seen"
        ),
    ]
    if settings.vacuum_interval > 0:
        tasks.append(
            asyncio.create_task(_every(settings.vacuum_interval, vacuum, "vacuum"), name="jobq-vacuum")
        )
    return tasks


async def stop(tasks: list[asyncio.Task]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def last_writes(runtime: Runtime) -> None:
    """What this replica counted and saw since its last interval, written as it stops (the database
    allowing): a restart loses no counts of the charts."""
    try:
        await service.write_rollups(runtime)
        await service.write_sightings(runtime)
    except DATABASE_UNAVAILABLE as exc:
        log.warning("last rollups not written: database unavailable (%r)", exc)
