"""What a replica knows of flow control (app/service/flow.py) between claims: each queue's flow settings,
read from its row on first use and dropped whenever they change (a notification every replica gets,
app/service/wakeups.py) or the listener reconnects; and where the replica's claims of a queue walk its keys
from, and which of them are under way. Held by the process's Runtime (app/service/runtime.py)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class QueueFlow:
    flow: bool  # under flow control: LEASE_FLOW claims it
    key_concurrency: int | None
    fair: bool
    rated: bool  # a rate of the queue, of its keys, or of some key: LEASE_FLOW_RATED claims it


NO_FLOW = QueueFlow(False, None, False, False)


class FlowQueues:
    """Per replica: each queue's flow settings (cached), where its next claim starts its walk of keys
    (a `fair` queue's turn is kept in its row instead), when a claim last looked for jobs without a key,
    and for a queue with a rate a lock that makes the replica's claims of it take turns (of one without,
    their walks of keys). Bounded: past MAX_ENTRIES queues, it starts again empty (queue names come from
    clients)."""

    MAX_ENTRIES = 10_000

    def __init__(self) -> None:
        self._settings: dict[str, QueueFlow] = {}
        self.cursors: dict[str, str] = {}  # queue (not `fair`) -> the last key walked
        self.unkeyed_looked: dict[str, float] = {}  # queue -> monotonic time; absent: found some
        self.turns: dict[str, asyncio.Lock] = {}
        self.claiming: dict[str, set[asyncio.Event]] = {}  # queue -> its claims under way, set when done
        self.front_held: dict[str, float] = {}  # queue -> monotonic time until which claims only walk

    def get(self, queue: str) -> QueueFlow | None:
        return self._settings.get(queue)

    def put(self, queue: str, flow: QueueFlow) -> None:
        if len(self._settings) >= self.MAX_ENTRIES:
            self._settings.clear()
            self.cursors.clear()
            self.unkeyed_looked.clear()
            self.front_held.clear()
            self.turns = {name: lock for name, lock in self.turns.items() if lock.locked()}
            # claiming is not cleared: each claim removes itself.
        self._settings[queue] = flow

    def join(self, queue: str, claim: asyncio.Event) -> list[asyncio.Event]:
        """Count `claim` among the queue's claims under way (set when it is done, see leave); the claims
        under way before it."""
        claiming = self.claiming.setdefault(queue, set())
        others = list(claiming)
        claiming.add(claim)
        return others

    def leave(self, queue: str, claim: asyncio.Event) -> list[asyncio.Event]:
        """Count `claim` done; the queue's claims still under way."""
        claim.set()
        claiming = self.claiming.get(queue, set())
        claiming.discard(claim)
        if not claiming:
            self.claiming.pop(queue, None)
        return list(claiming)

    def front_open(self, queue: str) -> bool:
        """Whether a claim of the queue looks at its front first (see app/service/flow.py _claim_front)."""
        held_until = self.front_held.get(queue)
        if held_until is None:
            return True
        if time.monotonic() < held_until:
            return False
        del self.front_held[queue]
        return True

    def forget(self, queue: str | None = None) -> None:
        """Drop what is known of `queue` (None: every queue), to be read again on its next claim."""
        if queue is None:
            self._settings.clear()
        else:
            self._settings.pop(queue, None)
