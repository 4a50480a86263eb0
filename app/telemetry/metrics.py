"""Prometheus metrics: one ``Metrics`` per app, with a registry of its own (tests run several apps in one
process, and two apps must not count into each other).

Three kinds of numbers, each gathered where it is cheapest:

- Counters of jobs per queue, incremented by the service layer (app/service/) once per statement with the
  number of jobs it changed: a lease of 100 jobs is one increment, not a hundred.
- Gauges that need the database (depth per state, lag, paused, lock waits) are read by a background
  step every ``metrics_interval`` seconds (app/service/loops/background.py) into a snapshot, which a scrape
  only copies out: however often Prometheus scrapes, and however many replicas it scrapes, the database sees
  one small query per replica per interval.
- Histograms of request latency per route template (fed by the request middleware in
  app/http/middleware/access_log.py) and of the claim statement's duration per queue.

Series per queue exist only for queues that exist: the job counters move only when a statement changed
jobs of the queue, and a claim series is made for a queue the last snapshot lists or a claim that
leased something (a lease may name any queue, and names that are none must not grow /metrics).

Counters live in each service process; with ``jobq serve --workers N`` a scrape reaches one process of
the N, so run one process per replica (container) and scrape each replica. The gauges are the same
whichever process answers: they come from the database.
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

__all__ = ["CONTENT_TYPE_LATEST", "DatabaseHealth", "Metrics", "QueueGauges", "holding_back"]

# Seconds. Claims are a single indexed statement: sub-millisecond when healthy, so the low end is fine;
# the tail (dead tuples in the claim index, lock contention) shows up in the upper buckets.
CLAIM_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Seconds. Long-polls (POST /lease with `wait`) last up to 60 s, so the buckets reach that far.
REQUEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# How far back the dashboard's throughput looks (seconds).
THROUGHPUT_WINDOW = 60.0

JOB_STATES = ("waiting", "pending", "scheduled", "running", "dead")
_QUEUE = itemgetter("queue")


class PerQueue:
    """A counter family labelled by queue, with each queue's child kept at hand: ``labels()`` takes a
    lock and validates its arguments on every call, a dict lookup does not."""

    def __init__(self, family: Counter) -> None:
        self.family = family
        self._children: dict[str, Any] = {}

    def inc(self, queue: str, n: int = 1) -> None:
        if n:
            child = self._children.get(queue)
            if child is None:
                child = self._children[queue] = self.family.labels(queue)
            child.inc(n)

    def count(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """One increment per queue among `rows` (each with a "queue")."""
        self.count_queues(list(map(_QUEUE, rows)))

    def count_queues(self, queues: Sequence[str]) -> None:
        """One increment per name in `queues`; longer lists are tallied in C."""
        if len(queues) == 1:
            self.inc(queues[0])
        elif queues:
            for queue, n in Tally(queues).items():
                self.inc(queue, n)

    def totals(self) -> dict[str, float]:
        """Each queue's count so far."""
        out = {}
        for metric in self.family.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    out[sample.labels["queue"]] = sample.value
        return out


# A holder of the vacuum horizon whose transaction has been open this long is a warning on the dashboard
# (the README's alert rules start there too).
HORIZON_WARN_SECONDS = 60.0
HORIZON_HOLDERS = ("session", "replication_slot", "prepared_transaction")


@dataclass(frozen=True, slots=True)
class DatabaseHealth:
    """What holds back vacuum, and the jobs table's state (app/service/upkeep.py: ``database_health``;
    the statements VACUUM_HORIZON and TABLE_HEALTH say what each number is)."""

    # The oldest holder of each kind: holder, pid, name, state, seconds, xid_age, query.
    horizon: list[dict[str, Any]] = field(default_factory=list)
    # live_tuples, dead_tuples, bytes, claim_index_bytes, since_vacuum_seconds; None before the first read.
    table: dict[str, Any] | None = None

    @property
    def oldest(self) -> dict[str, Any] | None:
        """The holder that holds the horizon furthest back (oldest xmin, then longest open); None."""
        if not self.horizon:
            return None
        return max(self.horizon, key=lambda h: (h["xid_age"] or 0, h["seconds"] or 0.0))


def holding_back(holder: Mapping[str, Any]) -> bool:
    """Whether a horizon holder is worth a warning: open HORIZON_WARN_SECONDS or more (a replication
    slot, which has no time, when its xmin is 1,000,000 transactions old)."""
    seconds = holder["seconds"]
    if seconds is None:
        return (holder["xid_age"] or 0) >= 1_000_000
    return seconds >= HORIZON_WARN_SECONDS


@dataclass(frozen=True, slots=True)
class QueueGauges:
    """The database-side numbers at one moment (app/service/upkeep.py: ``queue_gauges``, ``lock_waits``)."""

    queues: list[dict[str, Any]] = field(default_factory=list)  # queue, paused, each state, lag_seconds
    lock_waiting: int = 0
    lock_wait_longest_seconds: float = 0.0
    at: float = 0.0  # time.time() of the refresh; 0 before the first
    # Per queue under flow control: ready jobs held back by each kind of limit (app/service/flow.py).
    held: list[dict[str, Any]] = field(default_factory=list)
    health: DatabaseHealth = field(default_factory=DatabaseHealth)


class _Gauges:
    """A collector that reports the latest snapshot: nothing is queried at scrape time."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        snap = self._metrics.gauges
        jobs = GaugeMetricFamily(
            "jobq_queue_jobs",
            "Jobs per queue and state: waiting (for their parents), pending (ready now), scheduled (waiting"
            " for run_at), running, dead.",
            labels=["queue", "state"],
        )
        lag = GaugeMetricFamily(
            "jobq_queue_lag_seconds",
            "Age of the queue's oldest ready job, measured from its run_at (0 when none waits).",
            labels=["queue"],
        )
        paused = GaugeMetricFamily("jobq_queue_paused", "1 when the queue is paused.", labels=["queue"])
        for row in snap.queues:
            for state in JOB_STATES:
                jobs.add_metric([row["queue"], state], row[state])
            lag.add_metric([row["queue"]], row["lag_seconds"])
            paused.add_metric([row["queue"]], 1.0 if row["paused"] else 0.0)
        held = GaugeMetricFamily(
            "jobq_queue_held_jobs",
            "Ready jobs of a queue under flow control held back by a limit: concurrency (their key runs as"
            " many as it may), key_rate or rate (a full window); counted up to 100,000.",
            labels=["queue", "limit"],
        )
        for row in snap.held:
            for limit in ("concurrency", "key_rate", "rate"):
                held.add_metric([row["queue"], limit], row[limit])
        yield jobs
        yield lag
        yield paused
        yield held
        yield GaugeMetricFamily(
            "jobq_lock_waiting_sessions",
            "Sessions in jobq's database waiting for a lock (pg_stat_activity wait_event_type = Lock).",
            value=snap.lock_waiting,
        )
        yield GaugeMetricFamily(
            "jobq_lock_wait_longest_seconds",
            "How long the oldest statement now waiting for a lock has been running (0 when none waits).",
            value=snap.lock_wait_longest_seconds,
        )
        yield from _health_gauges(snap.health)
        listening = self._metrics.listening
        yield GaugeMetricFamily(
            "jobq_listener_up",
            "1 while this process listens for wake-ups (LISTEN, on JOBQ_LISTEN_URL or JOBQ_DATABASE_URL); 0:"
            " long-polls find new jobs by the safety poll only, within JOBQ_WAKEUP_SAFETY_INTERVAL.",
            value=1.0 if listening is not None and listening() else 0.0,
        )
        yield GaugeMetricFamily(
            "jobq_gauges_refreshed_timestamp_seconds",
            "Unix time of the last refresh of the database gauges (0 before the first): alert when stale.",
            value=snap.at,
        )


def _health_gauges(health: DatabaseHealth) -> Iterator[Metric]:
    seconds = GaugeMetricFamily(
        "jobq_xmin_horizon_age_seconds",
        "How long the oldest transaction of each kind that holds back vacuum of jobq's tables has been open"
        " (session: a snapshot or transaction of a session of jobq's database; prepared_transaction); 0"
        " when none.",
        labels=["holder"],
    )
    xids = GaugeMetricFamily(
        "jobq_xmin_horizon_age_transactions",
        "Age in transaction ids of the oldest xmin of each kind that holds back vacuum of jobq's tables"
        " (session, replication_slot, prepared_transaction); 0 when none.",
        labels=["holder"],
    )
    oldest = {h["holder"]: h for h in health.horizon}
    for kind in HORIZON_HOLDERS:
        holder = oldest.get(kind)
        if kind != "replication_slot":
            seconds.add_metric([kind], (holder and holder["seconds"]) or 0.0)
        xids.add_metric([kind], (holder and holder["xid_age"]) or 0)
    yield seconds
    yield xids
    table = health.table
    if table is None:
        return
    for name, key, what in (
        ("jobq_jobs_table_live_tuples", "live_tuples", "Live rows of the jobs table (statistics estimate)."),
        ("jobq_jobs_table_dead_tuples", "dead_tuples", "Dead rows of the jobs table not yet vacuumed."),
        ("jobq_jobs_table_bytes", "bytes", "Size of the jobs table's heap, bytes."),
        ("jobq_claim_index_bytes", "claim_index_bytes", "Size of the claim index (ix_jobs_claim), bytes."),
    ):
        yield GaugeMetricFamily(name, what, value=table[key])
    if table["since_vacuum_seconds"] is not None:  # never vacuumed since statistics began: no sample
        yield GaugeMetricFamily(
            "jobq_jobs_table_vacuum_age_seconds",
            "Seconds since the jobs table was last vacuumed (by autovacuum or VACUUM).",
            value=table["since_vacuum_seconds"],
        )


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry

        def per_queue(name: str, what: str) -> PerQueue:
            return PerQueue(Counter(name, what, ["queue"], registry=r))

        self.enqueued = per_queue(
            "jobq_jobs_enqueued", "Jobs inserted (not counting duplicates of an active dedup_key)."
        )
        self.leased = per_queue("jobq_jobs_leased", "Jobs claimed by leases.")
        self.acked = per_queue("jobq_jobs_acked", "Jobs completed by an ack.")
        self.nacked = per_queue("jobq_jobs_nacked", "Jobs given back by a nack (retried later, or dead).")
        self.dead_lettered = per_queue(
            "jobq_jobs_dead_lettered", "Jobs that went dead: nacked with dead=true or out of attempts."
        )
        self.expired = per_queue("jobq_jobs_expired", "Leases that expired before an ack or nack.")
        # Durable steps, sleeps and events (API part 8, app/service/durable.py).
        self.steps = per_queue(
            "jobq_steps_recorded", "Steps recorded with their jobs (POST /jobs/{id}/steps)."
        )
        self.sleeps = per_queue(
            "jobq_sleeps", "Jobs released to sleep: POST /release with a delay, the attempt not counted."
        )
        self.awaits = per_queue(
            "jobq_event_waits", "Jobs that awaited an event (POST /jobs/{id}/await), parked or not."
        )
        self.events_woken = per_queue(
            "jobq_event_wakes", "Jobs made pending by an event they awaited (at once, or once it was sent)."
        )
        self.waits_expired = per_queue("jobq_event_waits_expired", "Waits for an event that ran out.")
        self.events_sent = Counter("jobq_events_sent", "Events sent (POST /events).", registry=r)
        self.claim_seconds = Histogram(
            "jobq_claim_duration_seconds",
            "Duration of the claim statement (one per lease, or per shared lease).",
            ["queue"],
            buckets=CLAIM_BUCKETS,
            registry=r,
        )
        self.request_seconds = Histogram(
            "jobq_http_request_duration_seconds",
            "HTTP request latency per route template (long-polls included).",
            ["method", "route"],
            buckets=REQUEST_BUCKETS,
            registry=r,
        )
        self.requests = Counter(
            "jobq_http_requests",
            "HTTP requests per route template and status.",
            ["method", "route", "status"],
            registry=r,
        )
        self.schedule_fires = Counter(
            "jobq_schedule_fires",
            "Jobs enqueued by schedules: one per slot fired on time or caught up, and per trigger.",
            ["schedule"],
            registry=r,
        )
        self.schedule_misses = Counter(
            "jobq_schedule_misses",
            "Schedule slots passed over: later than JOBQ_SCHEDULE_GRACE and not caught up (catch_up).",
            ["schedule"],
            registry=r,
        )
        self.workflows_started = Counter(
            "jobq_workflows_started", "Workflows made by POST /workflows.", registry=r
        )
        self.workflows_finished = Counter(
            "jobq_workflows_finished",
            "Workflows seen finished, by status: completed, failed or cancelled (counted once, by the"
            " replica that saw it first).",
            ["status"],
            registry=r,
        )
        self.push_deliveries = Counter(
            "jobq_push_deliveries",
            "Push deliveries by outcome: completed (2xx), failed (another status, a redirect, a timeout, a"
            " connection or TLS error), retry_later (429 or 503 with Retry-After), released (given back"
            " unanswered as the replica stopped).",
            ["queue", "outcome"],
            registry=r,
        )
        self.push_seconds = Histogram(
            "jobq_push_delivery_duration_seconds",
            "Push deliveries, from the request sent to the answer read (or the failure).",
            ["queue"],
            buckets=REQUEST_BUCKETS,
            registry=r,
        )
        self.push_in_flight = Gauge(
            "jobq_push_in_flight", "Push deliveries this replica has in flight now.", ["queue"], registry=r
        )
        self._claim_children: dict[str, Any] = {}
        self._queues: frozenset[str] = frozenset()  # the queues the last snapshot listed
        self._request_children: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        self.gauges = QueueGauges()
        self.listening: Callable[[], bool] | None = None  # whether the wake-up listener is connected
        r.register(_Gauges(self))
        self._history: deque[tuple[float, dict[str, float], dict[str, float]]] = deque()

    # --- hot path -----------------------------------------------------------------------------------

    def claimed(self, queue: str, seconds: float, jobs: int) -> None:
        """One claim statement ran on `queue` for `seconds` and leased `jobs` jobs. Not observed for a
        queue not known to exist (a name no queue has, or one newer than the last snapshot)."""
        child = self._claim_children.get(queue)
        if child is None:
            if not jobs and queue not in self._queues:
                return
            child = self._claim_children[queue] = self.claim_seconds.labels(queue)
        child.observe(seconds)
        self.leased.inc(queue, jobs)

    def pushed(self, queue: str, outcome: str, seconds: float) -> None:
        """One push delivery ended so, after `seconds`."""
        self.push_deliveries.labels(queue, outcome).inc()
        self.push_seconds.labels(queue).observe(seconds)

    def schedule_fired(self, schedule: str, jobs: int, missed: int = 0) -> None:
        if jobs:
            self.schedule_fires.labels(schedule).inc(jobs)
        if missed:
            self.schedule_misses.labels(schedule).inc(missed)

    def request(self, method: str, route: str, status: int, seconds: float) -> None:
        key = (method, route, status)
        children = self._request_children.get(key)
        if children is None:
            children = self._request_children[key] = (
                self.request_seconds.labels(method, route),
                self.requests.labels(method, route, str(status)),
            )
        children[0].observe(seconds)
        children[1].inc()

    # --- refreshed in the background ----------------------------------------------------------------

    def refreshed(self, gauges: QueueGauges) -> None:
        """A new database snapshot; also samples the counters for `throughput`."""
        self.gauges = gauges
        self._queues = frozenset(map(_QUEUE, gauges.queues))
        now = time.monotonic()
        self._history.append((now, self.enqueued.totals(), self.acked.totals()))
        # Keep one sample at or beyond the window's start, so the rate always spans the whole window.
        while len(self._history) > 2 and self._history[1][0] <= now - THROUGHPUT_WINDOW:
            self._history.popleft()

    def throughput(self) -> dict[str, dict[str, float]]:
        """Jobs per second per queue over about the last minute, as this process counted them:
        {queue: {"enqueued": rate, "acked": rate}}. Empty until two refreshes have run."""
        if len(self._history) < 2:
            return {}
        (t0, enq0, ack0), (t1, enq1, ack1) = self._history[0], self._history[-1]
        span = t1 - t0
        out: dict[str, dict[str, float]] = {}
        for queue in enq1.keys() | ack1.keys():
            out[queue] = {
                "enqueued": (enq1.get(queue, 0.0) - enq0.get(queue, 0.0)) / span,
                "acked": (ack1.get(queue, 0.0) - ack0.get(queue, 0.0)) / span,
            }
        return out

    def exposition(self) -> bytes:
        """The Prometheus text format of everything above."""
        return generate_latest(self.registry)
