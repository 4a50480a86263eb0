"""Trace context through SQS, as AWS and OpenTelemetry carry it. A send's ``AWSTraceHeader`` system
attribute (X-Ray's trace header), or else a W3C ``traceparent`` message attribute (and ``tracestate``),
becomes the job's traceparent; a receive that asks for ``AWSTraceHeader`` gets the job's traceparent back
in X-Ray's format, however the job was enqueued (jobq's API and SQL too).

An X-Ray trace id is a W3C one written differently: ``Root=1-<8 hex>-<24 hex>`` is the traceparent's 32 hex,
``Parent`` its parent id and ``Sampled=1`` its sampled flag; the mapping OpenTelemetry's X-Ray propagator
makes both ways. What a traceparent has no room for (``Lineage``, ``Self``) is not kept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from app.http.schemas import trace_context
from app.sqs.protocol import invalid_parameter

TRACE_HEADER = "AWSTraceHeader"  # the one system attribute a send may give, as in SQS
_ROOT = re.compile(r"1-([0-9a-fA-F]{8})-([0-9a-fA-F]{24})")
_PARENT = re.compile(r"[0-9a-fA-F]{16}")
# "?": the sampling decision is deferred to the receiver, so nothing is sampled yet.
_SAMPLED = {"1": "01", "0": "00", "?": "00"}


@dataclass(frozen=True)
class SentTrace:
    """A message's trace context as its job keeps it, and the system attributes it came in (their MD5
    goes back to the sender)."""

    traceparent: str | None = None
    tracestate: str | None = None
    system_attributes: dict[str, dict[str, str]] = field(default_factory=dict)


def traceparent_of(header: str) -> str | None:
    """The W3C traceparent an X-Ray trace header names (fields in any order, unknown ones skipped,
    Sampled missing: not sampled); None if it names none."""
    fields = {}
    for part in header.split(";"):
        if not part.strip():
            continue
        key, equals, value = part.partition("=")
        if not equals:
            return None
        fields[key.strip()] = value.strip()
    root = _ROOT.fullmatch(fields.get("Root", ""))
    parent = fields.get("Parent", "")
    flags = _SAMPLED.get(fields.get("Sampled", "0"))
    if root is None or not _PARENT.fullmatch(parent) or flags is None:
        return None
    return trace_context(f"00-{root[1]}{root[2]}-{parent}-{flags}".lower(), None)[0]


def trace_header(traceparent: str) -> str:
    """The X-Ray trace header of a job's traceparent (valid, as its column holds only those)."""
    _, trace_id, parent_id, flags = traceparent.split("-")
    return f"Root=1-{trace_id[:8]}-{trace_id[8:]};Parent={parent_id};Sampled={int(flags, 16) & 1}"


def _string_attribute(attributes: dict[str, dict[str, str]], name: str) -> str | None:
    attribute = attributes.get(name)
    return attribute["StringValue"] if attribute and attribute["DataType"] == "String" else None


def sent_trace(system: Any, attributes: dict[str, dict[str, str]], header: str | None = None) -> SentTrace:
    """The trace context of a send, from its MessageSystemAttributes (`system`, as given: a malformed one
    is InvalidParameterValue, as SQS answers), the request's X-Amzn-Trace-Id `header` and its checked
    message `attributes`. AWSTraceHeader wins; then the header, which SQS takes as the AWSTraceHeader of a
    send that has none (an X-Ray SDK sets it on every call it traces; one that names no trace is ignored);
    else a `traceparent` String attribute that is valid, with `tracestate` if valid too. An invalid
    traceparent attribute is ignored, as W3C asks of a traceparent header, and stays a message attribute."""
    if system is None:
        system = {}
    if not isinstance(system, dict):
        raise invalid_parameter("MessageSystemAttributes must be a map.")
    for name in system:
        if name != TRACE_HEADER:
            raise invalid_parameter(
                f"Message system attribute name '{name}' is invalid: only {TRACE_HEADER} may be sent."
            )
    given = system.get(TRACE_HEADER)
    if given is not None:
        if not isinstance(given, dict) or given.get("DataType") != "String":
            raise invalid_parameter(f"The message system attribute '{TRACE_HEADER}' must be of type String.")
        value = given.get("StringValue")
        traceparent = traceparent_of(value) if isinstance(value, str) else None
        if traceparent is None:
            raise invalid_parameter(
                f"Value {value} for message system attribute {TRACE_HEADER} is invalid. Reason: not an "
                "X-Ray trace header naming a trace (Root=1-<8 hex>-<24 hex>;Parent=<16 hex>;Sampled=<0|1>)."
            )
        return SentTrace(traceparent, None, {TRACE_HEADER: {"DataType": "String", "StringValue": value}})
    from_header = traceparent_of(header) if header else None
    if from_header is not None:
        return SentTrace(from_header, None)
    traceparent, tracestate = trace_context(
        _string_attribute(attributes, "traceparent"), _string_attribute(attributes, "tracestate")
    )
    return SentTrace(traceparent, tracestate)
