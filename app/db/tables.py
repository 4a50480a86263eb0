"""The schema: SQLAlchemy tables in the ``jobq`` schema. The job statuses and the limits their CHECK
constraints hold are app/core's (states.py, limits.py).

These models and the Alembic chain in ``app/db/alembic/versions`` are the single definition of the schema; a
test compares them. The hot paths run the hand-written SQL in ``app/db/sql/`` against these tables."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Double,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.dialects.postgresql import UUID as PG_UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from app.core.cron import CatchUp
from app.core.limits import (
    DEFAULT_BACKOFF_BASE,
    DEFAULT_BACKOFF_CAP,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETENTION,
    DEFAULT_VISIBILITY_TIMEOUT,
    KIND_PATTERN,
    MAX_KEY,
    MAX_PARENTS,
    MAX_TRACESTATE,
    QUEUE_NAME_PATTERN,
    TRACEPARENT_PATTERN,
)
from app.core.states import JobStatus, RunIf, WorkflowStatus, status_in, status_in_values

SCHEMA = "jobq"


# Fixed index and constraint names keep Alembic's comparison stable.
metadata = MetaData(
    schema=SCHEMA,
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "pk": "pk_%(table_name)s",
    },
)


class Base(DeclarativeBase):
    metadata = metadata


class Queue(Base):
    """One row per queue: settings and pause state. A queue exists once it has a job or settings."""

    __tablename__ = "queues"
    __table_args__ = (CheckConstraint(f"name ~ '{QUEUE_NAME_PATTERN}'", name="name_format"),)

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    paused: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    visibility_timeout: Mapped[float] = mapped_column(
        Double, server_default=text(repr(DEFAULT_VISIBILITY_TIMEOUT))
    )
    max_attempts: Mapped[int] = mapped_column(Integer, server_default=text(str(DEFAULT_MAX_ATTEMPTS)))
    backoff_base: Mapped[float] = mapped_column(Double, server_default=text(repr(DEFAULT_BACKOFF_BASE)))
    backoff_cap: Mapped[float] = mapped_column(Double, server_default=text(repr(DEFAULT_BACKOFF_CAP)))
    retention: Mapped[float] = mapped_column(Double, server_default=text(repr(DEFAULT_RETENTION)))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # Attributes set through the SQS API (app/sqs) that have no jobq setting: DelaySeconds,
    # MessageRetentionPeriod, RedrivePolicy, ... as SQS spells them. NULL for queues SQS never configured.
    sqs_attributes: Mapped[dict | None] = mapped_column(JSONB)
    # Tags set through the SQS API (TagQueue, CreateQueue's tags): a JSON object of strings, reported by
    # ListQueueTags and nothing else. NULL: none.
    sqs_tags: Mapped[dict | None] = mapped_column(JSONB)
    # The last SQS PurgeQueue: SQS takes one a minute per queue. NULL: never purged through SQS.
    sqs_purged_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Flow control (app/service/flow.py); NULL or false: no limit. At most this many jobs of one key running
    # at once (1: a key's jobs also run in order); ready jobs handed out across keys in turn; at most
    # rate_limit leases of the queue, and key_rate_limit of each key, in any rate_period / key_rate_period
    # seconds.
    key_concurrency: Mapped[int | None] = mapped_column(Integer)
    fair: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    rate_limit: Mapped[int | None] = mapped_column(Integer)
    rate_period: Mapped[float | None] = mapped_column(Double)
    key_rate_limit: Mapped[int | None] = mapped_column(Integer)
    key_rate_period: Mapped[float | None] = mapped_column(Double)
    # Some flow control applies (a setting above, or a key's override in `keys`): the queue is claimed by
    # the flow-controlled claim, and the plain LEASE leaves it alone.
    flow: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    # The queue's rate window: when its leases of the last rate_period seconds were taken, and how many
    # at each time (one entry per claim statement).
    rate_times: Mapped[list[datetime] | None] = mapped_column(ARRAY(DateTime(timezone=True)))
    rate_counts: Mapped[list[int] | None] = mapped_column(ARRAY(Integer))
    # With `fair`: the key the queue's last claim served last, written by the claim; the next claim, on
    # any replica, begins with the key after it (in key order, from the first again after the last).
    # NULL: from the first key.
    fair_last_key: Mapped[str | None] = mapped_column(Text)
    # Push delivery (app/service/push.py): {url, timeout, concurrency}, NULL: workers lease the queue's
    # jobs themselves. The secret its requests are signed with ("whsec_" and base64), and the one it
    # replaced, valid too until push_secret_previous_until. Never shown once made.
    push: Mapped[dict | None] = mapped_column(JSONB)
    push_secret: Mapped[str | None] = mapped_column(Text)
    push_secret_previous: Mapped[str | None] = mapped_column(Text)
    push_secret_previous_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # No delivery of the queue before this time: its endpoint answered 429 or 503 with Retry-After for a
    # job without a key. NULL: none held.
    push_held_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class JobColumns:
    """A job's columns, as both tables that hold jobs have them: `jobs` (waiting, running and dead jobs)
    and `jobs_history` (completed and cancelled ones, moved there by the statement that finished them:
    app/db/sql/fragments.py, JOB_COLUMNS). A column added here is added to both tables, and to the `all_jobs`
    view that unites them, in the same revision."""

    queue: Mapped[str] = mapped_column(Text)
    status: Mapped[JobStatus] = mapped_column(Text, server_default=text(f"'{JobStatus.PENDING}'"))
    payload: Mapped[object] = mapped_column(JSONB)
    priority: Mapped[int] = mapped_column(Integer, server_default=text("0"))  # lower runs first
    run_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    attempts: Mapped[int] = mapped_column(Integer, server_default=text("0"))  # leases so far
    # NULL: the queue's max_attempts, read when it matters, so changing the queue setting applies to
    # jobs already waiting.
    max_attempts: Mapped[int | None] = mapped_column(Integer)
    dedup_key: Mapped[str | None] = mapped_column(Text)
    last_error: Mapped[str | None] = mapped_column(Text)
    # The latest lease's token. Kept after expiry so the last holder may still ack; cleared by nack and
    # by dead retry, which end that lease for good.
    lease_token: Mapped[UUID | None] = mapped_column(PG_UUID(as_uuid=True))
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    worker_id: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # When the job reached a final state (completed or cancelled); retention counts from here.
    completed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # SQS message attributes ({name: {DataType, StringValue | BinaryValue}}) of a message sent through
    # the SQS API (app/sqs), and when SQS first handed it out (ApproximateFirstReceiveTimestamp).
    message_attributes: Mapped[dict | None] = mapped_column(JSONB)
    first_received_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # What the job is (send_email), for a worker to route it by; the service only stores and shows it.
    # NULL: none given.
    kind: Mapped[str | None] = mapped_column(Text)
    # What the worker's ack sent (any JSON value, at most JOBQ_MAX_RESULT_BYTES encoded); NULL: none.
    # Goes with the row at the queue's retention.
    result: Mapped[object | None] = mapped_column(JSONB)
    # What the worker last sent with an extend (same limit), kept after the job ends; NULL: none yet.
    progress: Mapped[object | None] = mapped_column(JSONB)
    # Someone waits for the job to finish (GET /jobs/{id}?wait=N): the statement that finishes it then
    # notifies its id (DONE_CHANNEL, app/db/sql/fragments.py). Set by the waiter, never cleared.
    awaited: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    # What flow control groups the job by (a tenant, a customer, an SQS MessageGroupId); NULL: none.
    key: Mapped[str | None] = mapped_column(Text)
    # The schedule that enqueued the job, and the slot (the cron time) it was enqueued for; NULL slot:
    # enqueued by a trigger. A slot's job is unique (uq_jobs_queue_schedule_slot).
    schedule: Mapped[str | None] = mapped_column(Text)
    schedule_slot: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The W3C trace context the job was enqueued under (its producer's span); NULL: none given.
    traceparent: Mapped[str | None] = mapped_column(Text)
    tracestate: Mapped[str | None] = mapped_column(Text)
    # The jobs this one waits for (its parents, as enqueued) and what they must end as for it to run:
    # `completed`, `finished` or `failed` (app/db/functions.sql, jobq.decide()). NULL both: no parents.
    depends_on: Mapped[list[int] | None] = mapped_column(ARRAY(BigInteger))
    run_if: Mapped[str | None] = mapped_column(Text)
    # The workflow that made the job (POST /workflows); NULL: none.
    workflow_id: Mapped[int | None] = mapped_column(BigInteger)
    # Some job has (or had) this one among its parents: its end then decides them (the triggers
    # job_dead and job_gone fire for such jobs, and jobs of workflows, alone).
    has_children: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    # Debounce (POST /jobs `debounce`): the key enqueues of the queue share while the job is pending, and the
    # latest its run_at may move to (its creation + max_seconds); NULL: not debounced, or no bound.
    debounce_key: Mapped[str | None] = mapped_column(Text)
    debounce_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The outcome of the job's last push delivery (app/service/push.py): {at, outcome, status, ms,
    # error?, note?}; NULL: never pushed.
    delivery: Mapped[object | None] = mapped_column(JSONB)
    # Durable steps, sleeps and events (app/service/durable.py): true once the job has a row in
    # jobq.job_journal (its steps and the events that reached it); while `waiting` for an event, its name
    # (run_at is then the wait's deadline); and, once released to sleep, until when, or once woken from a
    # wait, when (a job with it set has begun: it holds an in-order key's place, sql.fragments.KEY_HOLDER).
    journaled: Mapped[bool | None] = mapped_column(Boolean)
    wait_event: Mapped[str | None] = mapped_column(Text)
    sleep_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Job(JobColumns, Base):
    """A unit of work not finished yet: pending, running, or dead. The table churns (every row is
    inserted, updated once or twice, and deleted when it finishes): fillfactor and autovacuum are tuned
    in the migration."""

    __tablename__ = "jobs"
    __table_args__ = (
        CheckConstraint(status_in(*JobStatus), name="status_known"),
        CheckConstraint("max_attempts IS NULL OR max_attempts >= 1", name="max_attempts_positive"),
        CheckConstraint(f"kind ~ '{KIND_PATTERN}'", name="kind_format"),
        CheckConstraint(f"char_length(key) BETWEEN 1 AND {MAX_KEY}", name="key_length"),
        CheckConstraint(f"run_if IN ({', '.join(repr(str(r)) for r in RunIf)})", name="run_if_known"),
        CheckConstraint(f"cardinality(depends_on) BETWEEN 1 AND {MAX_PARENTS}", name="depends_on_size"),
        CheckConstraint(
            f"traceparent ~ '{TRACEPARENT_PATTERN}'"
            f" AND char_length(coalesce(tracestate, '')) <= {MAX_TRACESTATE}",
            name="trace_context",
        ),
        # The claim: ready jobs of one queue in lease order. Partial, so however many finished rows the
        # table holds, this index holds only the waiting ones.
        Index(
            "ix_jobs_claim",
            "queue",
            "priority",
            "run_at",
            "id",
            postgresql_where=text("status = 'pending'"),
        ),
        # Jobs waiting for their parents, per queue (GET /jobs?status=waiting, the gauges).
        Index("ix_jobs_waiting", "queue", "id", postgresql_where=text("status = 'waiting'")),
        # One pending job per debounce key of a queue: an enqueue with the key lands in it
        # (ENQUEUE_DEBOUNCED, ON CONFLICT against this index).
        Index(
            "uq_jobs_debounce",
            "queue",
            "debounce_key",
            unique=True,
            postgresql_where=text("status = 'pending' AND debounce_key IS NOT NULL"),
        ),
        # A workflow's jobs (GET /workflows/{id}, its cancel and retry).
        Index("ix_jobs_workflow", "workflow_id", postgresql_where=text("workflow_id IS NOT NULL")),
        # Push deliveries in flight, per queue: what a claim of deliveries counts against the target's
        # concurrency (app/db/sql/push.py PUSH_GATE). Workers' leases are not in it.
        Index(
            "ix_jobs_pushing",
            "queue",
            postgresql_where=text("status = 'running' AND worker_id LIKE 'push:%'"),
        ),
        # Jobs waiting for an event: by its name (POST /events wakes them), and by deadline (EXPIRE_WAITS).
        Index(
            "ix_jobs_awaiting",
            "wait_event",
            postgresql_where=text("status = 'waiting' AND wait_event IS NOT NULL"),
        ),
        Index(
            "ix_jobs_await_due",
            "run_at",
            postgresql_where=text("status = 'waiting' AND wait_event IS NOT NULL"),
        ),
        # Lease expiry: running jobs by deadline.
        Index("ix_jobs_lease_expiry", "lease_expires_at", postgresql_where=text("status = 'running'")),
        # At most one active job per (queue, dedup_key); enqueue uses ON CONFLICT DO NOTHING against it.
        Index(
            "uq_jobs_dedup",
            "queue",
            "dedup_key",
            unique=True,
            postgresql_where=text("status IN ('pending', 'running') AND dedup_key IS NOT NULL"),
        ),
        # The dead-letter list, newest first, per queue or across queues.
        Index("ix_jobs_dead", "queue", "id", postgresql_where=text("status = 'dead'")),
        # A queue's jobs of every status, newest first (GET /jobs?queue=). Unique, as the primary key
        # of a jobs table distributed by queue would be (README: Scaling out). The primary key stays on
        # id alone on one server: the claims' plans rely on a unique index on id (app/db/sql/claim.py, LEASE).
        Index("uq_jobs_queue_id", "queue", "id", unique=True),
        # One job per schedule slot, however many replicas fire (app/service/schedules.py).
        Index(
            "uq_jobs_queue_schedule_slot",
            "queue",
            "schedule",
            "schedule_slot",
            unique=True,
            postgresql_where=text("schedule_slot IS NOT NULL"),
        ),
        # Flow control (app/service/flow.py), over jobs with a key only: each key's ready jobs in lease order
        # (and the keys that have any, walked one after the other) ...
        Index(
            "ix_jobs_key_ready",
            "queue",
            "key",
            "priority",
            "run_at",
            "id",
            postgresql_where=text("status = 'pending' AND key IS NOT NULL"),
        ),
        # ... and the jobs that hold a key's slot: running, or begun and not running (waiting for a retry,
        # asleep or woken from a sleep or a wait, parked on an event: sql.fragments.KEY_HOLDER), which hold
        # a key whose jobs run in order. The id makes each entry unique: a key's entries as duplicates were
        # packed into posting lists and split again by every lease (alembic 0020).
        Index(
            "ix_jobs_key_held",
            "queue",
            "key",
            "id",
            postgresql_where=text(
                "key IS NOT NULL AND (status = 'running' OR (status = 'pending' AND (attempts > 0 OR "
                "sleep_until IS NOT NULL)) OR (status = 'waiting' AND wait_event IS NOT NULL))"
            ),
        ),
        # Retention pruning of finished jobs.
        Index(
            "ix_jobs_finished",
            "completed_at",
            postgresql_where=text("status IN ('completed', 'cancelled')"),
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)


class JobHistory(JobColumns, Base):
    """Completed and cancelled jobs, each moved here by the statement that finished it, until its
    `purge_after` (its queue's retention, counted from when it finished). Partitioned by day of
    `purge_after`: retention drops a day's partition whole (app/service/history.py) instead of deleting rows,
    and the rows are written once and never updated, so the table makes no dead tuples. The partitions
    (`jobs_history_pYYYYMMDD`, and `jobs_history_default` for a row no day's partition takes) are made by
    the service, not by the migrations."""

    __tablename__ = "jobs_history"
    __table_args__ = (
        # The key names the queue, as a table distributed by queue needs (README: Scaling out), and
        # holds purge_after, as a partitioned table's must; it serves a queue's finished jobs, newest
        # first (GET /jobs?queue=). ix_jobs_history_id finds one by id.
        PrimaryKeyConstraint("queue", "id", "purge_after", name="pk_jobs_history"),
        Index("ix_jobs_history_id", "id"),
        Index("ix_jobs_history_workflow", "workflow_id", postgresql_where=text("workflow_id IS NOT NULL")),
        {"postgresql_partition_by": "RANGE (purge_after)"},
    )

    id: Mapped[int] = mapped_column(BigInteger)
    purge_after: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class JobJournal(Base):
    """A job's durable record (API part 8, app/service/durable.py): the results its handler recorded, by
    step name (NULL: none), and the events that reached it ({id, name, payload, at}, and {name, payload,
    at, timed_out} for a wait that ran out), in order. Beside the job's row rather than in it, so that a
    lease, which rewrites the row, does not write them again (app/db/sql/fragments.py, JOURNAL). Kept
    while the job is (in jobq.jobs, or in jobs_history until its purge_after), then pruned."""

    __tablename__ = "job_journal"

    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    steps: Mapped[object | None] = mapped_column(JSONB)
    events: Mapped[object | None] = mapped_column(JSONB)


class Event(Base):
    """An event sent by name (POST /events, jobq.send_event()): it woke the jobs awaiting its name then,
    and is kept for JOBQ_EVENT_RETENTION so that a job awaiting it later finds it (app/service/durable.py).
    `scope`: the queues (LIKE patterns) of the token that sent it, which alone it reaches; NULL: all."""

    __tablename__ = "events"
    __table_args__ = (
        Index("ix_events_name", "name", "id"),
        Index("ix_events_at", "at"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    name: Mapped[str] = mapped_column(Text)
    payload: Mapped[object | None] = mapped_column(JSONB)
    scope: Mapped[list[str] | None] = mapped_column(ARRAY(Text))
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=text("now()"))


class Workflow(Base):
    """Jobs made together by POST /workflows, each with a `ref` its siblings name as parents. Its status is
    its jobs' (app/service/workflows.py): running while any may still run, then completed, failed or
    cancelled; kept here for lists and filters, brought up to date by whoever reads it and by the
    background loop."""

    __tablename__ = "workflows"
    __table_args__ = (
        CheckConstraint(status_in_values(WorkflowStatus), name="status_known"),
        Index("ix_workflows_status", "status", "id"),
        # Finished workflows, oldest first: those pruning looks at (their jobs all gone, they go).
        Index("ix_workflows_finished", "finished_at", postgresql_where=text("status <> 'running'")),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    name: Mapped[str | None] = mapped_column(Text)
    status: Mapped[str] = mapped_column(Text, server_default=text(f"'{WorkflowStatus.RUNNING}'"))
    # Each job's ref and id, in the request's order.
    refs: Mapped[list[str]] = mapped_column(ARRAY(Text))
    job_ids: Mapped[list[int]] = mapped_column(ARRAY(BigInteger))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # When it was seen finished (completed, failed, or cancelled); NULL while running.
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class JobEdge(Base):
    """A parent that has not ended yet, and a child waiting for it: deleted when the parent ends, by the
    transaction that ends it (app/db/functions.sql, jobq.parents_ended())."""

    __tablename__ = "job_edges"

    parent_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    child_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)


class JobWait(Base):
    """A `waiting` job's count of parents yet to end; deleted when it is decided (jobq.decide())."""

    __tablename__ = "job_waits"

    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    parents_left: Mapped[int] = mapped_column(Integer)
    # The first parent (by id) that ended other than completed, and how it ended; NULL: none so far.
    failed_parent: Mapped[int | None] = mapped_column(BigInteger)
    failed_status: Mapped[str | None] = mapped_column(Text)
    # The parent whose end was counted last: the one that decided the job.
    last_parent: Mapped[int | None] = mapped_column(BigInteger)
    # The `delay` the job was enqueued with, counted from its decision; NULL: none.
    start_delay: Mapped[float | None] = mapped_column(Double)


class Key(Base):
    """A key of a queue that has an override of the queue's per-key limits, or a rate window to keep (a
    row is made on the first lease under a per-key rate). Keys without either have no row: their jobs
    carry them (app/service/flow.py)."""

    __tablename__ = "keys"

    queue: Mapped[str] = mapped_column(Text, primary_key=True)
    key: Mapped[str] = mapped_column(Text, primary_key=True)
    # Overrides of the queue's key_concurrency and key_rate; NULL: the queue's.
    concurrency: Mapped[int | None] = mapped_column(Integer)
    rate_limit: Mapped[int | None] = mapped_column(Integer)
    rate_period: Mapped[float | None] = mapped_column(Double)
    # The key's rate window, as the queue's (Queue.rate_times).
    rate_times: Mapped[list[datetime] | None] = mapped_column(ARRAY(DateTime(timezone=True)))
    rate_counts: Mapped[list[int] | None] = mapped_column(ARRAY(Integer))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class PushHold(Base):
    """A key of a push queue whose deliveries wait: its endpoint answered 429 or 503 with Retry-After for
    one of its jobs. Gone once past (pruned with finished jobs)."""

    __tablename__ = "push_holds"

    queue: Mapped[str] = mapped_column(Text, primary_key=True)
    key: Mapped[str] = mapped_column(Text, primary_key=True)
    until: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Schedule(Base):
    """A cron schedule: each slot of `cron` in `timezone` enqueues one job (app/service/schedules.py)."""

    __tablename__ = "schedules"
    __table_args__ = (
        CheckConstraint("catch_up IN ('skip', 'once', 'all')", name="catch_up_known"),
        # The scheduler's look for due schedules.
        Index("ix_schedules_due", "next_run_at", postgresql_where=text("NOT paused")),
    )

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    cron: Mapped[str] = mapped_column(Text)  # five fields, or six with a leading seconds field
    timezone: Mapped[str] = mapped_column(Text, server_default=text("'UTC'"))  # an IANA name
    # The job each slot enqueues.
    queue: Mapped[str] = mapped_column(Text)
    payload: Mapped[object] = mapped_column(JSONB)
    kind: Mapped[str | None] = mapped_column(Text)
    priority: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    max_attempts: Mapped[int | None] = mapped_column(Integer)
    key: Mapped[str | None] = mapped_column(Text)
    catch_up: Mapped[CatchUp] = mapped_column(Text, server_default=text(f"'{CatchUp.ONCE}'"))
    paused: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    # The next slot to fire (NULL while paused); the last slot fired (or triggered), and its job.
    next_run_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_run_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_job_id: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class Leader(Base):
    """Who does a job meant for one replica at a time (`scheduler`: firing schedules), until when: the
    holder renews it while alive, and another replica takes it once it has expired."""

    __tablename__ = "leaders"

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    holder: Mapped[str] = mapped_column(Text)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class IdempotencyKey(Base):
    """The answer of an enqueue sent with an `Idempotency-Key` header, kept so that the same request
    sent again (a client retrying after a lost answer) gets it again and inserts nothing. Written in the
    same statement or transaction as the jobs, so a key exists exactly when its jobs were committed;
    deleted once past `expires_at` (app/service/idempotency.py)."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (Index("ix_idempotency_keys_expires_at", "expires_at"),)

    # Whose key: the hex SHA-256 digest of the bearer token that sent it, '' without tokens configured.
    # Keys of one credential never answer another's requests.
    scope: Mapped[str] = mapped_column(Text, primary_key=True)
    key: Mapped[str] = mapped_column(Text, primary_key=True)
    # SHA-256 of the route and the request's jobs: the same key with another request is refused.
    request_hash: Mapped[bytes] = mapped_column(LargeBinary)
    # What the database decided for each job of the answer, in request order (the rest of a new job is
    # the request itself): its id, its run_at where that is not created_at, its resolved max_attempts.
    ids: Mapped[list[int]] = mapped_column(ARRAY(BigInteger))
    run_ats: Mapped[list[datetime | None] | None] = mapped_column(ARRAY(DateTime(timezone=True)))
    max_attempts: Mapped[list[int | None]] = mapped_column(ARRAY(Integer))
    # The whole answer as JSON text, for an answer the request cannot rebuild (POST /workflows's); NULL
    # for an enqueue's.
    answer: Mapped[str | None] = mapped_column(Text)
    # Items answered as duplicates (an active dedup_key's holder, or a repeat within the batch): each
    # one's answer as JSON text, byte for byte, in request order, NULL for new jobs; NULL when there were
    # none. Text, not jsonb, so that the payload in it keeps its spelling.
    holders: Mapped[list[str | None] | None] = mapped_column(ARRAY(Text))
    # When the jobs were inserted (their created_at); kept until expires_at (JOBQ_IDEMPOTENCY_TTL later).
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class SqsReceiveAttempt(Base):
    """An SQS FIFO ReceiveMessage sent with a `ReceiveRequestAttemptId`: the messages it leased, under
    which lease tokens, so that the same receive sent again (an SDK retrying after a lost answer) gets the
    same messages and receipt handles back instead of new ones (app/service/sqs_fifo.py). Kept in the
    database so a retry that reaches another replica finds it; deleted once past `expires_at` (five
    minutes, SQS's deduplication interval)."""

    __tablename__ = "sqs_receive_attempts"
    __table_args__ = (Index("ix_sqs_receive_attempts_expires_at", "expires_at"),)

    queue: Mapped[str] = mapped_column(Text, primary_key=True)
    attempt_id: Mapped[str] = mapped_column(Text, primary_key=True)
    # The jobs leased and each one's lease token, in the order the receive answered them.
    ids: Mapped[list[int]] = mapped_column(ARRAY(BigInteger))
    lease_tokens: Mapped[list[UUID]] = mapped_column(ARRAY(PG_UUID(as_uuid=True)))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class SqsDeletedQueue(Base):
    """A queue SQS DeleteQueue deleted, kept for a minute: as in SQS, CreateQueue refuses its name until
    then (QueueDeletedRecently), on every replica. Older rows are deleted by the next DeleteQueue."""

    __tablename__ = "sqs_deleted_queues"

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    deleted_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class SqsDeadLetter(Base):
    """A job the SQS redrive moved into a dead-letter queue (app/db/sql/dead.py, REDRIVE_DEAD), and the
    queue it came from, where StartMessageMoveTask takes it back. Dropped when it goes back, or once the job
    has left the dead-letter queue otherwise (FORGET_DEAD_LETTERS)."""

    __tablename__ = "sqs_dead_letters"

    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    source: Mapped[str] = mapped_column(Text)


class WorkerSeen(Base):
    """A worker (its `worker_id`, as sent with `POST /lease`) seen leasing from a queue: when last, and how
    many jobs it has leased there since it was first kept. Each replica keeps what it sees in memory and
    writes it here every few seconds (app/service/workers_seen.py), so the dashboard's workers page and
    `GET /workers` show every replica's workers; rows not seen for WORKERS_KEPT are deleted."""

    __tablename__ = "workers"
    __table_args__ = (Index("ix_workers_last_seen", "last_seen"),)

    worker_id: Mapped[str] = mapped_column(Text, primary_key=True)
    queue: Mapped[str] = mapped_column(Text, primary_key=True)
    last_seen: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    leased: Mapped[int] = mapped_column(BigInteger, server_default="0")


class Rollup(Base):
    """A queue's minute: jobs enqueued, completed (acked), failed (nacked, or their lease expired) and
    dead in it, and the longest lag (age of the oldest ready job) seen in it; the dashboard's charts.
    Every replica adds what it counted every metrics interval (app/service/rollups.py), so the figures are
    the sum over replicas. Kept ROLLUPS_KEPT (8 days)."""

    __tablename__ = "rollups"
    __table_args__ = (Index("ix_rollups_minute", "minute"),)

    queue: Mapped[str] = mapped_column(Text, primary_key=True)
    minute: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    enqueued: Mapped[int] = mapped_column(BigInteger, server_default="0")
    completed: Mapped[int] = mapped_column(BigInteger, server_default="0")
    failed: Mapped[int] = mapped_column(BigInteger, server_default="0")
    dead: Mapped[int] = mapped_column(BigInteger, server_default="0")
    lag: Mapped[float | None] = mapped_column(Double)
