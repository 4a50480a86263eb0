"""OpenTelemetry spans, exported over OTLP/HTTP to a receiver in the test that decodes the protobuf: one
trace from a producer, through two replicas of the service (one takes the enqueue, the other the lease
and the ack), to the handler `jobq worker` runs, which sees its job's span as the current one."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tests.service_process import JOBQ, ROOT, ServiceProcess, jobq_env

pytestmark = [pytest.mark.slow, pytest.mark.any_server]


class Receiver(ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver: every span posted to /v1/traces, decoded, with its service's name."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.spans: list[dict] = []
        self.lock = threading.Lock()
        self.url = f"http://127.0.0.1:{self.server_address[1]}"

    def named(self, name: str, service: str | None = None) -> list[dict]:
        with self.lock:
            return [s for s in self.spans if s["name"] == name and service in (None, s["service"])]


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        assert self.path == "/v1/traces" and self.headers["Content-Type"] == "application/x-protobuf"
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    with self.server.lock:
                        self.server.spans.append(_decoded(span, resource["service.name"]))
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        pass


def _value(v):
    if v.HasField("array_value"):
        return [_value(item) for item in v.array_value.values]
    return v.string_value if v.HasField("string_value") else v.int_value


def _decoded(span, service: str) -> dict:
    return {
        "service": service,
        "name": span.name,
        "kind": span.kind,
        "trace": span.trace_id.hex(),
        "id": span.span_id.hex(),
        "parent": span.parent_span_id.hex() or None,
        "attributes": {a.key: _value(a.value) for a in span.attributes},
        "links": [
            (link.trace_id.hex(), link.span_id.hex(), {a.key: _value(a.value) for a in link.attributes})
            for link in span.links
        ],
        "error": span.status.code == 2,
    }


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()


def exporting(receiver: Receiver, service: str) -> dict[str, str]:
    """The OpenTelemetry environment of a process exporting to the receiver at once."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_SERVICE_NAME": service,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }


def until(check, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return found


# OTLP's span kinds (opentelemetry.proto.trace.v1.Span.SpanKind).
PRODUCER, CONSUMER = 4, 5


def test_one_trace_from_producer_through_two_replicas_to_the_handler(receiver, database_url):
    replicas = [
        ServiceProcess(ROOT, JOBQ_DATABASE_URL=database_url, **exporting(receiver, name)).wait_ready()
        for name in ("jobq-a", "jobq-b")
    ]
    a, b = replicas
    worker = None
    provider = TracerProvider(resource=Resource.create({"service.name": "producer"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{receiver.url}/v1/traces")))
    try:
        httpx.patch(f"{a.url}/queues/traced", json={"backoff_base": 0}).raise_for_status()
        with provider.get_tracer("test").start_as_current_span(
            "checkout", kind=SpanKind.PRODUCER
        ) as producer:
            carrier: dict[str, str] = {}
            TraceContextTextMapPropagator().inject(carrier)
            ids = {}
            for name, payload in [("ok", {}), ("flaky", {"flaky": True}), ("fail", {"fail": True})]:
                r = httpx.post(f"{a.url}/jobs", json={"queue": "traced", "payload": payload}, headers=carrier)
                assert r.status_code == 201, r.text
                ids[name] = r.json()["id"]
        trace_id = format(producer.get_span_context().trace_id, "032x")
        producer_id = format(producer.get_span_context().span_id, "016x")

        worker = subprocess.Popen(
            [*JOBQ, "worker", "tests.otel_handlers:handle", "-q", "traced", "--url", b.url],
            env=jobq_env(PYTHONPATH=str(ROOT), **exporting(receiver, "worker")),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

        def finished():
            jobs = {n: httpx.get(f"{a.url}/jobs/{i}").json() for n, i in ids.items()}
            return jobs if all(j["status"] in ("completed", "dead") for j in jobs.values()) else None

        jobs = until(finished)
        assert {n: (j["status"], j["attempts"]) for n, j in jobs.items()} == {
            "ok": ("completed", 1),
            "flaky": ("completed", 2),
            "fail": ("dead", 1),
        }
    finally:
        if worker is not None:
            worker.terminate()
            output, _ = worker.communicate(timeout=30)
        for replica in replicas:
            replica.stop()  # exports what it still holds
        provider.shutdown()
    assert worker.returncode == 0, output

    # The producer's span, and each enqueue a child of it on replica a.
    (checkout,) = receiver.named("checkout", "producer")
    assert (checkout["trace"], checkout["id"]) == (trace_id, producer_id)
    sends = receiver.named("send traced", "jobq-a")
    assert sorted(s["attributes"]["messaging.message.id"] for s in sends) == sorted(map(str, ids.values()))
    for send in sends:
        assert (send["trace"], send["parent"], send["kind"]) == (trace_id, producer_id, PRODUCER)
        assert send["attributes"]["messaging.system"] == "jobq"
        assert send["attributes"]["messaging.destination.name"] == "traced"

    # The handler ran in the process span, a child of the producer's span on the first attempt: spans
    # it starts join the producer's trace.
    ok = jobs["ok"]["result"]
    (process,) = [s for s in receiver.named("process traced", "worker") if s["id"] == ok["span_id"]]
    assert (ok["trace_id"], process["trace"], process["parent"]) == (trace_id, trace_id, producer_id)
    assert process["kind"] == CONSUMER and process["attributes"]["messaging.message.id"] == str(ids["ok"])

    # A retry runs in a trace of its own, linked to the producer's; its first attempt failed, in the trace.
    flaky = jobs["flaky"]["result"]
    assert flaky["trace_id"] != trace_id
    attempts = sorted(
        (
            s
            for s in receiver.named("process traced", "worker")
            if s["attributes"]["messaging.message.id"] == str(ids["flaky"])
        ),
        key=lambda s: s["attributes"]["messaging.message.delivery_count"],
    )
    assert [(s["trace"] == trace_id, s["error"]) for s in attempts] == [(True, True), (False, False)]
    assert attempts[1]["links"] == [(trace_id, producer_id, {})]

    # Replica b leased and settled every job: each span a child of the producer's span when it is about
    # one first attempt, else linked to it, naming the job.
    def about(span: dict) -> set[str]:
        """The jobs a span is about, by id."""
        if "messaging.message.id" in span["attributes"]:
            return {span["attributes"]["messaging.message.id"]}
        return set(map(str, span["attributes"]["jobq.job.ids"]))

    def seen(operation: str) -> set[str]:
        return {j for s in receiver.named(f"{operation} traced", "jobq-b") for j in about(s)}

    for operation in ("lease", "ack", "nack", "dead-letter"):
        for span in receiver.named(f"{operation} traced", "jobq-b"):
            if span["parent"] is not None:
                assert (span["trace"], span["parent"]) == (trace_id, producer_id), span
            else:
                assert span["links"] and all(link[:2] == (trace_id, producer_id) for link in span["links"]), (
                    span
                )
    assert seen("lease") == set(map(str, ids.values()))
    assert seen("ack") == {str(ids["ok"]), str(ids["flaky"])}
    assert seen("nack") == {str(ids["flaky"]), str(ids["fail"])}
    assert seen("dead-letter") == {str(ids["fail"])}
    assert not receiver.named("lease traced", "jobq-a")  # nothing leased there


CLIENT = 3  # OTLP's span kind of a call out


class _PushEndpoint(BaseHTTPRequestHandler):
    """Answers each push with 200 and a JSON result; keeps each request's headers."""

    seen: list[dict[str, str]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).seen.append({k.lower(): v for k, v in self.headers.items()})
        answer = b'{"pushed": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        pass


def test_a_push_delivery_is_a_span_of_its_job_and_sends_its_traceparent(receiver, database_url):
    endpoint = ThreadingHTTPServer(("127.0.0.1", 0), _PushEndpoint)
    _PushEndpoint.seen = []
    threading.Thread(target=endpoint.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{endpoint.server_address[1]}/hook"
    service = ServiceProcess(
        ROOT, JOBQ_DATABASE_URL=database_url, JOBQ_PUSH_ALLOWED_URLS=url, **exporting(receiver, "jobq-p")
    ).wait_ready()
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    try:
        httpx.patch(f"{service.url}/queues/pushed", json={"push": {"url": url}}).raise_for_status()
        r = httpx.post(
            f"{service.url}/jobs", json={"queue": "pushed", "payload": 1, "traceparent": traceparent}
        )
        job_id = r.json()["id"]
        until(lambda: httpx.get(f"{service.url}/jobs/{job_id}").json()["status"] == "completed")
    finally:
        service.stop()  # exports what it still holds
        endpoint.shutdown()
    (headers,) = _PushEndpoint.seen
    assert headers["traceparent"] == traceparent
    (span,) = until(lambda: receiver.named("push pushed", "jobq-p"))
    assert (span["trace"], span["parent"], span["kind"]) == (traceparent[3:35], traceparent[36:52], CLIENT)
    assert span["attributes"]["messaging.message.id"] == str(job_id)
    assert span["attributes"]["url.full"] == url
    assert span["attributes"]["http.response.status_code"] == 200
    assert span["attributes"]["jobq.push.outcome"] == "completed"
