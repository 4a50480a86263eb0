"""The handler `jobq worker` runs in tests/system/test_otel.py: it answers with the trace context it runs
in."""

from opentelemetry import trace

from jobq import Fail, Retry
from jobq.types import LeasedJob


def handle(job: LeasedJob) -> dict[str, str]:
    if job.payload.get("flaky") and job.attempts < 2:
        raise Retry("not yet", after=0)
    if job.payload.get("fail"):
        raise Fail("cannot")
    context = trace.get_current_span().get_span_context()
    return {"trace_id": format(context.trace_id, "032x"), "span_id": format(context.span_id, "016x")}
