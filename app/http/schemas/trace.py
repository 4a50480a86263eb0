"""A W3C trace context (traceparent, tracestate) as a job's fields and as something given beside a job.

One definition of a valid context serves an enqueue's fields, a request's headers and an SQS message's
attributes.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field, TypeAdapter, ValidationError

from app.core.limits import MAX_TRACESTATE, TRACEPARENT_PATTERN


def _traceparent(value: str) -> str:
    """A traceparent that names a trace: W3C forbids version ff and all-zero trace and parent ids."""
    version, trace_id, parent_id, _ = value.split("-")
    if version == "ff" or trace_id == "0" * 32 or parent_id == "0" * 16:
        raise ValueError(
            "a traceparent of version ff, or with an all-zero trace or parent id, names no trace"
        )
    return value


# The schema says all of it in one pattern, with lookaheads (which pydantic's own regex engine lacks, so
# it checks the simple pattern and then _traceparent).
TraceParent = Annotated[
    str,
    Field(
        pattern=TRACEPARENT_PATTERN,
        json_schema_extra={
            "pattern": "^(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$"
        },
    ),
    AfterValidator(_traceparent),
]
# Printable ASCII, as its list members are.
TraceState = Annotated[str, Field(min_length=1, max_length=MAX_TRACESTATE, pattern=r"^[ -~]+$")]
_TRACEPARENT: TypeAdapter[str] = TypeAdapter(TraceParent)
_TRACESTATE: TypeAdapter[str] = TypeAdapter(TraceState)


def _valid(adapter: TypeAdapter[str], value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return adapter.validate_python(value.strip())
    except ValidationError:
        return None


def trace_context(traceparent: str | None, tracestate: str | None) -> tuple[str | None, str | None]:
    """A trace context given beside a job rather than in its fields (a request's headers, an SQS message
    attribute), taken as W3C Trace Context asks: an invalid traceparent is ignored, and the tracestate
    with it; an invalid tracestate alone is dropped. (None, None) when there is none to take."""
    parent = _valid(_TRACEPARENT, traceparent)
    return (None, None) if parent is None else (parent, _valid(_TRACESTATE, tracestate))
