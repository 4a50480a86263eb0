"""OpenTelemetry in the worker runner: each handler runs inside a `process <queue>` span (kind CONSUMER, the
OpenTelemetry messaging conventions) that continues the job's trace. On the job's first attempt the span
is a child of the context the job was enqueued under (its `traceparent`); on a retry it starts a trace of
its own, linked to that context, so a job retried for a day does not stretch its producer's trace. The
span is current while the handler runs, so spans the handler starts belong to it; a handler that raises
marks it failed.

It needs only `opentelemetry-api`, and is on only when the process has a tracer provider: with none,
handlers run unwrapped, at no cost. `jobq worker` sets one up from the standard OTEL_* environment when
OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set and the OpenTelemetry SDK and
OTLP/HTTP exporter are installed (the `jobq[otel]` extra); a program running `Worker` itself sets up its
own provider, before `Worker.run()`."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from jobq.tasks import Suspend
from jobq.types import LeasedJob

log = logging.getLogger("jobq.worker")

try:
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - the extra is not installed
    trace = None  # type: ignore[assignment]


def active() -> bool:
    """Whether spans go anywhere: OpenTelemetry is installed and the process has a tracer provider."""
    if trace is None:
        return False
    provider = trace.get_tracer_provider()
    return not isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def traced(handler: Callable[[LeasedJob], Any], is_async: bool) -> Callable[[LeasedJob], Any]:
    """`handler`, run inside its job's `process` span when spans go anywhere (`active`); else itself
    (itself too when it is already so wrapped)."""
    if not active() or getattr(handler, "_jobq_traced", False):
        return handler
    from jobq import __version__

    tracer = trace.get_tracer("jobq.worker", __version__)
    if is_async:

        @functools.wraps(handler)
        async def run_async(job: LeasedJob) -> Any:
            with _processing(tracer, job):
                return await handler(job)

        run_async._jobq_traced = True  # type: ignore[attr-defined]
        return run_async

    @functools.wraps(handler)
    def run(job: LeasedJob) -> Any:
        with _processing(tracer, job):
            return handler(job)

    run._jobq_traced = True  # type: ignore[attr-defined]
    return run


@contextmanager
def _processing(tracer: trace.Tracer, job: LeasedJob) -> Iterator[None]:
    enqueued = _context(job)
    parent, links = Context(), []  # never the context the runner happens to be in
    if enqueued is not None and job.attempts <= 1:
        parent = enqueued
    elif enqueued is not None:
        links.append(trace.Link(trace.get_current_span(enqueued).get_span_context()))
    attributes: dict[str, str | int] = {
        "messaging.system": "jobq",
        "messaging.destination.name": job.queue,
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
        "messaging.message.id": str(job.id),
        "messaging.message.delivery_count": job.attempts,
    }
    if job.kind is not None:
        attributes["jobq.job.kind"] = job.kind
    with tracer.start_as_current_span(
        f"process {job.queue}",
        parent,
        trace.SpanKind.CONSUMER,
        attributes=attributes,
        links=links,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield
        except Suspend as suspended:  # not a failure: the job sleeps, or waits for an event
            span.set_attribute("jobq.suspended", str(suspended))
            raise
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise


_propagator = TraceContextTextMapPropagator() if trace is not None else None


def _context(job: LeasedJob) -> Context | None:
    if job.traceparent is None or _propagator is None:
        return None
    carrier = {"traceparent": job.traceparent}
    if job.tracestate is not None:
        carrier["tracestate"] = job.tracestate
    return _propagator.extract(carrier)


def export_from_environment() -> Callable[[], None] | None:
    """For `jobq worker`: a tracer provider exporting over OTLP/HTTP, as the OTEL_* environment says, when
    it asks for one and nothing has set a provider yet; the function that flushes it at exit. None when
    tracing stays off (it says why in the log when the environment asked for it)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if not endpoint or trace is None or active():
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set, but the OpenTelemetry SDK and OTLP/HTTP exporter are not "
            "installed: no spans (pip install opentelemetry-sdk opentelemetry-exporter-otlp-proto-http)"
        )
        return None
    provider = TracerProvider()  # its resource and sampler: OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER, ...
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    log.info("exporting OpenTelemetry spans to %s", endpoint)
    return provider.shutdown
