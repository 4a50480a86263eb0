"""`jobq serve` in a process of its own, for tests that need real processes: restarts, signals, replicas."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from chaos.system import ephemeral_start, port_free

ROOT = Path(__file__).resolve().parent.parent
JOBQ = [sys.executable, "-m", "jobq"]


def jobq_env(**extra: str) -> dict[str, str]:
    """This environment without any database setting, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "JOBQ_DATABASE_URL")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


# Ports for servers the tests start, below the range the kernel draws a connection's own port from: a
# port found free there (bind to port 0) could be taken by any outgoing connection before the server
# bound it, and the cluster of test_failover makes dozens in the seconds before its last node starts.
# Each port is handed out once per process, so two asked for in a row always differ; under pytest-xdist
# each worker process has ports of its own (one in every N), so no two workers hand out the same one.
_TOP = min(ephemeral_start(), 32768)
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
_BELOW = range(max(1024, _TOP - 12000) + _WORKER, _TOP, _WORKERS)
_PORTS = random.Random().sample(_BELOW, k=min(4000, len(_BELOW)))


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on, outside the kernel's ephemeral range."""
    while _PORTS:
        port = _PORTS.pop()
        if port_free(port):
            return port
    raise RuntimeError("every port below the ephemeral range was handed out or taken")


class ServiceProcess:
    def __init__(self, cwd: Path, *args: str, **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [*JOBQ, "serve", "--port", str(self.port), "--log-level", "warning", *args],
            cwd=cwd,
            env=jobq_env(**env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 60) -> ServiceProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"jobq serve exited: {self.output()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError("jobq serve did not become ready")

    def stop(self, timeout: float = 20) -> int:
        """SIGTERM, and wait for the exit; the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                raise
        return self.process.returncode

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def output(self) -> str:
        return self.process.stdout.read().decode() if self.process.stdout else ""

    @staticmethod
    def clean_exit(returncode: int) -> bool:
        # uvicorn re-raises SIGTERM once it has shut down gracefully: "killed by SIGTERM" is a clean exit.
        return returncode in (0, -signal.SIGTERM)
