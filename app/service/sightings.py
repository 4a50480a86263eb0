"""Workers seen leasing since the last write, in this process's memory: every `POST /lease` that names its
worker is noted here (``Sightings.saw``: a dict update, no I/O) and written every few seconds by
app/service/workers_seen.py. Held by the process's Runtime (app/service/runtime.py)."""

from __future__ import annotations

import time

SEEN_AT_MOST = 10_000  # distinct (worker, queue) noted per interval; more are dropped until the next write


class Sightings:
    """(worker_id, queue) -> [last seen (Unix time), jobs leased], since the last ``take``."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], list[float]] = {}

    def saw(self, worker_id: str | None, queue: str, leased: int) -> None:
        if worker_id is None:
            return
        entry = self._seen.get((worker_id, queue))
        if entry is None:
            if len(self._seen) >= SEEN_AT_MOST:
                return
            entry = self._seen[(worker_id, queue)] = [0.0, 0]
        entry[0] = time.time()
        entry[1] += leased

    def take(self) -> dict[tuple[str, str], list[float]]:
        seen, self._seen = self._seen, {}
        return seen
