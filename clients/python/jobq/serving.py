"""Running a worker from the command line (`jobq worker`): loading what it runs, signals, the status line."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import signal
import sys
from typing import Any

from jobq.tasks import Tasks
from jobq.worker import Handler, Stats, Worker

log = logging.getLogger("jobq.worker")


def load_target(spec: str, queue: str = "default") -> Handler | Tasks:
    """What `jobq worker` runs, imported with the working directory on the path as `python -m` would:
    `package.module:function` (or `module:object.method`) is one handler taking the leased job;
    `module:registry` a `Tasks` registry; a bare `module` its one registry, else its public functions as
    tasks (each job's kind naming one; `queue` is theirs)."""
    module_name, sep, attribute = spec.partition(":")
    if not module_name or (sep and not attribute):
        raise ValueError(f"{spec!r} is neither module:function nor module")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    target: Any = importlib.import_module(module_name)
    if not sep:
        return Tasks.of_module(target, queue)
    for part in attribute.split("."):
        target = getattr(target, part)
    if isinstance(target, Tasks):
        return target
    if not callable(target):
        raise ValueError(f"{spec} is neither callable nor a task registry")
    handler: Handler = target
    return handler


class StatusLine(logging.Handler):
    """Log records for a terminal, with one status line kept below them and redrawn in place."""

    def __init__(self, stream: Any) -> None:
        super().__init__()
        self.stream = stream
        self.text = ""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.stream.write(f"\r\x1b[K{self.format(record)}\n{self.text}")
            self.stream.flush()
        except Exception:  # noqa: BLE001 - logging must not raise
            self.handleError(record)

    def show(self, text: str) -> None:
        with self.lock or contextlib.nullcontext():
            self.text = text
            self.stream.write(f"\r\x1b[K{text}")
            self.stream.flush()

    def end(self) -> None:
        """Leave the last status on the screen and the cursor below it."""
        with self.lock or contextlib.nullcontext():
            if self.text:
                self.stream.write("\n")
                self.stream.flush()
            self.text = ""


async def serve(worker: Worker, *, status_every: float, status_line: StatusLine | None = None) -> Stats:
    """Run `worker` until SIGTERM or SIGINT (a second one releases running jobs at once), showing how it
    is doing: on `status_line` (a terminal) twice a second, else in the log every `status_every` seconds."""
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        name = signal.Signals(signum).name
        if worker.stopping:
            log.warning("%s again: releasing running jobs now", name)
        else:
            log.info(
                "%s: no more leases; running jobs get %gs to finish (send it again to release them now)",
                name,
                worker.grace,
            )
        worker.stop()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)

    async def report() -> None:
        while True:
            await asyncio.sleep(0.5 if status_line else status_every)
            line = worker.stats.line(worker.queue, worker.concurrency)
            if status_line:
                status_line.show(line)
            else:
                log.info("status: %s", line)

    reporter = asyncio.create_task(report())
    try:
        return await worker.run()
    finally:
        reporter.cancel()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        if status_line:
            status_line.end()
