"""The history of a run: every request a client sent and what came of it, in the order the answers came.

Each operation is recorded with its request, the wall-clock and monotonic times it was sent and answered,
the HTTP status and the answer's body, and one of three outcomes, as Jepsen's histories have them:

- ``ok``: the service said it was done (a 2xx);
- ``fail``: it said it was not (a 4xx; a 503 with ``"nothing_done": true``);
- ``info``: nobody knows (no answer: a timeout, a connection lost; a 503 without ``nothing_done``; any other
  5xx). An ``info`` operation may have happened, now or later.

The checker (chaos/checker.py) compares wall-clock times of the clients with the database's `now()` (a
lease's start is its `lease_expires_at` less its visibility timeout): the clients, the service and
PostgreSQL must share one clock, as they do on one machine.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

OK, FAIL, INFO = "ok", "fail", "info"


@dataclass
class Op:
    """One request of one client (`process`) and what came of it."""

    process: str
    op: str  # enqueue, lease, ack, nack, extend, release, step, await, event
    request: dict[str, Any]
    sent: float  # time.time() before the request left
    sent_mono: float
    received: float = 0.0  # time.time() when the answer (or the error) came
    received_mono: float = 0.0
    status: int | None = None  # HTTP status; None: no answer
    outcome: str = INFO
    body: Any = None  # the answer's JSON, or the error's text
    job: int | None = None  # the job it acts on, when its path names it (steps, await)
    index: int = field(default=0, compare=False)  # its place in the history

    @property
    def ok(self) -> bool:
        return self.outcome == OK

    @property
    def maybe(self) -> bool:
        """It happened, or may have."""
        return self.outcome in (OK, INFO)

    def brief(self) -> str:
        body = json.dumps(self.body, default=str)
        body = body if len(body) <= 300 else body[:300] + "..."
        took = self.received_mono - self.sent_mono
        return (
            f"#{self.index} {self.process} {self.op} {json.dumps(self.request, default=str)} -> "
            f"{self.outcome} {self.status} {body} (sent {self.sent:.3f}, {took * 1000:.0f} ms)"
        )


def outcome(status: int | None, body: Any) -> str:
    if status is None:
        return INFO
    if 200 <= status < 300:
        return OK
    if status == 503 and isinstance(body, dict) and body.get("nothing_done") is True:
        return FAIL
    if 400 <= status < 500:
        return FAIL
    return INFO


class History:
    """Operations in the order they completed, kept in memory and written as JSON lines."""

    def __init__(self) -> None:
        self.ops: list[Op] = []

    def add(self, op: Op) -> Op:
        op.index = len(self.ops)
        self.ops.append(op)
        return op

    def __iter__(self) -> Iterator[Op]:
        return iter(self.ops)

    def __len__(self) -> int:
        return len(self.ops)

    def write(self, path: Path) -> None:
        with path.open("w") as out:
            for op in self.ops:
                out.write(json.dumps(asdict(op), default=str) + "\n")

    @classmethod
    def read(cls, path: Path) -> History:
        return cls.of(Op(**json.loads(line)) for line in path.read_text().splitlines() if line)

    @classmethod
    def of(cls, ops: Iterable[Op]) -> History:
        history = cls()
        for op in ops:
            history.add(op)
        return history


class Recorder:
    """An HTTP client that records every call it makes in `history`."""

    def __init__(self, history: History, process: str, base_url: str, timeout: float = 5.0) -> None:
        self.history = history
        self.process = process
        self.http = httpx.AsyncClient(base_url=base_url, timeout=timeout)

    async def call(
        self,
        op: str,
        path: str,
        body: dict[str, Any],
        headers: dict[str, str] | None = None,
        job: int | None = None,
    ) -> Op:
        record = Op(self.process, op, body, time.time(), time.monotonic(), job=job)
        try:
            response = await self.http.post(path, json=body, headers=headers)
        except httpx.HTTPError as error:
            record.body = f"{type(error).__name__}: {error}"
        else:
            record.status = response.status_code
            try:
                record.body = response.json()
            except ValueError:
                record.body = response.text[:500]
        record.received, record.received_mono = time.time(), time.monotonic()
        record.outcome = outcome(record.status, record.body)
        return self.history.add(record)

    async def close(self) -> None:
        await self.http.aclose()
