"""The runtime: what one service process keeps beside its pool, built once at start-up (app/main.py's
lifespan) and handed to the operations that need more than the pool.

jobq's state is in PostgreSQL. What a process keeps in memory only makes it faster, or lets it answer at
once; each piece is its own, bounded, and lost with the process at no cost but a little work again:

- `metrics` (app/telemetry/metrics.py): the counters and gauges it exports, and the rollups count;
- `rollups` (app/service/tally.py): what those counters held at its last rollup;
- `flow` (app/service/flow_queues.py): which queues are under flow control, and its claims' walks of keys;
- `sightings` (app/service/sightings.py): the workers seen leasing, not yet written;
- `wakeups` (app/service/wakeups.py): its LISTEN connection, and the long-polls waiting on it;
- the Batchers through which concurrent calls share a statement (app/service/coalesce.py).

An operation that needs the pool alone takes the ``Database`` (app/db/pool.py). One that counts, shares
a statement, waits or reads a cache takes the ``Runtime``, and finds the pool at `runtime.db`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from app.db.pool import Database
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
        "_batchers",
        "_shared",
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
        # A change of a queue's flow settings, heard from any replica, drops what this one knew of it.
        self.wakeups.on_settings = self.flow.forget
        self.metrics.listening = self.wakeups.listening.is_set
        self._batchers: dict[object, Any] = {}  # fixed keys (ack, nack, enqueue): a handful, kept
        self._shared: dict[object, list[Any]] = {}  # keys naming a queue: [batcher, callers in it]

    def batcher(self, key: object, make: Callable[[], Any]) -> Any:
        """The process's Batcher for `key` (app/service/coalesce.py), made on first use and kept: for the few
        fixed keys only. Keys that carry a name a client sends go through ``sharing``."""
        batcher = self._batchers.get(key)
        if batcher is None:
            batcher = self._batchers[key] = make()
        return batcher

    @contextmanager
    def sharing(self, key: object, make: Callable[[], Any]) -> Iterator[Any]:
        """The Batcher for `key` while the block runs: made for the first caller, dropped when the last
        one leaves. Concurrent callers share it, which is all a Batcher is for; an idle one is worth
        nothing, and keeping one per key (a queue name, which any client may invent) would grow without
        bound. A statement still running for callers that went away finishes on its own (the Batcher
        holds its task, and hands back what it claimed)."""
        entry = self._shared.get(key)
        if entry is None:
            entry = self._shared[key] = [make(), 0]
        entry[1] += 1
        try:
            yield entry[0]
        finally:
            entry[1] -= 1
            if not entry[1]:
                del self._shared[key]

    def batcher_count(self) -> int:
        """How many Batchers the process keeps now."""
        return len(self._batchers) + len(self._shared)
