"""The field types every body shares (queue names, ids, seconds, priorities, rates), their limits, and the
strict ``Body`` every request is read as.

Limits live here, next to the fields they bound, so the OpenAPI document states them too.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated, Any

from pydantic import AfterValidator, AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field

from app.core.jsontext import HugeNumber
from app.core.limits import (
    KIND_PATTERN,
    MAX_JOB_ID,
    MAX_KEY,
    MAX_KIND,
    MAX_LEASE_TOKEN,
    MAX_QUEUE_NAME,
    MAX_VISIBILITY_TIMEOUT,
    QUEUE_NAME_PATTERN,
)

QueueName = Annotated[
    str, Field(pattern=QUEUE_NAME_PATTERN, min_length=1, max_length=MAX_QUEUE_NAME, examples=["emails"])
]


def _json_number(value: Any) -> Any:
    # JSON numbers only: 2.0 is the integer 2 (as in JSON Schema), but "2" and true are not numbers.
    if type(value) is Decimal or type(value) is HugeNumber:  # app/core/jsontext.py read_json
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a JSON number")
    return value


def _json_string(value: Any) -> Any:
    if not isinstance(value, str):
        raise ValueError("must be a string (RFC 3339)")
    return value


# With strict=False on an int, a whole float (2.0) becomes 2; Number refuses everything else lax mode
# would convert ("2", true).
Number = BeforeValidator(_json_number)

# Limits of the bodies' fields, named once: app/http/fastpath/bodies.py reads the same bodies with the same
# limits.
MAX_DELAY = 10 * 365 * 86400  # seconds
MIN_PRIORITY, MAX_PRIORITY = -(2**31), 2**31 - 1  # PostgreSQL's integer
MAX_MAX_ATTEMPTS = 1000
MAX_DEDUP_KEY = 512
MAX_BATCH = 1000  # jobs of a batch enqueue, items of a batch ack, nack or release

# A run_at is a time from 1970 to the last day of year 9999: the ends of Python's datetime range are what
# asyncpg writes as PostgreSQL's -infinity and infinity, which no answer could show (revision 0017).
EARLIEST_RUN_AT = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_RUN_AT = datetime(9999, 12, 31, tzinfo=UTC)


def _run_at_in_range(value: datetime) -> datetime:
    if value < EARLIEST_RUN_AT:
        raise ValueError("must be 1970-01-01T00:00:00Z or later (any past time runs the job now)")
    if value > LATEST_RUN_AT:
        raise ValueError("must be 9999-12-31T00:00:00Z or earlier")
    return value


RunAt = Annotated[AwareDatetime, BeforeValidator(_json_string), AfterValidator(_run_at_in_range)]

# Constraints first, then the validator, so the constraints reach the JSON schema as minimum/maximum.
JobId = Annotated[int, Field(strict=False, ge=1, le=MAX_JOB_ID), Number]
Seconds = Annotated[float, Field(ge=0, le=MAX_DELAY, allow_inf_nan=False), Number]
LeaseSeconds = Annotated[float, Field(gt=0, le=MAX_VISIBILITY_TIMEOUT, allow_inf_nan=False), Number]
Priority = Annotated[
    int, Field(strict=False, ge=MIN_PRIORITY, le=MAX_PRIORITY, description="Lower runs first."), Number
]
MaxAttempts = Annotated[int, Field(strict=False, ge=1, le=MAX_MAX_ATTEMPTS), Number]
DedupKey = Annotated[str, Field(min_length=1, max_length=MAX_DEDUP_KEY)]
Kind = Annotated[
    str,
    Field(
        pattern=KIND_PATTERN,
        min_length=1,
        max_length=MAX_KIND,
        examples=["send_email"],
    ),
]
JobKey = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_KEY,
        examples=["customer-42"],
    ),
]
LeaseToken = Annotated[
    str, Field(min_length=1, max_length=MAX_LEASE_TOKEN, description="Opaque; from /lease.")
]


class Body(BaseModel):
    # Strict: a request says what the document says (a number is a number, not "5"; true is not 1),
    # and unknown fields are refused rather than silently ignored.
    model_config = ConfigDict(extra="forbid", strict=True)


# An example trace context, for the examples of the jobs and leases that carry one.
EXAMPLE_TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


# Flow control's limits: a queue's settings and a key's own overrides take the same ones.
MAX_KEY_CONCURRENCY = 100_000
MAX_RATE_PERIOD = 86400.0  # a rate's window, at most a day
KeyConcurrency = Annotated[
    int,
    Field(strict=False, ge=1, le=MAX_KEY_CONCURRENCY, description="Jobs of one key running at once."),
    Number,
]


class Rate(Body):
    """At most `limit` leases in any window of `period` seconds."""

    limit: Annotated[int, Field(strict=False, ge=1, le=1_000_000), Number] = Field(
        description="Leases at most, in any window of `period` seconds: 1-1,000,000."
    )
    period: Annotated[float, Field(gt=0, le=MAX_RATE_PERIOD, allow_inf_nan=False), Number] = Field(
        description="Seconds, at most a day."
    )
