"""The `jobq` command run in the test's own process (jobq.cli.invoke), for tests that check what it prints
and how it exits without the second or so a new Python process takes to import the client."""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass

from jobq.cli import invoke as invoke_in_process


@dataclass(frozen=True)
class Invoked:
    """What one `jobq` command line did: its exit status, what it wrote on stdout and on stderr, and both
    in the order written (`output`)."""

    exit_code: int
    stdout: str
    stderr: str
    output: str


class _Both(io.StringIO):
    """A stream that also writes what it is given to `both`."""

    def __init__(self, both: io.StringIO) -> None:
        super().__init__()
        self.both = both

    def write(self, text: str) -> int:
        self.both.write(text)
        return super().write(text)


@contextmanager
def _environment(changes: Mapping[str, str | None]) -> Iterator[None]:
    """os.environ with `changes` (None removes a variable), as it was again afterwards."""
    saved = {name: os.environ.get(name) for name in changes}
    try:
        for name, value in changes.items():
            _set(name, value)
        yield
    finally:
        for name, value in saved.items():
            _set(name, value)


def _set(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def invoke(
    args: Sequence[str], input: str | None = None, env: Mapping[str, str | None] | None = None
) -> Invoked:
    """`jobq ARGS`, with `input` on stdin and the environment changed by `env` for its run."""
    both = io.StringIO()
    stdout, stderr = _Both(both), _Both(both)
    stdin, sys.stdin = sys.stdin, io.StringIO(input or "")
    try:
        with _environment(env or {}), redirect_stdout(stdout), redirect_stderr(stderr):
            status = invoke_in_process(args)
    finally:
        sys.stdin = stdin
    return Invoked(status, stdout.getvalue(), stderr.getvalue(), both.getvalue())
