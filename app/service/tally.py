"""What this replica's counters held at its last rollup (app/service/rollups.py), so that each write adds
only what was counted since. Held by the process's Runtime (app/service/runtime.py)."""

from __future__ import annotations

SERIES = ("enqueued", "completed", "failed", "dead")


class Tally:
    """What this replica's counters held when it last wrote, per series and queue."""

    def __init__(self) -> None:
        self._written: dict[str, dict[str, float]] = {series: {} for series in SERIES}

    def since(self, totals: dict[str, dict[str, float]]) -> dict[str, dict[str, int]]:
        """Per queue, each series' count since the last write (`totals`: each series' counters now)."""
        out: dict[str, dict[str, int]] = {}
        for series in SERIES:
            before = self._written[series]
            for queue, total in totals[series].items():
                n = int(total - before.get(queue, 0))
                if n:
                    out.setdefault(queue, dict.fromkeys(SERIES, 0))[series] = n
        return out

    def written(self, totals: dict[str, dict[str, float]]) -> None:
        """`totals` are in the database now; what a write that failed did not write is written next."""
        self._written = {series: dict(totals[series]) for series in SERIES}
