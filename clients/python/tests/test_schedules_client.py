"""Schedules through the Python client (jobq/client.py) and the `jobq schedules` commands (jobq/cli.py),
against a real service and database: set, get, list, pause, resume, trigger and delete; the jobs they
enqueue; problems as exceptions, and as exit statuses with a line on stderr."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from jobq import AsyncClient, Client, NotFound, ValidationError
from jobq.client import Calls
from jobq.types import CatchUp, Forbidden, Schedule
from tests.command_line import invoke
from tests.waiting import until

pytestmark = pytest.mark.anyio

NAME = "reports:nightly.v2"  # ":" is quoted in the paths


def test_set_get_list_pause_resume_trigger_delete(service):
    with Client(service.url) as jobq:
        assert jobq.admin.schedules() == []
        made = jobq.admin.set_schedule(
            NAME,
            "0 3 * * *",
            "reports",
            {"month": "2026-11"},
            timezone="Europe/Berlin",
            kind="build_report",
            priority=-2,
            max_attempts=3,
            key="nightly",
            catch_up=CatchUp.SKIP,
        )
        assert isinstance(made, Schedule)
        assert (made.name, made.cron, made.timezone, made.queue, made.payload) == (
            NAME, "0 3 * * *", "Europe/Berlin", "reports", {"month": "2026-11"},
        )  # fmt: skip
        assert (made.kind, made.priority, made.max_attempts, made.key, made.paused) == (
            "build_report", -2, 3, "nightly", False,
        )  # fmt: skip
        assert made.catch_up is CatchUp.SKIP
        assert (made.last_run_at, made.last_job_id, made.job_id) == (None, None, None)
        # The next 03:00 in Berlin: within a day, whatever Berlin's offset from UTC is then.
        now = datetime.now(UTC)
        assert now < made.next_run_at <= now + timedelta(days=1)
        berlin = made.next_run_at.astimezone(ZoneInfo("Europe/Berlin"))
        assert (berlin.hour, berlin.minute, berlin.second) == (3, 0, 0)
        assert jobq.admin.schedule(NAME) == made

        plain = jobq.admin.set_schedule("a-first", "*/5 * * * *", "reports", None)  # the service's defaults
        assert (plain.timezone, plain.catch_up, plain.priority, plain.paused) == ("UTC", "once", 0, False)
        assert (plain.payload, plain.kind, plain.max_attempts, plain.key) == (None, None, None, None)
        assert plain.next_run_at.minute % 5 == 0 and plain.next_run_at.second == 0
        assert [s.name for s in jobq.admin.schedules()] == ["a-first", NAME]

        paused = jobq.admin.pause_schedule(NAME)
        assert paused.paused and paused.next_run_at is None
        assert jobq.admin.schedule(NAME).paused
        resumed = jobq.admin.resume_schedule(NAME)
        assert not resumed.paused
        assert resumed.next_run_at.astimezone(ZoneInfo("Europe/Berlin")).hour == 3

        triggered = jobq.admin.trigger_schedule(NAME)
        job = jobq.get_job(triggered.job_id)
        assert (job.queue, job.payload, job.kind, job.priority, job.max_attempts, job.status) == (
            "reports", {"month": "2026-11"}, "build_report", -2, 3, "pending",
        )  # fmt: skip
        assert (job.schedule, job.schedule_slot) == (NAME, None)  # a trigger has no slot
        assert triggered.last_job_id == job.id and triggered.last_run_at is not None
        assert not triggered.paused and triggered.next_run_at == resumed.next_run_at
        assert jobq.admin.schedule(NAME).last_job_id == job.id
        assert jobq.get_job(job.id).schedule == NAME

        replaced = jobq.admin.set_schedule(NAME, "30 4 * * 1", "other", [1])
        assert (replaced.cron, replaced.queue, replaced.payload) == ("30 4 * * 1", "other", [1])
        assert (replaced.timezone, replaced.kind, replaced.priority, replaced.catch_up) == (
            "UTC", None, 0, "once",
        )  # fmt: skip
        assert replaced.next_run_at.weekday() == 0 and replaced.next_run_at.hour == 4

        deleted = jobq.admin.delete_schedule(NAME)
        assert (deleted.name, deleted.deleted) == (NAME, True)
        with pytest.raises(NotFound):
            jobq.admin.schedule(NAME)
        assert [s.name for s in jobq.admin.schedules()] == ["a-first"]
        assert jobq.get_job(job.id).status == "pending"  # the jobs it enqueued stay


def test_unknown_names_and_bad_schedules_are_refused(service):
    with Client(service.url) as jobq:
        jobq.admin.set_schedule("known", "0 * * * *", "q", 1)
        for call in (
            jobq.admin.schedule,
            jobq.admin.pause_schedule,
            jobq.admin.resume_schedule,
            jobq.admin.trigger_schedule,
            jobq.admin.delete_schedule,
        ):
            with pytest.raises(NotFound) as missing:
                call("unknown")
            assert missing.value.status == 404
        for cron, timezone in (("not a cron", None), ("61 * * * *", None), ("0 3 * * *", "Mars/Olympus")):
            with pytest.raises(ValidationError) as invalid:
                jobq.admin.set_schedule("known", cron, "q", 1, timezone=timezone)
            assert invalid.value.status == 422
        with pytest.raises(ValidationError):
            jobq.admin.set_schedule("no spaces", "0 * * * *", "q", 1)
        with pytest.raises(ValidationError):
            jobq.admin.set_schedule("known", "0 * * * *", "q", 1, catch_up="never")
        (known,) = jobq.admin.schedules()  # nothing refused changed anything
        assert (known.name, known.cron, known.timezone) == ("known", "0 * * * *", "UTC")


async def test_async_client_and_the_jobs_a_schedule_enqueues_at_its_times(service, db):
    async with AsyncClient(service.url) as jobq:
        made = await jobq.admin.set_schedule("every-second", "* * * * * *", "ticks", "tick", paused=True)
        assert made.paused and made.next_run_at is None
        assert [s.name for s in await jobq.admin.schedules()] == ["every-second"]
        assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs") == 0

        resumed = await jobq.admin.resume_schedule("every-second")
        assert not resumed.paused and resumed.next_run_at is not None
        first = await until(lambda: db.fetchval("SELECT min(id) FROM jobq.all_jobs WHERE queue = 'ticks'"))
        job = await jobq.get_job(first)
        assert (job.payload, job.schedule) == ("tick", "every-second")
        assert job.schedule_slot is not None and job.schedule_slot.microsecond == 0
        assert (await jobq.admin.schedule("every-second")).last_run_at >= job.schedule_slot

        assert (await jobq.admin.pause_schedule("every-second")).next_run_at is None
        triggered = await jobq.admin.trigger_schedule("every-second")
        assert (await jobq.get_job(triggered.job_id)).schedule_slot is None
        assert (await jobq.admin.delete_schedule("every-second")).deleted
        with pytest.raises(NotFound):
            await jobq.admin.trigger_schedule("every-second")
        assert await jobq.admin.schedules() == []


async def test_only_admins_set_schedules(start_service):
    service = start_service(tokens={"p": "producer", "a": "admin"})
    with Client(service.url, token="p") as producer, pytest.raises(Forbidden):
        producer.admin.set_schedule("nightly", "0 3 * * *", "q", 1)
    with Client(service.url, token="a") as operator:
        assert operator.admin.set_schedule("nightly", "0 3 * * *", "q", 1).name == "nightly"


def test_calls_as_sent():
    """What each call puts in its request: names quoted, unset options left out, and the calls that
    must not be sent twice marked so."""
    put = Calls.set_schedule("a:b/c", "0 3 * * *", "q", None)
    assert (put.method, put.path, put.json) == (
        "PUT", "/schedules/a%3Ab%2Fc", {"cron": "0 3 * * *", "queue": "q", "payload": None},
    )  # fmt: skip
    full = Calls.set_schedule("n", "0 3 * * *", "q", 1, timezone="UTC", priority=0, catch_up=CatchUp.ALL)
    assert full.json == {
        "cron": "0 3 * * *", "queue": "q", "payload": 1, "timezone": "UTC", "priority": 0, "catch_up": "all",
    }  # fmt: skip
    assert Calls.set_schedule("n", "0 3 * * *", "q", 1, paused=False).json["paused"] is False
    calls = [
        Calls.schedules(),
        Calls.schedule("n"),
        Calls.pause_schedule("n"),
        Calls.resume_schedule("n"),
        Calls.trigger_schedule("n"),  # a repeat would enqueue another job
        Calls.delete_schedule("n"),  # a repeat would answer not_found
    ]
    assert [(c.method, c.path, c.idempotent) for c in calls] == [
        ("GET", "/schedules", True),
        ("GET", "/schedules/n", True),
        ("POST", "/schedules/n/pause", True),
        ("POST", "/schedules/n/resume", True),
        ("POST", "/schedules/n/trigger", False),
        ("DELETE", "/schedules/n", False),
    ]


def test_a_schedule_reads_without_fields_it_does_not_know():
    """A catch_up this client does not know stays a str; a job of a service without schedules has
    none."""
    schedule = Calls.schedule("n").read(SCHEDULE | {"catch_up": "later", "new_field": 1})
    assert schedule.catch_up == "later" and schedule.next_run_at == datetime(2030, 1, 1, 3, tzinfo=UTC)
    assert Calls.schedule("n").read(SCHEDULE).catch_up is CatchUp.ONCE
    job = Calls.get_job(1).read(JOB_WITHOUT_SCHEDULE)
    assert (job.schedule, job.schedule_slot) == (None, None)


SCHEDULE = {
    "name": "n", "cron": "0 3 * * *", "timezone": "UTC", "queue": "q", "payload": None, "kind": None,
    "priority": 0, "max_attempts": None, "key": None, "catch_up": "once", "paused": False,
    "next_run_at": "2030-01-01T03:00:00Z", "last_run_at": None, "last_job_id": None,
    "created_at": "2029-12-31T00:00:00Z", "updated_at": "2029-12-31T00:00:00Z",
}  # fmt: skip
JOB_WITHOUT_SCHEDULE = {
    "id": 1, "queue": "q", "status": "pending", "payload": None, "priority": 0,
    "run_at": "2030-01-01T00:00:00Z", "attempts": 0, "max_attempts": 5, "dedup_key": None,
    "last_error": None, "lease_expires_at": None, "created_at": "2030-01-01T00:00:00Z",
    "updated_at": "2030-01-01T00:00:00Z", "completed_at": None,
}  # fmt: skip


# --- the commands ----------------------------------------------------------------------------------


def jobq(*args: str, url: str, stdin: str | None = None):
    return invoke(["schedules", *args, "--url", url], input=stdin)


TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


def test_commands(service):
    url = service.url
    assert jobq("list", url=url).stdout == "no schedules\n"
    done = jobq(
        "set", "nightly", "0 3 * * *", "reports", '{"month": "2026-11"}', "--timezone", "Europe/Berlin",
        "--kind", "build_report", "--priority", "2", "--max-attempts", "4", "--catch-up", "all", url=url,
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    assert re.fullmatch(rf"schedule nightly: next run at {TIME}\n", done.stdout)
    paused = jobq("set", "hourly", "0 * * * *", "reports", "-", "--paused", url=url, stdin="null")
    assert paused.exit_code == 0 and paused.stdout == "schedule hourly: paused\n"

    table = jobq("list", url=url).stdout.splitlines()
    assert table[0].split() == ["NAME", "CRON", "TIMEZONE", "QUEUE", "NEXT", "RUN", "LAST", "RUN", "PAUSED"]
    assert re.fullmatch(r"hourly +0 \* \* \* \* +UTC +reports +- +- +yes", table[1])
    assert re.fullmatch(rf"nightly +0 3 \* \* \* +Europe/Berlin +reports +{TIME} +- +no", table[2])
    listed = json.loads(jobq("list", "--json", url=url).stdout)
    assert [(s["name"], s["payload"], s["catch_up"]) for s in listed] == [
        ("hourly", None, "once"), ("nightly", {"month": "2026-11"}, "all"),
    ]  # fmt: skip
    assert (listed[1]["kind"], listed[1]["priority"], listed[1]["max_attempts"]) == ("build_report", 2, 4)
    assert listed[1]["next_run_at"].endswith("Z") and listed[0]["next_run_at"] is None

    assert jobq("pause", "nightly", url=url).stdout == "schedule nightly: paused\n"
    assert json.loads(jobq("resume", "nightly", "--json", url=url).stdout)["paused"] is False
    assert re.fullmatch(rf"schedule hourly: next run at {TIME}\n", jobq("resume", "hourly", url=url).stdout)

    triggered = jobq("trigger", "nightly", url=url)
    assert triggered.exit_code == 0, triggered.output
    job_id = int(re.fullmatch(r"enqueued job (\d+) on reports\n", triggered.stdout)[1])
    with Client(url) as client:
        job = client.get_job(job_id)
        assert (job.schedule, job.payload, job.kind) == ("nightly", {"month": "2026-11"}, "build_report")
        assert client.admin.schedule("nightly").last_job_id == job_id
    as_json = json.loads(jobq("trigger", "nightly", "--json", url=url).stdout)
    assert as_json["job_id"] == job_id + 1 and as_json["last_job_id"] == job_id + 1

    assert jobq("delete", "nightly", url=url).stdout == "deleted schedule nightly\n"
    assert json.loads(jobq("delete", "hourly", "--json", url=url).stdout) == {
        "name": "hourly",
        "deleted": True,
    }
    assert jobq("list", url=url).stdout == "no schedules\n"


def test_commands_refused(service):
    url = service.url
    for args in (["pause", "x"], ["resume", "x"], ["trigger", "x"], ["delete", "x"]):
        missing = jobq(*args, url=url)
        assert missing.exit_code == 1 and missing.stdout == "", args
        assert missing.stderr.startswith("jobq: ") and missing.stderr.endswith("(not_found)\n")
    bad_cron = jobq("set", "x", "not a cron", "q", "1", url=url)
    assert bad_cron.exit_code == 1 and bad_cron.stderr.endswith("(validation_error)\n")
    bad_json = jobq("set", "x", "0 3 * * *", "q", "{not json", url=url)
    assert bad_json.exit_code == 2 and "not JSON" in bad_json.stderr
    bad_choice = jobq("set", "x", "0 3 * * *", "q", "1", "--catch-up", "never", url=url)
    assert bad_choice.exit_code == 2
    assert jobq("list", url=url).stdout == "no schedules\n"
