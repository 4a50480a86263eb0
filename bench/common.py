"""Shared pieces of the benchmarks: a fresh database, a jobq service process, percentiles, results.

Benchmarks talk to PostgreSQL over TCP (127.0.0.1), jobq and the raw-SQL references alike, so neither
gets the unix socket's advantage. The server is JOBQ_BENCH_DATABASE_URL (a maintenance database where
the benchmark may create and drop databases), by default the local PostgreSQL on 127.0.0.1:5432.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import uuid
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT))

from app.db import migrations  # noqa: E402

SERVER = os.environ.get("JOBQ_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def with_database(dsn: str, name: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{name}"))


@asynccontextmanager
async def fresh_database():
    """A new, migrated database on the benchmark server; dropped afterwards."""
    name = f"jobq_bench_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(SERVER)
    await admin.execute(f"CREATE DATABASE {name}")
    dsn = with_database(SERVER, name)
    try:
        await asyncio.to_thread(migrations.upgrade, dsn)
        yield dsn
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await admin.close()


class Service:
    """`jobq serve` in its own process, as in production."""

    def __init__(self, dsn: str, port: int = 8911, **env: str) -> None:
        self.url = f"http://127.0.0.1:{port}"
        environment = {**os.environ, "JOBQ_DATABASE_URL": dsn, "PYTHONPATH": str(ROOT), **env}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jobq", "serve", "--port", str(port), "--log-level", "warning"],
            env=environment,
            cwd=ROOT,
        )

    async def __aenter__(self) -> Service:
        deadline = time.monotonic() + 60
        async with httpx.AsyncClient() as http:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:  # e.g. the port is taken, maybe by a stale run
                    raise RuntimeError(f"jobq exited at start (is {self.url} in use?)")
                try:
                    if (await http.get(f"{self.url}/readyz")).status_code == 200:
                        return self
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.1)
        raise RuntimeError("jobq did not start")

    async def __aexit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait(timeout=20)

    def rss_mb(self) -> float:
        with open(f"/proc/{self.process.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")


# An OTLP/HTTP receiver that takes every export and keeps nothing: where traced services send their spans.
_SINK = """
import http.server, sys
class Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
"""


class OtlpSink:
    """An OTLP/HTTP receiver in its own process, discarding what it gets: `env` points a service at it."""

    def __init__(self, port: int = 8918) -> None:
        self.env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"}
        self.process = subprocess.Popen([sys.executable, "-c", _SINK, str(port)])

    def __enter__(self) -> OtlpSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def summary_ms(seconds: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(statistics.median(seconds) * 1000, 2),
        "p99_ms": round(percentile(seconds, 99) * 1000, 2),
        "n": len(seconds),
    }


def write_results(name: str, results: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    meta = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "commit": commit or None,
    }
    path.write_text(json.dumps({"meta": meta, **results}, indent=2) + "\n")
    return path
