"""The bodies of durable steps, sleeps and events (API part 8): a step recorded under a lease, a wait for an
event, an event sent, and what a lease and a job show of them. A sleep is an item of POST /release with a
`delay` (app/http/schemas/workers.py).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from app.core.limits import NO_NUL
from app.core.states import JobStatus
from app.http.schemas.common import Body, LeaseToken, Number

# A year: the longest sleep, and the longest wait for an event.
MAX_PARK = 31_536_000
MAX_STEP_NAME = 128
MAX_EVENT_NAME = 256

_TOKEN = "3f2b8c1e-5a4d-4e7b-9c0a-1d2e3f4a5b6c.orders"

ParkSeconds = Annotated[float, Field(ge=0, le=MAX_PARK, allow_inf_nan=False), Number]
# Neither may hold U+0000, which PostgreSQL's text and jsonb cannot: refused as the schema says.
StepName = Annotated[str, Field(min_length=1, max_length=MAX_STEP_NAME, pattern=NO_NUL, examples=["charge"])]
EventName = Annotated[
    str, Field(min_length=1, max_length=MAX_EVENT_NAME, pattern=NO_NUL, examples=["paid:7"])
]


class StepRequest(Body):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"lease_token": _TOKEN, "name": "charge", "result": {"charge_id": "ch_3Pq9"}}]
        }
    )

    lease_token: LeaseToken
    name: StepName = Field(description="The step's name, 1-128 characters, unique within the job.")
    # Any: stored as it is, like a payload. JSON null is a result too (a step that returns nothing).
    result: Any = Field(
        default=None,
        description="What the step returned: any JSON value, null included. Every later lease of the job "
        "carries it in `steps`; the job's steps are at most JOBQ_MAX_STEPS_BYTES (1 MiB) as JSON, else 413.",
    )


class StepRecorded(BaseModel):
    id: int = Field(description="The job.")
    name: str = Field(description="The step recorded.")
    recorded: bool = Field(
        description="True: recorded now (a name recorded already is 409, with its result)."
    )


class AwaitRequest(Body):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"lease_token": _TOKEN, "event": "paid:7", "timeout": 86400}]}
    )

    lease_token: LeaseToken
    event: EventName = Field(description="The event's name (1-256 characters), as POST /events sends it.")
    timeout: Annotated[float, Field(ge=1, le=MAX_PARK, allow_inf_nan=False), Number] = Field(
        description="Seconds to wait at most, 1-31,536,000 (a year): then the job is pending again without "
        "the event (its `events` get an entry with `timed_out: true`)."
    )


class Awaited(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"id": 1043, "status": "waiting", "run_at": "2025-07-01T09:15:00Z", "event_id": None},
                {"id": 1043, "status": "pending", "run_at": "2025-06-30T09:15:00Z", "event_id": 88},
            ]
        }
    )

    id: int = Field(description="The job.")
    status: JobStatus = Field(
        description="waiting (parked until the event, or run_at), or pending: an event of that name was "
        "sent since the job was enqueued and had not reached it; it reaches it now, and the job runs again."
    )
    run_at: datetime = Field(description="Waiting: the wait's deadline. Pending: now.")
    event_id: int | None = Field(description="The event that reached the job at once; null: parked.")


class EventRequest(Body):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"name": "paid:7", "payload": {"amount": 4200, "currency": "EUR"}}]}
    )

    name: EventName = Field(description="The event's name, 1-256 characters: every job awaiting it wakes.")
    payload: Any = Field(
        default=None,
        description="Any JSON value (at most JOBQ_MAX_PAYLOAD_BYTES), handed to each job it reaches.",
    )


class EventSent(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"id": 88, "name": "paid:7", "woken": 1}]})

    id: int = Field(description="The event's id.")
    name: str = Field(description="Its name.")
    woken: int = Field(
        description="Jobs awaiting it that it made pending. It is kept (JOBQ_EVENT_RETENTION, 7 days), so "
        "a job that awaits the name later, having been enqueued before it was sent, finds it at once."
    )


class EventView(BaseModel):
    id: int = Field(description="The event's id.")
    name: str = Field(description="Its name.")
    payload: Any = Field(description="As sent.")
    at: datetime = Field(description="When it was sent.")


class EventPage(BaseModel):
    events: list[EventView] = Field(description="The events kept, newest first.")
    next_before_id: int | None = Field(description="`before_id` of the next page; null: none left.")


class EventReached(BaseModel):
    """An event that reached a job, or a wait of the job that ran out (`timed_out`), in the order they
    came: a handler run again from the top reads the n-th wait for a name from the n-th entry of that name."""

    id: int | None = Field(default=None, description="The event's id; absent for a wait that timed out.")
    name: str = Field(description="The event's name (the name awaited).")
    payload: Any = Field(default=None, description="As sent; null for a wait that timed out.")
    at: datetime = Field(description="When it was sent, or when the wait ran out.")
    timed_out: bool | None = Field(default=None, description="True: the wait ran out without the event.")


class WaitingFor(BaseModel):
    event: str = Field(description="The event's name.")
    until: datetime = Field(description="The wait's deadline: then the job is pending without it.")
