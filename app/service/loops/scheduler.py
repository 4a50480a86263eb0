"""The scheduler: the loop that fires due schedules, on one replica at a time.

Every replica runs it; only the holder of the `scheduler` lead (a row of jobq.leaders, held for
JOBQ_SCHEDULER_LEASE seconds on the database's clock) fires. The holder renews the lead well before it
expires and gives it up when it stops; a holder that dies keeps it until it expires, and then the first
replica to look takes it, within a lease and a second. A holder counts its lease from before it asked
for it, on its own clock, so that it stops believing it leads no later than the database lets another
replica take over, even when it was held up (a stalled process) past its renewal. Firing is safe even if
two replicas ever fired at once: a due schedule fires only if it is still at the slot it was read at,
locked while it moves on, and a slot's job is unique.

The leader sleeps until the next slot is due, a second at most (so a schedule changed meanwhile is seen
within a second); the others look for the lead every second.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid

from app.core.errors import DATABASE_UNAVAILABLE
from app.service import schedules
from app.service.runtime import Runtime

log = logging.getLogger("jobq.scheduler")

LEAD = "scheduler"
LOOK_EVERY = 1.0  # seconds between looks, at most
MIN_PAUSE = 0.005  # and at least


class Scheduler:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._lead_until = 0.0  # monotonic time the lead ends unless renewed
        self._renew_at = 0.0  # monotonic time the lead wants renewing

    @property
    def leading(self) -> bool:
        return time.monotonic() < self._lead_until

    async def run(self) -> None:
        settings = self.runtime.settings
        while True:
            pause = LOOK_EVERY  # after a failure, look again a second later, not at once
            try:
                await self._step(settings.scheduler_lease, settings.schedule_grace)
                pause = await self._pause()
            except asyncio.CancelledError:
                raise
            except DATABASE_UNAVAILABLE as exc:
                log.warning("scheduler: database unavailable (%r)", exc)
                self._lead_until = 0.0
            except Exception:
                log.exception("scheduler failed")
            await asyncio.sleep(pause)

    async def _step(self, lease: float, grace: float) -> None:
        if time.monotonic() >= self._renew_at:
            was, asked = self.leading, time.monotonic()
            took = await schedules.take_lead(self.runtime.db, LEAD, self.holder, lease)
            # The database's lease runs from a moment after `asked`: this one ends no later.
            self._lead_until = asked + lease if took else 0.0
            self._renew_at = time.monotonic() + (lease / 3 if took else 0)
            if self.leading != was:
                log.info("this replica %s the scheduler", "now leads" if self.leading else "no longer leads")
        if self.leading:
            await schedules.fire_due(self.runtime, grace)

    async def _pause(self) -> float:
        """Seconds until the next look: the next due slot, or LOOK_EVERY at most."""
        if not self.leading:
            return LOOK_EVERY
        soonest = await schedules.next_due_in(self.runtime.db)
        # Not less than a few milliseconds: a due schedule another transaction holds is passed over
        # (SKIP LOCKED) and still due, and the loop must not spin on it.
        return LOOK_EVERY if soonest is None else min(LOOK_EVERY, max(MIN_PAUSE, soonest))

    async def stop(self) -> None:
        """Give the lead up, so another replica fires from now on rather than once it expires."""
        if self.leading:
            try:
                await schedules.give_up_lead(self.runtime.db, LEAD, self.holder)
            except DATABASE_UNAVAILABLE:
                pass
            self._lead_until = 0.0
