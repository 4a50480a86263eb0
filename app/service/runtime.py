"""The runtime: what one service process keeps beside its pool, built once at start-up (app/main.py's
lifespan) and handed to the operations that need more than the pool.

jobq's state is in PostgreSQL. What a process keeps in memory makes it faster, or lets it answer at once;
each piece is bounded, and a process that is killed loses with it at most what it counted and saw in its
last metrics interval:

- `metrics` (app/telemetry/metrics.py): the counters and gauges it exports, which the rollups add up;
- `rollups` (app/service/tally.py): what those counters held at its last rollup;
- `flow` (app/service/flow_queues.py): which queues are under flow control, and its claims' walks of keys;
- `sightings` (app/service/sightings.py): the workers seen leasing, not yet written;
- `wakeups` (app/service/wakeups.py): its LISTEN connection, and the long-polls waiting on it;
- `coalescing` (app/service/coalesce.py): the Batchers through which concurrent calls share a statement,
  and the one way in to them.

An operation that needs the pool alone takes the ``Database`` (app/db/pool.py). One that counts, shares
a statement, waits or reads a cache takes the ``Runtime``, and finds the pool at `runtime.db`.
"""

from __future__ import annotations

from collections.abc import Callable

from app.db.pool import Database
from app.service.coalesce import Coalescing
from app.service.flow_queues import FlowQueues
from app.service.sightings import Sightings
from app.service.tally import Tally
from app.service.wakeups import Wakeups
from app.telemetry.metrics import Metrics


class Runtime:
    """One service process's state beside its pool (see the module's docstring). Its wake-ups are made
    here, not started: the lifespan starts them (a lease that does not wait only asks whether the service
    is closing)."""

    __slots__ = (
        "db",
        "settings",
        "metrics",
        "rollups",
        "flow",
        "sightings",
        "wakeups",
        "coalescing",
        "settings_listeners",
    )

    def __init__(self, db: Database, metrics: Metrics | None = None) -> None:
        settings = db.settings
        self.db = db
        self.settings = settings
        self.metrics = metrics if metrics is not None else Metrics()
        self.rollups = Tally()
        self.flow = FlowQueues()
        self.sightings = Sightings()
        self.wakeups = Wakeups(
            db.session_url or "",
            safety_interval=settings.wakeup_safety_interval,
            max_waiters=settings.max_waiters,
        )
        # A change of a queue's settings, heard from any replica, drops what this one knew of its flow
        # control, and tells the others who asked (the pusher, app/service/loops/pusher.py).
        self.settings_listeners: list[Callable[[str | None], None]] = []
        self.wakeups.on_settings = self._settings_changed
        self.metrics.listening = self.wakeups.listening.is_set
        self.coalescing = Coalescing(self, settings)

    def _settings_changed(self, queue: str | None) -> None:
        self.flow.forget(queue)
        for listener in self.settings_listeners:
            listener(queue)
