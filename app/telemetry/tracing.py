"""OpenTelemetry spans of what happens to jobs: enqueue, lease, ack, nack and dead-lettering.

Exported over OTLP/HTTP (protobuf) when the OpenTelemetry SDK's own configuration asks for it:
OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT set, and OTEL_SDK_DISABLED not `true`.
The SDK reads every other OTEL_* variable itself (OTEL_SERVICE_NAME, default here `jobq`;
OTEL_TRACES_SAMPLER; OTEL_EXPORTER_OTLP_HEADERS; the batch processor's limits). With tracing off, `record`
returns at once.

The spans follow the OpenTelemetry messaging conventions: `messaging.system` is `jobq`, the queue is
`messaging.destination.name`, spans are named `<operation> <queue>` (`send`, `lease`, `ack`, `nack`,
`dead-letter`). A job's trace context is the `traceparent` it was enqueued with. There is one span
per statement, not per job, which keeps a traced drain cheap: a span about one job on its first attempt is
a child of that context, so the job's first run shows in its producer's trace; a span about a retry, or
about several jobs at once (a batch, or concurrent calls the service ran as one statement), links to
their contexts instead (once each: a batch enqueued in one request shares one), and names the jobs in
`jobq.job.ids`. A job without a trace context gets root spans."""

from __future__ import annotations

import functools
import logging
import os
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry.context import Context
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    TraceFlags,
    Tracer,
    TraceState,
    set_span_in_context,
)

from app import __version__

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

log = logging.getLogger("jobq.tracing")

# What kind of messaging operation each span is (messaging.operation.type) and its span kind.
OPERATIONS = {
    "send": ("send", SpanKind.PRODUCER),
    "lease": ("receive", SpanKind.CLIENT),
    "ack": ("settle", SpanKind.CLIENT),
    "nack": ("settle", SpanKind.CLIENT),
    "dead-letter": (None, SpanKind.INTERNAL),
    "push": ("process", SpanKind.CLIENT),
}
MAX_LINKS = 128  # the SDK's default span link limit: more would be dropped anyway

_tracer: Tracer | None = None
_provider: TracerProvider | None = None


def wanted() -> bool:
    """Whether the OpenTelemetry configuration in the environment asks for spans to be exported."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def start() -> None:
    """Start exporting spans, if the environment asks for it (`wanted`)."""
    global _tracer, _provider
    if not wanted() or _tracer is not None:
        return
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({SERVICE_VERSION: __version__})
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "jobq"}))
    _provider = TracerProvider(resource=resource)  # its sampler: OTEL_TRACES_SAMPLER, parent-based by default
    _provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    _tracer = _provider.get_tracer("jobq", __version__)
    log.info("exporting OpenTelemetry spans to %s", _endpoint())


def stop() -> None:
    """Export the spans still held, then stop (it blocks: call it from a thread)."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


def _endpoint() -> str:
    return os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT", ""
    )


Job = Mapping[str, Any]  # a row holding a job's id, queue, traceparent, tracestate and attempts


def record(
    operation: str, jobs: Iterable[Job], started: int, extra: Mapping[str, str | int] | None = None
) -> None:
    """The span of one statement (or call) that did `operation` to `jobs`, from `started`
    (time.time_ns()) to now: one span per queue among them, with `extra` attributes. No jobs, no span.
    A push delivery is the span `push <queue>` of its one job, with the request's URL and the answer's
    status (app/service/push.py)."""
    if _tracer is None:
        return
    ended = time.time_ns()
    by_queue: dict[str, list[Job]] = defaultdict(list)
    for job in jobs:
        by_queue[job["queue"]].append(job)
    for queue, queued in by_queue.items():
        _span(_tracer, operation, queue, queued, started, ended, extra)


def _span(
    tracer: Tracer,
    operation: str,
    queue: str,
    jobs: list[Job],
    started: int,
    ended: int,
    extra: Mapping[str, str | int] | None = None,
) -> None:
    kind_of, kind = OPERATIONS[operation]
    attributes: dict[str, str | int | list[int]] = {
        "messaging.system": "jobq",
        "messaging.destination.name": queue,
        "messaging.operation.name": operation,
        **(extra or {}),
    }
    if kind_of is not None:
        attributes["messaging.operation.type"] = kind_of
    parent = None
    # One link per distinct context: the jobs of a batch often share one.
    links: dict[tuple[str, str | None], SpanContext] = {}
    if len(jobs) == 1:
        (job,) = jobs
        attributes["messaging.message.id"] = str(job["id"])
        if operation != "send":
            attributes["messaging.message.delivery_count"] = job["attempts"]
        enqueued = _span_context(job["traceparent"], job["tracestate"])
        if enqueued is not None and job["attempts"] <= 1:
            parent = enqueued
        elif enqueued is not None:
            links[job["traceparent"], job["tracestate"]] = enqueued
    else:
        attributes["messaging.batch.message_count"] = len(jobs)
        attributes["jobq.job.ids"] = [job["id"] for job in jobs]
        for job in jobs:
            enqueued = _span_context(job["traceparent"], job["tracestate"])
            if enqueued is not None and len(links) < MAX_LINKS:
                links[job["traceparent"], job["tracestate"]] = enqueued
    context = _ROOT if parent is None else set_span_in_context(NonRecordingSpan(parent))
    span = tracer.start_span(
        f"{operation} {queue}",
        context,
        kind,
        attributes=attributes,
        links=[Link(c) for c in links.values()],
        start_time=started,
    )
    span.end(end_time=ended)


_ROOT = Context()  # the parent of a root span: never the context the caller happens to be in


@functools.lru_cache(maxsize=4096)
def _span_context(traceparent: str | None, tracestate: str | None) -> SpanContext | None:
    """A job's trace context; None without one. Its traceparent was checked when the job was stored, and
    every version lays out its first 55 characters as version 00 does (W3C Trace Context). Cached: the
    lease and the ack of a job read the same one."""
    if traceparent is None:
        return None
    return SpanContext(
        trace_id=int(traceparent[3:35], 16),
        span_id=int(traceparent[36:52], 16),
        is_remote=True,
        trace_flags=TraceFlags(int(traceparent[53:55], 16)),
        trace_state=TraceState.from_header([tracestate]) if tracestate else None,
    )
