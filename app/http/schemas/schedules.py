"""The bodies of the schedules' API (/schedules): a schedule as it is declared, and as it is shown with
its next and last slots.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.core.cron import CatchUp, Cron
from app.http.schemas.common import Body, Kind, MaxAttempts, Priority, QueueName

_SCHEDULE_EXAMPLE = {
    "cron": "0 3 * * *",
    "timezone": "Europe/Berlin",
    "queue": "reports",
    "kind": "build_report",
    "payload": {"period": "day"},
    "catch_up": "once",
}


class ScheduleRequest(Body):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                _SCHEDULE_EXAMPLE,
                {
                    "cron": "*/30 * * * * *",
                    "queue": "sync",
                    "kind": "pull_orders",
                    "payload": {"partner": "partner-7"},
                    "key": "partner-7",
                    "priority": 5,
                    "max_attempts": 1,
                    "catch_up": "skip",
                    "paused": True,
                },
            ]
        }
    )

    cron: str = Field(
        min_length=1,
        max_length=256,
        description="Five fields (minute hour day month weekday), or six with a leading seconds field.",
        examples=["0 3 * * *"],
    )
    timezone: str = Field(
        default="UTC", min_length=1, max_length=64, description="IANA time zone the cron is read in."
    )
    queue: QueueName = Field(description="The queue each job goes into.")
    payload: Any = Field(description="The payload of each job it enqueues; any JSON value, null included.")
    kind: Kind | None = Field(
        default=None,
        description="The kind of each job it enqueues: 1-128 of A-Z a-z 0-9 _ . : -. Null: none.",
    )
    priority: Priority = 0
    max_attempts: MaxAttempts | None = Field(default=None, description="Default: the queue's setting.")
    key: Annotated[str, Field(min_length=1, max_length=256)] | None = Field(
        default=None, description="Kept with the schedule, for keyed flow control."
    )
    catch_up: CatchUp = Field(
        default=CatchUp.ONCE,
        strict=False,  # the enum from its JSON string
        description="Slots missed by more than JOBQ_SCHEDULE_GRACE: skip (none), once (one job), "
        "all (one per slot, the latest 1,000).",
    )
    paused: bool = Field(
        default=False, description="True: declared paused, no slot fires until it is resumed."
    )

    @model_validator(mode="after")
    def _cron_and_timezone(self) -> ScheduleRequest:
        Cron(self.cron, self.timezone)  # a CronError (a ValueError) says what is wrong
        return self


class Schedule(BaseModel):
    name: str = Field(description="The schedule's name, in the queue-name alphabet.")
    cron: str = Field(description="As declared: five fields, or six with a leading seconds field.")
    timezone: str = Field(description="The IANA time zone the cron is read in.")
    queue: str = Field(description="The queue each job goes into.")
    payload: Any = Field(description="The payload of each job it enqueues; any JSON value, null included.")
    kind: str | None = Field(description="The kind of each job it enqueues; null: none.")
    priority: int = Field(description="Each job's priority; lower runs first.")
    max_attempts: int | None = Field(description="Each job's max_attempts; null: the queue's setting.")
    key: str | None = Field(description="Each job's key, for keyed flow control; null: none.")
    catch_up: CatchUp = Field(description="What missed slots enqueue: skip (none), once (one job), all.")
    paused: bool = Field(description="True: no slot fires (next_run_at is null) until it is resumed.")
    next_run_at: datetime | None = Field(description="The next slot; null while paused.")
    last_run_at: datetime | None = Field(description="The last slot fired, or the last trigger.")
    last_job_id: int | None = Field(description="The job the last slot or trigger enqueued.")
    created_at: datetime = Field(description="When it was first declared.")
    updated_at: datetime = Field(description="Its latest PUT, pause or resume.")


class TriggeredSchedule(Schedule):
    job_id: int = Field(description="The job the trigger enqueued.")


class ScheduleList(BaseModel):
    schedules: list[Schedule] = Field(description="By name, a page of `limit` at most.")
    next_after: str | None = Field(description="Pass as `after` for the next page; null at the end.")


class DeletedSchedule(BaseModel):
    name: str = Field(description="The schedule removed; the jobs it enqueued stay.")
    deleted: bool = Field(description="Always true: an unknown schedule is 404.")
