"""The service layer: every jobq operation, in terms of the statements in ``app/db/sql/``.

No HTTP here. Each function takes the ``Database`` (or, where it needs more than the pool, the
process's ``Runtime``, app/service/runtime.py), acquires one connection, runs its statements (a
transaction only where several must commit together) and returns plain dicts, or raises an
``app.core.errors`` exception. It takes plain values (app/service/arguments.py), never a request. One
name from route to service to statement: ``POST /ack`` -> ``jobs.ack`` -> ``ACK``.

The modules follow the routers (app/http/routers/): ``producers`` (enqueue, get_job, cancel), ``leasing``
and ``workers`` (lease; ack, nack, release, extend), ``operators`` (job lists, dead jobs, jobs picked by
hand, queues), ``health`` (readiness); then ``idempotency`` (the `Idempotency-Key` machinery),
``inserts`` (what every enqueue runs), ``background`` (what the background loops run), ``workers_seen``
(which workers leased, for the workers page), ``rollups`` (counts per minute, for the charts),
``coalesce`` (calls sharing a statement), ``runtime`` (what a process keeps beside its pool) and ``rows``
(a job as answered). Callers use this package's names: ``from app import jobs; jobs.lease(...)``.
"""

from app.service.arguments import (
    Ack,
    AckLike,
    JobLease,
    JobLeaseLike,
    Nack,
    NackLike,
    NewJob,
    NewJobLike,
    QueueSettings,
    QueueSettingsLike,
)
from app.service.health import schema_revision
from app.service.history import keep_history
from app.service.idempotency import Once, prune_idempotency_keys
from app.service.leasing import lease
from app.service.operators import (
    cancel_jobs,
    configure_queue,
    dead_jobs,
    every_match,
    list_jobs,
    purge_dead,
    purge_dead_jobs,
    queue,
    queue_cancelled,
    queues,
    retry_dead,
    run_now,
    set_paused,
)
from app.service.parents import job_parents
from app.service.producers import cancel, enqueue, enqueue_batch, get_job, wait_for_job
from app.service.push import rotate_secret as rotate_push_secret
from app.service.rollups import completed_lately, forget_rollups, rollup_series, write_rollups
from app.service.rows import Row, Scope
from app.service.runtime import Runtime
from app.service.upkeep import database_health, expire_leases, lock_waits, queue_gauges
from app.service.workers import ack, ack_batch, extend, nack, nack_batch, release, release_to_sleep, single
from app.service.workers_seen import forget_workers, list_workers, write_sightings

__all__ = [
    "Ack",
    "AckLike",
    "JobLease",
    "JobLeaseLike",
    "Nack",
    "NackLike",
    "NewJob",
    "NewJobLike",
    "Once",
    "QueueSettings",
    "QueueSettingsLike",
    "Row",
    "Runtime",
    "Scope",
    "ack",
    "ack_batch",
    "cancel",
    "cancel_jobs",
    "completed_lately",
    "configure_queue",
    "database_health",
    "dead_jobs",
    "list_jobs",
    "list_workers",
    "enqueue",
    "enqueue_batch",
    "every_match",
    "expire_leases",
    "extend",
    "forget_rollups",
    "forget_workers",
    "get_job",
    "job_parents",
    "keep_history",
    "lease",
    "lock_waits",
    "nack",
    "nack_batch",
    "prune_idempotency_keys",
    "purge_dead",
    "purge_dead_jobs",
    "queue",
    "queue_cancelled",
    "queue_gauges",
    "queues",
    "release",
    "release_to_sleep",
    "retry_dead",
    "rotate_push_secret",
    "rollup_series",
    "run_now",
    "schema_revision",
    "set_paused",
    "single",
    "wait_for_job",
    "write_rollups",
    "write_sightings",
]
