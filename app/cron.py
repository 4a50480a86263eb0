"""Cron expressions in a time zone: which instants a schedule's slots fall on.

Parsing and stepping are croniter's; jobq adds the time zone rule. Slots are found on the wall clock of
the schedule's zone (croniter steps through naive local times) and each is then placed on the time line:

- a wall time that does not exist (the hour skipped when clocks go forward) has no slot: it is skipped;
- a wall time that happens twice (the hour repeated when clocks go back) is one slot, the first time.

So `0 2 * * *` in Europe/Berlin fires at 02:00 on every day that has one, once; `*/15 * * * *` fires four
times in the repeated hour, not eight. Five fields have minute precision; six take a leading seconds field.

An expression that never fires is refused when it is made (CronError): one whose days do not exist (`0 0
30 2 *`, croniter finds no date), or one whose every time the zone's clocks skip (`30 2 25-31 3 0` in
Europe/Berlin: 02:30 on the last Sunday of March). Stepping such an expression would fail, or never end.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter

# How far back a repeated hour's start may lie from a time read in it: clocks go back by an hour (half an
# hour on Lord Howe Island), never by more than this.
FOLD_REACH = timedelta(hours=3)
# How long the clocks skip at most: an hour where daylight saving starts, a day where a zone crossed the
# date line (Pacific/Apia, 2011). A walk that finds only skipped wall times for longer found a schedule
# that never fires in its zone.
LONGEST_SKIP = timedelta(days=2)


class CronError(ValueError):
    """A cron expression or time zone that cannot be used; the message says why, for people."""


@dataclass(frozen=True)
class Cron:
    expression: str
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        fields = self.expression.split()
        if len(fields) not in (5, 6):
            raise CronError(
                f"a cron expression has 5 fields (minute hour day month weekday) or 6 (a leading seconds "
                f"field); {self.expression!r} has {len(fields)}"
            )
        try:
            zone = ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise CronError(
                f"unknown time zone {self.timezone!r}: use an IANA name such as Europe/Berlin"
            ) from None
        try:
            croniter(self.expression, datetime(2000, 1, 1), second_at_beginning=len(fields) == 6)
        except (CroniterError, ValueError, KeyError) as exc:
            raise CronError(f"not a valid cron expression {self.expression!r}: {exc}") from None
        object.__setattr__(self, "_zone", zone)
        object.__setattr__(self, "_seconds", len(fields) == 6)
        self.next_after(datetime.now(UTC))  # a CronError if it never fires

    def _walk(self, near: datetime, forward: bool) -> Iterator[datetime]:
        """Slots as aware UTC datetimes, in order (forward or backward) from about `near` on the wall
        clock; callers filter by instant.

        Forward, the walk starts a second before `near`'s wall time: a slot later than `near` is never
        earlier on the wall clock, since a repeated wall time is placed at its first reading. Backward, a
        `near` read in the second reading of a repeated hour has slots of the first reading before it
        that come later on the wall clock, so the walk starts past them: by as much as the clocks went
        back in the few hours before `near` (nothing, nearly always). A walk begun hours away instead
        took 10,800 steps for a schedule of every second, half a second of the event loop per firing."""
        zone: ZoneInfo = self._zone  # type: ignore[attr-defined]
        local = near.astimezone(zone)
        reading = local.replace(tzinfo=None)
        if forward:
            start = reading - timedelta(seconds=1)
        else:
            went_back = (near - FOLD_REACH).astimezone(zone).utcoffset() - local.utcoffset()  # type: ignore[operator]
            start = reading + timedelta(seconds=1) + max(went_back, timedelta(0))
        steps = croniter(self.expression, start, second_at_beginning=self._seconds)  # type: ignore[attr-defined]
        step = steps.get_next if forward else steps.get_prev
        skipped_since: datetime | None = None
        while True:
            try:
                wall: datetime = step(datetime)
            except CroniterBadDateError:
                raise CronError(
                    f"cron {self.expression!r} never fires: no date has the day of month and month it "
                    "names (such as 30 February); check those fields"
                ) from None
            placed = wall.replace(tzinfo=zone)  # fold 0: the first of two readings
            if placed.astimezone(UTC).astimezone(zone).replace(tzinfo=None) != wall:
                # A wall time the clocks skipped.
                skipped_since = skipped_since or wall
                if abs(wall - skipped_since) > LONGEST_SKIP:
                    raise CronError(
                        f"cron {self.expression!r} never fires in {self.timezone}: every time it names "
                        "is skipped when the clocks go forward"
                    )
                continue
            skipped_since = None
            yield placed.astimezone(UTC)

    def slots(self, after: datetime, until: datetime, limit: int | None = None) -> list[datetime]:
        """The slots `after` < slot <= `until`, oldest first, the first `limit` of them at most."""
        found: list[datetime] = []
        for slot in self._walk(after, forward=True):
            if slot > until or len(found) == limit:
                return found
            if slot > after:
                found.append(slot)
        raise AssertionError("unreachable")  # pragma: no cover

    def latest(self, until: datetime, after: datetime, limit: int) -> list[datetime]:
        """The latest `limit` slots `after` < slot <= `until`, oldest first."""
        found: list[datetime] = []
        for slot in self._walk(until, forward=False):
            if slot <= after or len(found) == limit:
                return found[::-1]
            if slot <= until:
                found.append(slot)
        raise AssertionError("unreachable")  # pragma: no cover

    def next_after(self, after: datetime) -> datetime:
        """The first slot after `after`."""
        return next(slot for slot in self._walk(after, forward=True) if slot > after)
