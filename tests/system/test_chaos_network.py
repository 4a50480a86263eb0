"""chaos/network.py on real namespaces, nftables rules and sockets: a partition makes a connection hang
(no refusal), heal() undoes it, the relay delays both ways without losing or reordering a byte, and a
sandbox leaves nothing behind, even after a run that crashed."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from chaos.network import Relay, Sandbox, available
from tests.fixtures import tool_missing

pytestmark = pytest.mark.any_server  # no PostgreSQL involved

ROOT = Path(__file__).resolve().parents[2]

# An echo server on argv[1], any free port, which it prints.
ECHO = """
import socket, sys, threading

def echo(connection):
    with connection:
        while data := connection.recv(65536):
            connection.sendall(data)

server = socket.create_server((sys.argv[1], 0))
print(server.getsockname()[1], flush=True)
while True:
    threading.Thread(target=echo, args=(server.accept()[0],), daemon=True).start()
"""

# Connects to argv[1]:argv[2] and says whether it could within a second.
CONNECT = """
import socket, sys

try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1).close()
    print("connected")
except TimeoutError:
    print("timed out")
"""

_sandboxes = itertools.count()


def place() -> tuple[str, int]:
    """A sandbox name of this process's own, and an index no interface on the machine has, starting
    from one of this process's own: tests side by side (pytest-xdist, or another run) each have a
    namespace and a subnet of their own."""
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    n = next(_sandboxes)
    start = (os.getpid() * 4 + n) % 256
    index = next(i for k in range(256) if f" 10.213.{(i := (start + k) % 256)}.1/" not in used)
    return f"jqc{os.getpid()}-{n}", index


def require_sandbox() -> None:
    if (missing := available()) is not None:
        tool_missing(missing)


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    require_sandbox()
    with Sandbox(*place()) as made:
        yield made


@contextlib.contextmanager
def echo_server(wrap: Callable[[list[str]], list[str]], host: str) -> Iterator[int]:
    """ECHO run as `wrap` makes it (in a namespace, or as it is): its port."""
    command = wrap([sys.executable, "-c", ECHO, host])
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdout is not None
            yield int(process.stdout.readline())
        finally:
            process.kill()


def echoed(address: tuple[str, int], data: bytes = b"ping") -> bytes:
    with socket.create_connection(address, timeout=1) as connection:
        connection.sendall(data)
        return connection.recv(len(data))


def reaches(sandbox: Sandbox, port: int) -> str:
    """Whether a process in the namespace connects to the host's `port`: "connected" or "timed out"."""
    command = sandbox.command([sys.executable, "-c", CONNECT, sandbox.host_addr, str(port)])
    return subprocess.run(command, capture_output=True, text=True, timeout=10, check=True).stdout.strip()


@contextlib.contextmanager
def listener(host: str) -> Iterator[int]:
    """A socket listening on `host` in this process, never accepting: the kernel completes a connection's
    handshake (packets both ways) into the backlog all the same. Its port."""
    with socket.create_server((host, 0)) as server:
        yield server.getsockname()[1]


def namespaces() -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in listed.splitlines() if line.strip()]


def links() -> list[str]:
    listed = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0].split("@")[0] for line in listed.splitlines() if line.strip()]


def rules(sandbox: Sandbox) -> str:
    listed = subprocess.run(sandbox.command(["nft", "list", "ruleset"]), capture_output=True, text=True)
    return listed.stdout


def test_a_partition_from_clients_hangs_their_connections_until_healed(sandbox: Sandbox) -> None:
    with echo_server(sandbox.command, sandbox.ns_addr) as port:
        address = (sandbox.ns_addr, port)
        assert echoed(address) == b"ping"
        with socket.create_connection(address, timeout=1) as open_before:
            sandbox.partition_clients(port)
            with pytest.raises(TimeoutError):
                echoed(address)
            open_before.sendall(b"ping")
            with pytest.raises(TimeoutError):
                open_before.recv(4)
        sandbox.heal()
        assert echoed(address) == b"ping"


def test_a_partition_from_the_database_hangs_the_replicas_connections_until_healed(sandbox: Sandbox) -> None:
    with listener(sandbox.host_addr) as port:
        assert reaches(sandbox, port) == "connected"
        sandbox.partition_database(port)
        assert reaches(sandbox, port) == "timed out"
        sandbox.heal()
        assert reaches(sandbox, port) == "connected"


def test_a_fault_is_healed_after_its_time_or_its_block() -> None:
    """fault() heals when its time is up though the block goes on, and when the block ends early."""
    require_sandbox()
    with Sandbox(*place()) as sandbox, listener(sandbox.host_addr) as port:
        started = time.monotonic()
        with sandbox.fault("partition_database", 2.5, port=port):
            assert reaches(sandbox, port) == "timed out"
            time.sleep(started + 2.7 - time.monotonic())
            assert reaches(sandbox, port) == "connected"
        with pytest.raises(KeyboardInterrupt), sandbox.fault("partition_database", 60, port=port):
            raise KeyboardInterrupt
        assert reaches(sandbox, port) == "connected"


def test_the_relay_delays_both_ways_and_keeps_every_byte_in_order() -> None:
    with (
        echo_server(lambda argv: argv, "127.0.0.1") as port,
        Relay(("127.0.0.1", 0), ("127.0.0.1", port), delay=0.2) as relay,
    ):
        address = ("127.0.0.1", relay.port)
        with socket.create_connection(address, timeout=5) as connection:
            started = time.monotonic()
            connection.sendall(b"ping")
            assert connection.recv(4) == b"ping"
            assert time.monotonic() - started >= 0.4
            relay.delay = 0
            started = time.monotonic()
            connection.sendall(b"pong")
            assert connection.recv(4) == b"pong"
            assert time.monotonic() - started < 0.2

        relay.delay = 0.01
        data = os.urandom(1 << 20)
        received = bytearray()
        with socket.create_connection(address, timeout=5) as connection:

            def send() -> None:
                connection.sendall(data)
                connection.shutdown(socket.SHUT_WR)

            sender = threading.Thread(target=send)
            sender.start()
            while chunk := connection.recv(65536):
                received += chunk
            sender.join()
        assert received == data


def test_up_clears_a_crashed_runs_leftovers_and_down_leaves_nothing() -> None:
    """A run killed with a partition on, its atexit never run, leaves the namespace, the veth and the
    rule; the next up() of that name starts afresh, and down() removes everything."""
    require_sandbox()
    crash = (
        "import os, signal, sys\n"
        "from chaos.network import Sandbox\n"
        "Sandbox(sys.argv[1], int(sys.argv[2])).up().partition_database(5432)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    sandbox = Sandbox(*place())
    try:
        argv = [sys.executable, "-c", crash, sandbox.name, str(sandbox.index)]
        assert subprocess.run(argv, cwd=ROOT, timeout=30).returncode == -signal.SIGKILL
        assert sandbox.name in namespaces() and sandbox.host_device in links()
        assert "drop" in rules(sandbox)
        sandbox.up()
        assert sandbox.up() is sandbox  # once up, up again changes nothing
        assert "drop" not in rules(sandbox)
        with listener(sandbox.host_addr) as port:
            assert reaches(sandbox, port) == "connected"
    finally:
        sandbox.down()
    assert sandbox.name not in namespaces()
    assert sandbox.host_device not in links()
    sandbox.down()
