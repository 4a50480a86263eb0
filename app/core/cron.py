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

import enum
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter

# How far back a repeated hour's start may lie from a time read in it: clocks go back by an hour (half an
# hour on Lord Howe Island), never by more than this.
FOLD_REACH = timedelta(hours=3)
# How long the clocks skip at most: an hour where daylight saving starts, a day where a zone crossed the
# date line (Pacific/Apia, 2011). A walk that finds only skipped wall times for longer found a schedule
# that never fires in its zone.
LONGEST_SKIP = timedelta(days=2)
# How far back `count` looks: a schedule away for longer has only this much of its absence counted.
COUNT_REACH = timedelta(days=3660)
DAY, WEEK = timedelta(days=1), timedelta(days=7)


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

    def _fields(self) -> None:
        """Split the expression, once, into what counting needs: the times of day it names (hours,
        minutes, seconds, each ascending: croniter's expansion, `*` spelled out), and its days, as a
        rule: every day (None), a test of a date (day of month, month, weekday: day or weekday when both
        are given, as croniter reads them), or, for `L`, `W` and `#`, croniter itself stepping through
        `0 0 <day> <month> <weekday>`, a slot at midnight of each matching day."""
        fields = self.expression.split()
        parsed = croniter(self.expression, datetime(2000, 1, 1), second_at_beginning=self._seconds)  # type: ignore[attr-defined]
        minute, hour, day, month, weekday = parsed.expanded[:5]

        def values(field: list[Any], top: int, first: int = 0) -> list[int]:
            return list(range(first, top)) if field == ["*"] else sorted(int(v) for v in field)

        seconds = values(parsed.expanded[5], 60) if self._seconds else [0]  # type: ignore[attr-defined]
        times = (values(hour, 24), values(minute, 60), seconds)
        rule: Any
        if parsed.nth_weekday_of_month or parsed.nearest_weekday or "l" in map(str, day + weekday):
            rule = " ".join(["0", "0", *fields[-3:]])
        elif day == month == weekday == ["*"]:
            rule = None
        else:
            days, months, weekdays = (
                set(values(day, 32, 1)),
                set(values(month, 13, 1)),
                set(values(weekday, 7)),
            )
            either = day != ["*"] and weekday != ["*"]

            def rule(when: date) -> bool:
                if when.month not in months:
                    return False
                on_day, on_weekday = when.day in days, when.isoweekday() % 7 in weekdays
                return (on_day or on_weekday) if either else (on_day and on_weekday)

        object.__setattr__(self, "_times", times)
        object.__setattr__(self, "_day_rule", rule)

    def _before_in_day(self, at: timedelta) -> int:
        """How many times of day (whole seconds) come before `at` (from midnight, 0 to a day)."""
        hours, minutes, seconds = self._times  # type: ignore[attr-defined]
        whole = at.days * 86400 + at.seconds + (1 if at.microseconds else 0)  # t < at: t < ceil(at)
        hour, rest = divmod(whole, 3600)
        minute, second = divmod(rest, 60)
        count = bisect_left(hours, hour) * len(minutes) * len(seconds)
        if hour in hours:
            count += bisect_left(minutes, minute) * len(seconds)
            if minute in minutes:
                count += bisect_left(seconds, second)
        return count

    def _walls(self, low: datetime, high: datetime) -> int:
        """How many wall times low <= t < high (naive) the expression names, the clocks' changes aside:
        each matching day's times counted by arithmetic, whole days at once."""
        if high <= low:
            return 0
        if not hasattr(self, "_times"):
            self._fields()
        rule = self._day_rule  # type: ignore[attr-defined]
        whole_day = self._before_in_day(DAY)

        def on(day: datetime) -> int:  # the times of `day` (its midnight) between low and high
            return self._before_in_day(min(high - day, DAY)) - self._before_in_day(max(low - day, DAY * 0))

        first = datetime.combine(low.date(), time())
        last = datetime.combine((high - timedelta(microseconds=1)).date(), time())
        if isinstance(rule, str):
            count, matching = 0, croniter(rule, first - timedelta(seconds=1))
            while (day := matching.get_next(datetime)) <= last:
                count += on(day)
            return count
        if first == last:
            return on(first) if rule is None or rule(first) else 0
        if rule is None:
            return on(first) + on(last) + ((last - first).days - 1) * whole_day
        count = (on(first) if rule(first) else 0) + (on(last) if rule(last) else 0)
        ordinal = first.toordinal() + 1
        middle = sum(1 for o in range(ordinal, last.toordinal()) if rule(date.fromordinal(o)))
        return count + middle * whole_day

    def _changes(self, after: datetime, until: datetime) -> Iterator[tuple[datetime, timedelta, timedelta]]:
        """The zone's changes of the clocks in (after, until]: the instant (a whole second), the offset
        before it and after. Found by looking a week apart and halving where the offset differs (two
        changes within one week would go unseen; no zone has had them)."""
        zone: ZoneInfo = self._zone  # type: ignore[attr-defined]
        start, offset = after, after.astimezone(zone).utcoffset()
        while start < until:
            end = min(start + WEEK, until)
            then = end.astimezone(zone).utcoffset()
            if then != offset:
                low, high = int(start.timestamp()), int(end.timestamp()) + 1  # offset(low) is `offset`
                while high - low > 1:
                    middle = (low + high) // 2
                    if datetime.fromtimestamp(middle, UTC).astimezone(zone).utcoffset() == offset:
                        low = middle
                    else:
                        high = middle
                yield datetime.fromtimestamp(high, UTC), offset, then  # type: ignore[misc]
            start, offset = end, then

    def _wall_bound(self, at: datetime) -> datetime:
        """The wall time w such that a slot comes at or before `at` exactly when its wall time is before
        w. A slot is placed at the first reading of its wall time: read in the second reading of a
        repeated hour, `at` comes after every slot of that hour."""
        zone: ZoneInfo = self._zone  # type: ignore[attr-defined]
        local = at.astimezone(zone)
        if local.fold == 0:
            return local.replace(tzinfo=None) + timedelta(microseconds=1)
        went_back = local.replace(fold=0).utcoffset() - local.utcoffset()  # type: ignore[operator]
        change = next(instant for instant, _, _ in self._changes(at - went_back - timedelta(seconds=1), at))
        return (change + local.replace(fold=0).utcoffset()).replace(tzinfo=None)  # type: ignore[operator]

    def count(self, after: datetime, until: datetime) -> int:
        """How many slots `after` < slot <= `until`: counted a day at a time, not walked one by one
        (a schedule of every second away for a day has 86,400), and exactly, the changes of the clocks
        included. At most COUNT_REACH back from `until`."""
        after = max(after, until - COUNT_REACH)
        if until <= after:
            return 0
        low, high = self._wall_bound(after), self._wall_bound(until)
        count = self._walls(low, high)
        for instant, before, then in self._changes(after, until):
            if then > before:  # clocks forward: wall times [instant + before, instant + then) do not exist
                skipped = (instant + before).replace(tzinfo=None), (instant + then).replace(tzinfo=None)
                count -= self._walls(max(skipped[0], low), min(skipped[1], high))
        return count

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


class CatchUp(enum.StrEnum):
    """What a schedule fires for the slots it missed (the service down, the schedule's replica gone): a
    slot is missed when the scheduler reaches it more than JOBQ_SCHEDULE_GRACE seconds late."""

    SKIP = "skip"  # nothing: the next slot on time is the next job
    ONCE = "once"  # one job, for the latest missed slot
    ALL = "all"  # a job for every missed slot, the latest 1,000 at most
