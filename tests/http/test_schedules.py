"""Schedules: the API, the cron rules (time zones, daylight saving), firing each slot exactly once across
replicas, the lead moving when its holder dies, catch-up after downtime, and the schedules file."""

import asyncio
import subprocess
import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import httpx
import pytest
from croniter import croniter

from app.core.cron import Cron, CronError
from app.service import schedules
from app.service.loops.scheduler import Scheduler
from tests.helpers import assert_problem, open_runtime
from tests.service_process import JOBQ, jobq_env
from tests.waiting import until

pytestmark = pytest.mark.anyio

DAILY = {"cron": "0 3 * * *", "timezone": "Europe/Berlin", "queue": "reports", "payload": {"kind": "daily"}}


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# --- cron in a time zone ---------------------------------------------------------------------------


def test_a_slot_the_clocks_skip_is_skipped_and_a_repeated_one_fires_once():
    berlin = Cron("30 2 * * *", "Europe/Berlin")
    # 2026-03-29: clocks go from 02:00 to 03:00, so 02:30 does not exist that day.
    spring = berlin.slots(datetime(2026, 3, 27, tzinfo=UTC), datetime(2026, 3, 31, tzinfo=UTC))
    assert [s.isoformat() for s in spring] == [
        "2026-03-27T01:30:00+00:00", "2026-03-28T01:30:00+00:00", "2026-03-30T00:30:00+00:00",
    ]  # fmt: skip
    # 2026-10-25: clocks go from 03:00 back to 02:00, so 02:30 happens twice: one slot, the first.
    autumn = berlin.slots(datetime(2026, 10, 24, tzinfo=UTC), datetime(2026, 10, 27, tzinfo=UTC))
    assert [s.isoformat() for s in autumn] == [
        "2026-10-24T00:30:00+00:00", "2026-10-25T00:30:00+00:00", "2026-10-26T01:30:00+00:00",
    ]  # fmt: skip
    quarter = Cron("*/15 * * * *", "Europe/Berlin")
    repeated_hour = quarter.slots(
        datetime(2026, 10, 24, 23, 59, tzinfo=UTC), datetime(2026, 10, 25, 2, tzinfo=UTC)
    )
    # 02:00-02:45 once (the first reading, CEST), nothing in the second reading (01:00-02:00 UTC).
    assert [s.strftime("%H:%M") for s in repeated_hour] == ["00:00", "00:15", "00:30", "00:45", "02:00"]
    assert quarter.latest(repeated_hour[-1], repeated_hour[0], 3) == repeated_hour[-3:]


def _slots_by_the_hour(cron: Cron, after: datetime, until: datetime) -> list[datetime]:
    """The slots after < slot <= until found the slow, plain way: every wall time from hours before
    `after` to hours after `until`, each placed at its first reading, kept if it exists."""
    zone = ZoneInfo(cron.timezone)
    steps = croniter(cron.expression, (after - timedelta(hours=4)).astimezone(zone).replace(tzinfo=None))
    found = []
    while True:
        wall = steps.get_next(datetime)
        placed = wall.replace(tzinfo=zone)
        if placed.astimezone(UTC).astimezone(zone).replace(tzinfo=None) != wall:
            continue
        if placed.astimezone(UTC) > until + timedelta(hours=4):
            return sorted({s for s in found if after < s <= until})
        found.append(placed.astimezone(UTC))


@pytest.mark.parametrize(
    "timezone, change",
    [
        ("Europe/Berlin", datetime(2026, 10, 25, 1, tzinfo=UTC)),  # back an hour
        ("Europe/Berlin", datetime(2026, 3, 29, 1, tzinfo=UTC)),  # forward an hour
        ("America/New_York", datetime(2026, 11, 1, 6, tzinfo=UTC)),
        ("Australia/Lord_Howe", datetime(2026, 4, 4, 15, tzinfo=UTC)),  # back half an hour
        ("UTC", datetime(2026, 11, 27, tzinfo=UTC)),
    ],
)
def test_slots_near_a_change_of_the_clocks_are_those_of_every_wall_time(timezone, change):
    """The walk starts next to the time asked about, not hours away; around a change of the clocks it
    finds what a walk through every wall time of the hours around finds, forward and backward."""
    for cron in (Cron("*/10 * * * *", timezone), Cron("15,45 1-3 * * *", timezone)):
        for minutes in range(-150, 151, 5):
            after = change + timedelta(minutes=minutes, seconds=7)
            until = after + timedelta(minutes=95)
            expected = _slots_by_the_hour(cron, after, until)
            assert cron.slots(after, until) == expected, (cron, after)
            assert cron.latest(until, after, 3) == expected[-3:], (cron, until)
            assert cron.next_after(after) == _slots_by_the_hour(cron, after, after + timedelta(days=1))[0]
    # A schedule of every second, away from the change: found a step or two from the time asked about.
    every_second = Cron("* * * * * *", timezone)
    near = change - timedelta(hours=4, microseconds=500_000)
    assert next(every_second._walk(near, forward=True)) >= near - timedelta(seconds=1)
    assert next(every_second._walk(near, forward=False)) <= near + timedelta(seconds=1)
    assert every_second.next_after(near) == near.replace(microsecond=0) + timedelta(seconds=1)
    assert every_second.latest(near, near - timedelta(seconds=3), 5) == [
        near.replace(microsecond=0) - timedelta(seconds=i) for i in (2, 1, 0)
    ]


def test_six_fields_have_seconds_and_bad_expressions_say_why():
    every = Cron("*/10 * * * * *")
    start = datetime(2026, 1, 1, tzinfo=UTC)
    assert [s.second for s in every.slots(start, start + timedelta(seconds=30))] == [10, 20, 30]
    for cron, timezone, words in [
        ("* * * *", "UTC", "5 fields"),
        ("61 * * * *", "UTC", "not a valid cron"),
        ("* * * * *", "Mars/Olympus", "unknown time zone"),
        ("* * * * * * *", "UTC", "has 7"),
        ("0 0 30 2 *", "UTC", "never fires"),
        ("0 0 31 4 *", "Europe/Berlin", "never fires"),
        ("0 0 31 2,4,6 *", "UTC", "never fires"),
        # The last Sunday of March at 02:30: in the hour Berlin's clocks skip that very day, every year.
        ("30 2 * 3 L0", "Europe/Berlin", "never fires"),
    ]:
        with pytest.raises(CronError, match=words):
            Cron(cron, timezone)
    # Rare is not never: 29 February fires in leap years, and 30 February on Mondays (day or weekday).
    leap_day = Cron("0 0 29 2 *").next_after(datetime(2097, 3, 1, tzinfo=UTC))
    assert leap_day == datetime(2104, 2, 29, tzinfo=UTC)
    assert Cron("0 0 30 2 1").next_after(datetime(2026, 2, 1, tzinfo=UTC)).weekday() == 0
    assert Cron("30 2 * 3 L0", "UTC").next_after(datetime(2026, 3, 1, tzinfo=UTC)) == (
        datetime(2026, 3, 29, 2, 30, tzinfo=UTC)
    )
    assert Cron("30 2 25-31 3 *", "Europe/Berlin").next_after(datetime(2026, 3, 28, 12, tzinfo=UTC)) == (
        datetime(2026, 3, 30, 0, 30, tzinfo=UTC)
    )


# --- the API ---------------------------------------------------------------------------------------


async def test_put_get_list_pause_resume_trigger_delete(client, db):
    r = await client.put("/schedules/nightly", json=DAILY)
    assert r.status_code == 200, r.text
    made = r.json()
    assert (made["name"], made["catch_up"], made["paused"], made["last_run_at"]) == (
        "nightly",
        "once",
        False,
        None,
    )
    next_run = at(made["next_run_at"])
    assert (
        next_run > datetime.now(UTC)
        and next_run.astimezone(Cron("* * * * *", "Europe/Berlin")._zone).hour == 3
    )

    again = (await client.put("/schedules/nightly", json=DAILY | {"payload": 2})).json()
    assert again["next_run_at"] == made["next_run_at"] and again["payload"] == 2  # same cron: same next slot
    hourly = (await client.put("/schedules/nightly", json=DAILY | {"cron": "0 * * * *"})).json()
    assert at(hourly["next_run_at"]) - datetime.now(UTC) <= timedelta(hours=1)

    assert (await client.get("/schedules/nightly")).json() == hourly
    await client.put("/schedules/another", json=DAILY | {"catch_up": "all", "kind": "build", "key": "t-1"})
    assert [s["name"] for s in (await client.get("/schedules")).json()["schedules"]] == ["another", "nightly"]

    paused = (await client.post("/schedules/nightly/pause")).json()
    assert paused["paused"] is True and paused["next_run_at"] is None
    resumed = (await client.post("/schedules/nightly/resume")).json()
    assert resumed["paused"] is False and at(resumed["next_run_at"]) > datetime.now(UTC)

    triggered = (await client.post("/schedules/another/trigger")).json()
    job = (await client.get(f"/jobs/{triggered['job_id']}")).json()
    assert (job["queue"], job["kind"], job["key"], job["payload"], job["schedule"], job["schedule_slot"]) == (
        "reports", "build", "t-1", {"kind": "daily"}, "another", None,
    )  # fmt: skip
    assert triggered["last_job_id"] == job["id"] and triggered["last_run_at"] is not None

    assert (await client.delete("/schedules/another")).json() == {"name": "another", "deleted": True}
    assert_problem(await client.get("/schedules/another"), 404, "not_found")
    assert_problem(await client.delete("/schedules/another"), 404, "not_found")
    assert_problem(await client.post("/schedules/another/trigger"), 404, "not_found")
    assert (
        await db.fetchval("SELECT count(*) FROM jobq.all_jobs WHERE schedule = 'another'") == 1
    )  # jobs stay


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (DAILY | {"cron": "every day"}, "5 fields"),
        (DAILY | {"cron": "0 25 * * *"}, "not a valid cron"),
        (DAILY | {"timezone": "Berlin"}, "unknown time zone"),
        (DAILY | {"catch_up": "sometimes"}, "catch_up"),
        (DAILY | {"queue": "no spaces"}, "queue"),
        (DAILY | {"surprise": 1}, "surprise"),
        ({"cron": "* * * * *", "queue": "q"}, "payload"),
        (DAILY | {"cron": "0 0 30 2 *"}, "never fires"),
        (DAILY | {"cron": "0 0 31 4 *", "paused": True}, "never fires"),
    ],
)
async def test_bad_schedules_are_refused_saying_why(client, db, body, words):
    problem = assert_problem(await client.put("/schedules/s", json=body), 422, "validation_error")
    assert words in problem["detail"], problem
    assert await db.fetchval("SELECT count(*) FROM jobq.schedules") == 0


async def test_a_stored_schedule_that_never_fires_is_listed_and_refuses_to_resume(client, db):
    """A schedule stored paused before such crons were refused: it is shown, and resuming it says why."""
    await db.execute(
        "INSERT INTO jobq.schedules (name, cron, queue, payload, paused)"
        " VALUES ('feb30', '0 0 30 2 *', 'q', '1', true)"
    )
    assert [s["name"] for s in (await client.get("/schedules")).json()["schedules"]] == ["feb30"]
    assert (await client.get("/schedules/feb30")).json()["next_run_at"] is None
    problem = assert_problem(await client.post("/schedules/feb30/resume"), 422, "validation_error")
    assert "never fires" in problem["detail"] and "0 0 30 2 *" in problem["detail"], problem
    assert (await client.post("/schedules/feb30/pause")).json()["paused"] is True
    assert await db.fetchval("SELECT paused FROM jobq.schedules WHERE name = 'feb30'") is True
    fixed = await client.put("/schedules/feb30", json={"cron": "0 0 28 2 *", "queue": "q", "payload": 1})
    assert fixed.status_code == 200 and fixed.json()["next_run_at"] is not None


async def test_roles(start_service):
    service = start_service(
        tokens={"a": "admin", "p": "producer", "s": {"role": "admin", "queues": ["mine"]}}
    )
    async with httpx.AsyncClient(base_url=service.url) as http:
        admin, producer, scoped = ({"authorization": f"Bearer {t}"} for t in "aps")
        assert (await http.put("/schedules/x", json=DAILY, headers=admin)).status_code == 200
        assert (await http.get("/schedules/x", headers=producer)).status_code == 200
        assert (await http.put("/schedules/x", json=DAILY, headers=producer)).status_code == 403
        assert (await http.post("/schedules/x/trigger", headers=producer)).status_code == 403
        assert (await http.get("/schedules")).status_code == 401
        # A token limited to queue `mine` sees, changes and makes only schedules of that queue.
        assert (await http.get("/schedules", headers=scoped)).json() == {"schedules": [], "next_after": None}
        assert (await http.get("/schedules/x", headers=scoped)).status_code == 404
        assert (
            await http.put("/schedules/x", json=DAILY | {"queue": "mine"}, headers=scoped)
        ).status_code == 403
        assert (await http.put("/schedules/y", json=DAILY, headers=scoped)).status_code == 403
        assert (
            await http.put("/schedules/y", json=DAILY | {"queue": "mine"}, headers=scoped)
        ).status_code == 200
        assert (await http.post("/schedules/x/trigger", headers=scoped)).status_code == 404


# --- firing ----------------------------------------------------------------------------------------


async def slots_of(db, name: str) -> list[tuple[datetime, datetime]]:
    rows = await db.fetch(
        "SELECT schedule_slot, created_at FROM jobq.all_jobs WHERE schedule = $1 ORDER BY schedule_slot", name
    )
    return [(r["schedule_slot"], r["created_at"]) for r in rows]


@pytest.mark.slow
async def test_a_one_second_schedule_on_two_replicas_fires_every_slot_once_through_renewals(
    start_service, db
):
    """Eight seconds, with the lead's lease at 1 s (renewed every third of it): some twenty renewals of
    the lead by its holder, each a chance for the other replica to take it, or for a slot to be fired
    twice or skipped."""
    replicas = [start_service(scheduler_lease=1.0), start_service(scheduler_lease=1.0)]
    async with httpx.AsyncClient(base_url=replicas[0].url) as http:
        made = (
            await http.put("/schedules/tick", json={"cron": "* * * * * *", "queue": "t", "payload": None})
        ).json()
        first = at(made["next_run_at"])
        await asyncio.sleep(8)
        await http.post("/schedules/tick/pause")
    fired = await slots_of(db, "tick")
    slots = [slot for slot, _ in fired]
    assert len(slots) >= 6, len(slots)
    # Every second from the first slot on, each exactly once: no gap, no repeat.
    assert slots == [first + timedelta(seconds=i) for i in range(len(slots))]
    delays = sorted((created - slot).total_seconds() for slot, created in fired)
    assert delays[0] >= 0 and delays[int(len(delays) * 0.99) - 1] <= 1.0, delays[-5:]
    # One replica leads (a starved holder may have let the lead lapse a moment ago, and none leads until
    # the other takes it).
    await until(lambda: sorted(replica.app.state.scheduler.leading for replica in replicas) == [False, True])


async def test_the_lead_moves_when_its_holder_is_gone(start_service, db):
    """A holder that died keeps the lead until it expires; then another replica takes it and fires the
    slots since, late but within the grace, each once."""
    await db.execute(
        "INSERT INTO jobq.leaders (name, holder, expires_at)"
        " VALUES ('scheduler', 'dead-replica', now() + interval '3 s')"
    )
    service = start_service(scheduler_lease=2.0)
    async with httpx.AsyncClient(base_url=service.url) as http:
        await http.put("/schedules/tick", json={"cron": "* * * * * *", "queue": "t", "payload": None})
        await asyncio.sleep(1.5)
        assert await slots_of(db, "tick") == []  # the dead holder's lease still runs
        await until(lambda: slots_of(db, "tick"), timeout=6)
        assert service.app.state.scheduler.leading
        await asyncio.sleep(1)
        await http.post("/schedules/tick/pause")
    slots = [slot for slot, _ in await slots_of(db, "tick")]
    assert slots == [slots[0] + timedelta(seconds=i) for i in range(len(slots))]
    assert await db.fetchval("SELECT holder FROM jobq.leaders") != "dead-replica"


async def test_a_holder_held_up_past_its_lease_no_longer_believes_it_leads(database_url):
    """Its lease runs out on its own clock, counted from before it asked: by the time another replica may
    take the lead, the held-up holder has stopped believing it leads, without a renewal to tell it."""
    async with open_runtime(database_url) as runtime:
        first, second = Scheduler(runtime), Scheduler(runtime)
        await first._step(lease=0.5, grace=30)
        await second._step(lease=0.5, grace=30)
        assert (first.leading, second.leading) == (True, False)
        await asyncio.sleep(0.6)  # the first is held up: no renewal
        assert not first.leading
        await second._step(lease=0.5, grace=30)
        assert (first.leading, second.leading) == (False, True)
        await first._step(lease=0.5, grace=30)  # its renewal, late, is refused
        assert (first.leading, second.leading) == (False, True)


@pytest.mark.parametrize(("catch_up", "expected"), [("skip", 0), ("once", 1), ("all", 10)])
async def test_catch_up_after_ten_minutes_down(start_service, db, catch_up, expected):
    """The scheduler was away for ten minutes (its next slot set ten minutes back, as a stopped scheduler
    leaves it): `skip` fires none of the missed minutes, `once` one job, `all` one per missed minute. The
    schedule fires once a minute at the second half a minute away from now: its last slot half a minute
    past (well beyond the grace), its next half a minute ahead (beyond the test)."""
    service = start_service(schedule_grace=5.0)
    now = await db.fetchval("SELECT now()")
    second = (now.second + 30) % 60
    last = now.replace(second=second, microsecond=0)
    if last > now:
        last -= timedelta(minutes=1)
    down_since = last - timedelta(minutes=9)
    async with httpx.AsyncClient(base_url=service.url) as http:
        body = {
            "cron": f"{second} * * * * *",
            "queue": "m",
            "payload": 1,
            "catch_up": catch_up,
            "paused": True,
        }
        await http.put("/schedules/minutely", json=body)
        await db.execute("UPDATE jobq.schedules SET paused = false, next_run_at = $1", down_since)
        await until(lambda: db.fetchval("SELECT next_run_at > now() FROM jobq.schedules"), timeout=5)
        # The counters move once the fire has committed: a moment after the database shows it.
        counted = [f'jobq_schedule_fires_total{{schedule="minutely"}} {float(expected)}'] if expected else []
        if expected < 10:
            counted.append(f'jobq_schedule_misses_total{{schedule="minutely"}} {10.0 - expected}')

        async def metrics_counted() -> bool:
            metrics = (await http.get("/metrics")).text
            return all(line in metrics for line in counted)

        await until(metrics_counted, timeout=5)
    fired = [slot for slot, _ in await slots_of(db, "minutely")]
    missed = [down_since + timedelta(minutes=i) for i in range(10)]  # all before now - grace
    assert len(fired) == expected
    if catch_up == "once":
        assert fired == missed[-1:]
    if catch_up == "all":
        assert fired == missed


@pytest.mark.slow
async def test_a_pause_is_not_caught_up(start_service, db):
    service = start_service()
    async with httpx.AsyncClient(base_url=service.url) as http:
        await http.put(
            "/schedules/s", json={"cron": "* * * * * *", "queue": "p", "payload": 1, "catch_up": "all"}
        )
        await asyncio.sleep(1.5)
        paused_at = at((await http.post("/schedules/s/pause")).json()["updated_at"])
        await asyncio.sleep(2.5)
        resumed_from = at((await http.post("/schedules/s/resume")).json()["next_run_at"])
        await asyncio.sleep(1.5)
        await http.post("/schedules/s/pause")
    slots = [slot for slot, _ in await slots_of(db, "s")]
    assert [slot for slot in slots if paused_at < slot < resumed_from] == []
    assert [slot for slot in slots if slot <= paused_at] and [slot for slot in slots if slot >= resumed_from]


# --- the schedules file ----------------------------------------------------------------------------


async def test_schedules_declared_in_a_file_at_start(start_service, db, tmp_path):
    path = tmp_path / "schedules.toml"
    path.write_text(
        '[schedules.nightly-report]\ncron = "0 3 * * *"\ntimezone = "Europe/Berlin"\nqueue = "reports"\n'
        'payload = { kind = "daily" }\ncatch_up = "skip"\n'
    )
    first = start_service(schedules_file=path)
    async with httpx.AsyncClient(base_url=first.url) as http:
        made = (await http.get("/schedules/nightly-report")).json()
        assert (made["payload"], made["catch_up"], made["timezone"]) == (
            {"kind": "daily"},
            "skip",
            "Europe/Berlin",
        )
    second = start_service(schedules_file=path)  # every replica applies it: nothing changes
    async with httpx.AsyncClient(base_url=second.url) as http:
        assert (await http.get("/schedules/nightly-report")).json()["next_run_at"] == made["next_run_at"]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('[schedules.x]\ncron = "0 3 * *"\nqueue = "q"\npayload = 1\n', "5 fields"),
        ('[schedules.x]\ncron = "0 3 * * *"\npayload = 1\n', "queue"),
        ("[other]\nx = 1\n", "[schedules.<name>]"),
        ('[schedules."bad name"]\ncron = "0 3 * * *"\nqueue = "q"\npayload = 1\n', "schedule name"),
        ("not toml at all [", "JOBQ_SCHEDULES_FILE"),
        ('[schedules.feb30]\ncron = "0 0 30 2 *"\nqueue = "q"\npayload = 1\n', "never fires"),
    ],
)
def test_a_bad_schedules_file_stops_the_start_saying_why(tmp_path, text, words):
    from app.http.routers.schedules import declared

    path = tmp_path / "schedules.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace(".", r"\.")):
        declared(path)


def test_serve_with_a_schedule_that_never_fires_stops_in_one_line_naming_it(tmp_path, fresh_database):
    path = tmp_path / "schedules.toml"
    path.write_text(
        '[schedules.ok]\ncron = "0 3 * * *"\nqueue = "q"\npayload = 1\n'
        '[schedules.feb30]\ncron = "0 0 30 2 *"\nqueue = "q"\npayload = 1\n'
    )
    done = subprocess.run(
        [*JOBQ, "serve", "--port", "1"],
        env=jobq_env(JOBQ_DATABASE_URL=fresh_database(), JOBQ_SCHEDULES_FILE=str(path)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "feb30" in lines[0] and "never fires" in lines[0], done.stderr


# --- catching up and many schedules ------------------------------------------------------------------


class LoopWatch:
    """The most CPU time the event loop's thread spent between two turns of a ticker: how long one piece
    of work held the loop. Counted in the thread's CPU time, not the wall clock, so that a loaded machine
    that takes the CPU away from the test does not count as the loop being held."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        while True:
            began = time.thread_time()
            await asyncio.sleep(0.001)
            self.longest = max(self.longest, time.thread_time() - began)

    async def __aenter__(self) -> "LoopWatch":
        self._task = asyncio.create_task(self._tick())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


def misses(runtime, name: str) -> float:
    return runtime.metrics.registry.get_sample_value("jobq_schedule_misses_total", {"schedule": name}) or 0


@pytest.mark.parametrize("days", [1, 3])
async def test_catching_up_days_of_a_per_second_schedule_does_not_hold_the_event_loop(database_url, db, days):
    """Missed slots are counted, not walked one by one on the event loop: after days away, a schedule of
    every second (`all`) fires its latest 1,000 missed slots and the ones within the grace, and counts
    every other one missed, exactly; no piece of that work holds the loop's thread more than 20 ms."""
    async with open_runtime(database_url) as runtime:
        first = await db.fetchval(
            "INSERT INTO jobq.schedules (name, cron, queue, payload, catch_up, next_run_at)"
            " VALUES ('tick', '* * * * * *', 't', '1', 'all', date_trunc('second', now()) - $1::interval)"
            " RETURNING next_run_at",
            timedelta(days=days),
        )
        async with LoopWatch() as watch:
            fired = await schedules.fire_due(runtime, grace=30)
        after = await db.fetchval("SELECT next_run_at FROM jobq.schedules WHERE name = 'tick'")
        missed = misses(runtime, "tick")
    assert watch.longest < 0.020, watch.longest
    slots = [slot for slot, _ in await slots_of(db, "tick")]
    assert len(slots) == fired and 1000 + 29 <= fired <= 1000 + 35, fired
    # Every slot from the first to the next one is either fired or counted missed, once.
    assert fired + missed == (after - first).total_seconds(), (fired, missed, first, after)
    assert slots[-1] == after - timedelta(seconds=1)
    assert slots == [slots[0] + timedelta(seconds=i) for i in range(len(slots))]  # the latest ones


def _missed_between(cron: Cron, first: datetime, late: datetime) -> int:
    return len(cron.slots(first - timedelta(microseconds=1), late))


@pytest.mark.parametrize(
    ("expression", "timezone"),
    [
        ("* * * * * *", "UTC"),
        ("*/7 * * * * *", "Europe/Berlin"),
        ("*/10 * * * *", "Europe/Berlin"),
        ("15,45 1-3 * * *", "America/New_York"),
        ("30 2 * * *", "Europe/Berlin"),
        ("*/20 * 1,15 * 1-5", "Australia/Lord_Howe"),
        ("0 * L * *", "UTC"),
        ("0 12 * * 1#2", "Asia/Kolkata"),
    ],
)
def test_counting_missed_slots_finds_what_walking_them_finds(expression, timezone):
    """Counted by arithmetic (whole days at once), across changes of the clocks, as walking finds them."""
    cron = Cron(expression, timezone)
    for first, late in [
        (datetime(2026, 10, 24, 22, 0, 3, tzinfo=UTC), datetime(2026, 10, 25, 4, 0, 1, 500, tzinfo=UTC)),
        (datetime(2026, 3, 28, 12, tzinfo=UTC), datetime(2026, 3, 30, 12, 30, tzinfo=UTC)),
        (datetime(2026, 10, 25, 1, 30, tzinfo=UTC), datetime(2026, 10, 25, 1, 59, 59, tzinfo=UTC)),
        (datetime(2026, 4, 4, 14, 45, tzinfo=UTC), datetime(2026, 4, 6, 16, tzinfo=UTC)),
        (datetime(2026, 11, 1, 5, tzinfo=UTC), datetime(2026, 11, 1, 7, 0, 0, tzinfo=UTC)),
        (datetime(2026, 1, 30, 23, tzinfo=UTC), datetime(2026, 3, 2, 1, tzinfo=UTC)),
    ]:
        seconds = len(expression.split()) == 6
        if seconds and late - first > timedelta(hours=7 if expression.startswith("* ") else 72):
            continue  # too many to walk in a test
        assert cron.count(first - timedelta(microseconds=1), late) == _missed_between(cron, first, late), (
            first,
            late,
        )
    # Years away: counted at once, the last ten years at most.
    yearly = Cron("0 0 1 1 *")
    assert yearly.count(datetime(2017, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC)) == 9
    assert yearly.count(datetime(1990, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC)) == 11


async def _due_schedules(db, count: int) -> datetime:
    """`count` schedules of every 5 s in four groups (two crons, two zones), due from the next 5 s boundary
    two seconds away; their first slot."""
    first = await db.fetchval("SELECT to_timestamp(ceil(extract(epoch FROM now() + interval '2 s') / 5) * 5)")
    await db.execute(
        """
        INSERT INTO jobq.schedules (name, cron, timezone, queue, payload, catch_up, next_run_at)
        SELECT 's' || lpad(i::text, 5, '0'),
               CASE WHEN i % 2 = 0 THEN '*/5 * * * * *' ELSE '2-59/5 * * * * *' END,
               CASE WHEN i % 4 < 2 THEN 'UTC' ELSE 'Asia/Kolkata' END,
               'q' || (i % 7), to_jsonb(i), 'skip',
               $2::timestamptz + CASE WHEN i % 2 = 0 THEN interval '0 s' ELSE interval '2 s' END
        FROM generate_series(1, $1) AS i
        """,
        count,
        first,
    )
    return first


async def _assert_every_slot_once(db, count: int, slots: int) -> list[float]:
    """Each schedule fired `slots` consecutive slots from its first, each once; the lateness of each job."""
    repeated = await db.fetchval(
        "SELECT count(*) FROM (SELECT 1 FROM jobq.all_jobs WHERE schedule IS NOT NULL"
        " GROUP BY schedule, schedule_slot HAVING count(*) > 1) r"
    )
    assert repeated == 0
    rows = await db.fetch(
        "SELECT s.name, s.cron, count(j.id) AS n, min(j.schedule_slot) AS first, max(j.schedule_slot) AS last"
        " FROM jobq.schedules s LEFT JOIN jobq.all_jobs j ON j.schedule = s.name GROUP BY 1, 2"
    )
    assert len(rows) == count
    short = [(r["name"], r["n"]) for r in rows if r["n"] < slots]
    assert short == [], short[:10]
    gaps = [r["name"] for r in rows if (r["last"] - r["first"]).total_seconds() != 5 * (r["n"] - 1)]
    assert gaps == [], gaps[:10]
    late = await db.fetch(
        "SELECT extract(epoch FROM created_at - schedule_slot)::float8 AS late FROM jobq.all_jobs"
        " WHERE schedule IS NOT NULL ORDER BY 1"
    )
    return [r["late"] for r in late]


@pytest.mark.slow
async def test_two_replicas_firing_at_once_fire_each_slot_of_many_schedules_once(database_url, db):
    """Firing is safe even when two replicas fire at the same moment (both believe they lead): each due
    slot of 2,000 schedules is enqueued once, by one of them."""
    await _due_schedules(db, 2000)
    async with open_runtime(database_url) as one, open_runtime(database_url) as two:
        await until(
            lambda: db.fetchval("SELECT max(next_run_at) <= now() FROM jobq.schedules"), timeout=15, every=0.1
        )
        fired = await asyncio.gather(*(schedules.fire_due(d, grace=30) for d in (one, two, one, two)))
    assert sum(fired) == 2000, fired
    await _assert_every_slot_once(db, 2000, 1)


@pytest.mark.slow
async def test_two_thousand_schedules_on_two_replicas_fire_every_slot_once_and_on_time(start_service, db):
    """2,000 schedules of every 5 s, most of them due at the same second: fired set-wise, every slot once,
    within a few seconds of its time (one at a time, 2,000 took longer than the 5 s between slots)."""
    replicas = [start_service(), start_service()]
    await _due_schedules(db, 2000)
    await until(
        lambda: db.fetchval("SELECT count(*) >= 4000 FROM jobq.all_jobs WHERE schedule IS NOT NULL"),
        timeout=60,
        every=0.2,
    )
    await db.execute("UPDATE jobq.schedules SET paused = true, next_run_at = NULL")
    late = await _assert_every_slot_once(db, 2000, 2)
    assert late[0] >= 0 and late[-1] < 3.0, (late[len(late) // 2], late[-1])
    assert sorted(replica.app.state.scheduler.leading for replica in replicas) == [False, True]


async def test_the_list_of_schedules_is_paged(client, db):
    await db.execute(
        "INSERT INTO jobq.schedules (name, cron, queue, payload, paused)"
        " SELECT 'p' || lpad(i::text, 4, '0'), '0 3 * * *', 'q', '1', true FROM generate_series(1, 250) i"
    )
    names, after, pages = [], None, 0
    while True:
        answer = await client.get("/schedules", params={"limit": 100} | ({"after": after} if after else {}))
        page = answer.json()
        names += [s["name"] for s in page["schedules"]]
        pages += 1
        after = page["next_after"]
        if after is None:
            break
        assert after == names[-1]
    assert pages == 3 and names == [f"p{i:04}" for i in range(1, 251)]
    whole = (await client.get("/schedules")).json()  # by default up to 1,000: every one of these
    assert len(whole["schedules"]) == 250 and whole["next_after"] is None
    for bad in ({"limit": 0}, {"limit": 1001}, {"after": "no spaces"}):
        assert_problem(await client.get("/schedules", params=bad), 422, "validation_error")
    # The dashboard's page: 100 a page, with a link to the next.
    first = (await client.get("/ui/schedules")).text
    assert first.count('data-schedule="') == 100 and 'data-schedule="p0100"' in first
    assert '<a rel="next" href="/ui/schedules?after=p0100">' in first
    last = (await client.get("/ui/schedules", params={"after": "p0200"})).text
    assert last.count('data-schedule="') == 50 and 'data-schedule="p0201"' in last
    assert 'rel="next"' not in last
    assert 'action="/ui/schedules/p0201/resume' in last
