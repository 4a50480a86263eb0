"""Hostile bodies: how long `/healthz` takes while unauthenticated requests with large bodies are in flight.

    .venv/bin/python bench/hostile.py [--kind sqs-query] [--in-flight 4] [--seconds 15]

A service with tokens and SQS keys configured gets `--in-flight` requests at once, each sent again as soon
as it is answered, with a body of `--megabytes` (16, the default JOBQ_MAX_BODY_BYTES) and no credentials:

- sqs-query: ``POST /`` with the form ``Action=ListQueues&a&a&...``, unsigned;
- sqs-json: ``POST /`` with ``X-Amz-Target: AmazonSQS.ListQueues`` and a JSON list of that size, unsigned;
- sqs-forged: the form, with an Authorization header naming the right key and a made-up signature;
- schedules: ``PUT /schedules/s`` with a JSON list of that size and no token;
- queues: ``PATCH /queues/q`` with the same;
- jobs: ``POST /jobs/batch`` with the same (a hot route, app/http/fastpath/hot.py);
- ui: ``POST /ui/jobs/selected`` with a form of that many fields and a viewer's token (it may not press
  buttons);
- ui-admin: the same with an admin's token: the form is read, and must be read cheaply;
- none: nothing, for the machine's own noise.

Meanwhile it asks ``GET /healthz`` every 20 ms, from another process than the hostile requests, and
reports the p50, p99 and worst of those, how many hostile requests were answered (and with what), and
the service's peak RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
import time
from collections import Counter

import httpx
from common import Service, fresh_database, percentile, summary_ms

TOKENS = {"viewer-token": "viewer", "admin-token": "admin"}
CREDENTIALS = {"AKIABENCH": {"secret": "bench-secret", "role": "admin"}}


def hostile(kind: str, megabytes: float) -> tuple[str, str, dict[str, str], bytes]:
    size = int(megabytes * 1024 * 1024)
    form = b"Action=ListQueues&" + b"a&" * ((size - 18) // 2)
    listing = b"[" + b"0," * ((size - 3) // 2) + b"0]"
    fields = b"action=retry&" + b"id=1&" * ((size - 13) // 5)
    form_type = {"content-type": "application/x-www-form-urlencoded"}
    json_type = {"content-type": "application/json"}
    if kind == "sqs-query":
        return "POST", "/", form_type, form
    if kind == "sqs-json":
        return "POST", "/", {**json_type, "x-amz-target": "AmazonSQS.ListQueues"}, listing
    if kind == "sqs-forged":
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        authorization = (
            f"AWS4-HMAC-SHA256 Credential=AKIABENCH/{stamp[:8]}/us-east-1/sqs/aws4_request, "
            f"SignedHeaders=content-type;host;x-amz-date, Signature={'0' * 64}"
        )
        return "POST", "/", {**form_type, "authorization": authorization, "x-amz-date": stamp}, form
    if kind == "schedules":
        return "PUT", "/schedules/s", json_type, listing
    if kind == "queues":
        return "PATCH", "/queues/q", json_type, listing
    if kind == "jobs":
        return "POST", "/jobs/batch", json_type, listing
    if kind in ("ui", "ui-admin"):
        token = "viewer-token" if kind == "ui" else "admin-token"
        return "POST", "/ui/jobs/selected", {**form_type, "authorization": f"Bearer {token}"}, fields
    raise SystemExit(f"unknown kind {kind}")


async def attack(url: str, request: tuple, stop: asyncio.Event, answers: Counter) -> None:
    method, path, headers, body = request
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        while not stop.is_set():
            try:
                answer = await http.request(method, path, headers=headers, content=body)
                answers[answer.status_code] += 1
            except httpx.HTTPError as exc:  # answered and closed before the body was sent: a refusal
                answers[type(exc).__name__] += 1


def attackers(url: str, kind: str, megabytes: float, in_flight: int, seconds: float, out) -> None:
    """The hostile requests, in a process of their own: sending 16 MB bodies would otherwise hold up the
    probe's own event loop and be counted as the service's latency."""

    async def run() -> None:
        stop, answers = asyncio.Event(), Counter()
        request = hostile(kind, megabytes)
        tasks = [asyncio.create_task(attack(url, request, stop, answers)) for _ in range(in_flight)]
        await asyncio.sleep(seconds)
        stop.set()
        await asyncio.gather(*tasks)
        out.put(dict(answers))

    asyncio.run(run())


async def probe(url: str, stop: asyncio.Event, latencies: list[float]) -> None:
    """``GET /healthz`` every 20 ms, whether or not the ones before have been answered: a stall shows as
    the many probes it held up, not as one slow probe (no coordinated omission)."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:

        async def once() -> None:
            started = time.perf_counter()
            (await http.get("/healthz")).raise_for_status()
            latencies.append(time.perf_counter() - started)

        probes = []
        while not stop.is_set():
            probes.append(asyncio.create_task(once()))
            await asyncio.sleep(0.02)
        await asyncio.gather(*probes)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def main(args: argparse.Namespace) -> None:
    env = {"JOBQ_TOKENS": json.dumps(TOKENS), "JOBQ_AWS_CREDENTIALS": json.dumps(CREDENTIALS)}
    async with fresh_database() as dsn, Service(dsn, port=free_port(), **env) as service:
        context = multiprocessing.get_context("spawn")
        out = context.Queue()
        attack_process = context.Process(
            target=attackers,
            args=(service.url, args.kind, args.megabytes, args.in_flight, args.seconds, out),
        )
        stop, latencies, peak = asyncio.Event(), [], service.rss_mb()
        probing = asyncio.create_task(probe(service.url, stop, latencies))
        if args.kind != "none":
            attack_process.start()
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            peak = max(peak, service.rss_mb())
        stop.set()
        await probing
        answers = await asyncio.to_thread(out.get) if args.kind != "none" else {}
        if args.kind != "none":
            attack_process.join()
    figures = summary_ms(latencies)
    figures["worst_ms"] = round(percentile(latencies, 100) * 1000, 2)
    print(
        f"{args.kind}, {args.in_flight} in flight, {args.megabytes} MB each: /healthz {figures};"
        f" answers {answers}; peak RSS {peak:.0f} MB"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kind", default="sqs-query")
    parser.add_argument("--in-flight", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--megabytes", type=float, default=16)
    asyncio.run(main(parser.parse_args()))
