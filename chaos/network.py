"""Network faults between a jobq replica and its PostgreSQL, and between the replica and its clients.

A `Sandbox` is a network namespace joined to the host by a veth pair, the host's end at
10.213.{index}.1/30 (`host_addr`) and the namespace's at 10.213.{index}.2/30 (`ns_addr`). The replica
runs inside it (`sandbox.command(["jobq", "serve", "--host", sandbox.ns_addr, ...])`) and reaches
PostgreSQL at `host_addr`; its clients, on the host, reach it at `ns_addr`. Traffic goes only to these
addresses and to loopback. Every fault lives in the namespace's own nftables table or on the pair's
qdiscs, so nothing else on the host is touched, and `heal()` removes them all. What each means for jobq:

- `partition_database(port)`: packets between the replica and PostgreSQL's port are dropped both ways
  (not refused, as in a real partition). The replica's statements neither fail nor answer: each waits
  out the client's command timeout (statement_timeout + 5 s, app/db/pool.py; the server cancels the
  statement at its statement_timeout, but that answer cannot arrive either) unless TCP keepalive or
  retransmission gives the connection up first, and new connections wait out the pool's acquire
  timeout. On the server's side the replica's sessions linger until PostgreSQL notices them gone.
- `partition_clients(port)`: packets between the host and the replica's port are dropped both ways.
  Clients' requests time out while the replica runs on; the jobs it leased to them are neither acked
  nor renewed, and their leases expire.
- `delay(ms, jitter_ms)`: latency added to every packet each way on the veth pair (a round trip gains
  twice `ms`), made with tc's netem qdisc. Where the kernel has no netem (`netem_available()` is False:
  tc answers "Specified qdisc kind is unknown"), `delay()` raises, and the caller puts a `Relay` in
  each path to delay instead: a TCP relay that holds every chunk it forwards for its `delay` seconds.

A sandbox is brought up by `up()` (which first removes a namespace and veth of the same name left by a
run that crashed) and taken down by `down()`, which is also registered with `atexit`, so that a run
ended by an exception or Ctrl-C leaves nothing behind; `fault()` applies one fault for a bounded time.
Processes started in the namespace are the caller's to stop before `down()`.

A Relay (with no delay) also serves a PostgreSQL that listens on loopback alone: listening on
`host_addr`, it passes the replica's connections on to 127.0.0.1. With a Relay in the replica's path to
PostgreSQL, the port to give `partition_database` is the Relay's, the one the replica connects to.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Literal, get_args

TABLE = "jobq_chaos"  # the namespace's nftables table, holding every partition
NS_DEVICE = "veth0"  # the namespace's end of the veth pair
MAX_NAME = 13  # a network device's name has at most 15 characters, and the host's end is NAME-h

FaultKind = Literal["partition_database", "partition_clients", "delay"]


def available() -> str | None:
    """None when this machine can make sandboxes, else what is missing and how to install it."""
    if os.geteuid() != 0:
        return "network faults need root (network namespaces and nftables)"
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    if missing:
        return f"network faults need {' and '.join(missing)} (apt-get install nftables iproute2)"
    return None


@functools.cache
def netem_available() -> bool:
    """Whether tc accepts a netem qdisc, tried once, on the loopback of a namespace made for the try (it
    goes with the process)."""
    probe = ["unshare", "--net", "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def _run(argv: list[str], stdin: str | None = None) -> None:
    """Run one of ip, nft or tc; its complaint, if it fails, in the error."""
    try:
        subprocess.run(argv, check=True, capture_output=True, text=True, input=stdin)
    except subprocess.CalledProcessError as error:
        raise RuntimeError(f"{' '.join(argv)}: {error.stderr.strip()}") from error


class Sandbox:
    """A network namespace joined to the host by a veth pair, where a replica runs and faults are made
    (the module's docstring); a context manager that brings it up and takes it down."""

    def __init__(self, name: str = "jobq-chaos", index: int = 0) -> None:
        if not 0 < len(name) <= MAX_NAME:
            raise ValueError(f"a sandbox's name has 1 to {MAX_NAME} characters: {name!r}")
        if not 0 <= index <= 255:
            raise ValueError(f"a sandbox's index is 0 to 255: {index}")
        self.name = name
        self.index = index
        self.host_device = f"{name}-h"
        self.host_addr = f"10.213.{index}.1"
        self.ns_addr = f"10.213.{index}.2"
        self._is_up = False
        self._delayed = False
        self._lock = threading.Lock()  # heal() may come from fault()'s timer while a fault is applied

    def __enter__(self) -> Sandbox:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> Sandbox:
        if self._is_up:
            return self
        self._remove()
        atexit.register(self.down)
        _run(["ip", "netns", "add", self.name])
        peer = ["peer", "name", NS_DEVICE, "netns", self.name]
        _run(["ip", "link", "add", self.host_device, "type", "veth", *peer])
        _run(["ip", "addr", "add", f"{self.host_addr}/30", "dev", self.host_device])
        _run(["ip", "link", "set", self.host_device, "up"])
        _run(["ip", "-n", self.name, "addr", "add", f"{self.ns_addr}/30", "dev", NS_DEVICE])
        _run(["ip", "-n", self.name, "link", "set", NS_DEVICE, "up"])
        _run(["ip", "-n", self.name, "link", "set", "lo", "up"])
        self._nft(
            f"table inet {TABLE} {{\n"
            "  chain input { type filter hook input priority filter; policy accept; }\n"
            "  chain output { type filter hook output priority filter; policy accept; }\n"
            "}\n"
        )
        self._is_up = True
        return self

    def down(self) -> None:
        atexit.unregister(self.down)
        self._remove()
        self._is_up = self._delayed = False

    def _remove(self) -> None:
        """Delete the host's end of the veth pair (its qdisc and the namespace's end go with it: left to
        the namespace's deletion, the pair lingers a while after), then the namespace."""
        if Path("/sys/class/net", self.host_device).exists():
            _run(["ip", "link", "del", self.host_device])
        if Path("/run/netns", self.name).exists():
            _run(["ip", "netns", "del", self.name])

    def command(self, argv: list[str]) -> list[str]:
        """`argv` to run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def _nft(self, script: str) -> None:
        _run(self.command(["nft", "-f", "-"]), stdin=script)

    def partition_database(self, port: int) -> None:
        """Drop the packets between the namespace and the host's TCP `port`."""
        with self._lock:
            self._nft(
                f"add rule inet {TABLE} output ip daddr {self.host_addr} tcp dport {port} drop\n"
                f"add rule inet {TABLE} input ip saddr {self.host_addr} tcp sport {port} drop\n"
            )

    def partition_clients(self, port: int) -> None:
        """Drop the packets between the host and the namespace's TCP `port`."""
        with self._lock:
            self._nft(
                f"add rule inet {TABLE} input ip saddr {self.host_addr} tcp dport {port} drop\n"
                f"add rule inet {TABLE} output ip daddr {self.host_addr} tcp sport {port} drop\n"
            )

    def delay(self, ms: float, jitter_ms: float = 0) -> None:
        """Delay every packet on the veth pair by `ms` (± `jitter_ms`) each way, with netem."""
        if not netem_available():
            raise RuntimeError(
                "this kernel has no netem qdisc (sch_netem) to delay packets with: "
                "route the traffic through a chaos.network.Relay and set its delay instead"
            )
        netem = ["netem", "delay", f"{ms}ms", *([f"{jitter_ms}ms"] if jitter_ms else [])]
        with self._lock:
            self._delayed = True
            _run(["tc", "qdisc", "replace", "dev", self.host_device, "root", *netem])
            _run(self.command(["tc", "qdisc", "replace", "dev", NS_DEVICE, "root", *netem]))

    def heal(self) -> None:
        """Remove every partition and delay."""
        with self._lock:
            self._nft(f"flush table inet {TABLE}\n")
            if self._delayed:
                _run(["tc", "qdisc", "del", "dev", self.host_device, "root"])
                _run(self.command(["tc", "qdisc", "del", "dev", NS_DEVICE, "root"]))
                self._delayed = False

    @contextlib.contextmanager
    def fault(self, kind: FaultKind, seconds: float, **arguments: float) -> Iterator[None]:
        """Apply the fault `kind` (the method of that name, given `arguments`) for the block, healed when
        the block ends or after `seconds`, whichever is first: a block held up (by a hung request, say)
        does not prolong the fault."""
        if kind not in get_args(FaultKind):
            raise ValueError(f"no such fault: {kind!r}; the faults are {', '.join(get_args(FaultKind))}")
        timer = threading.Timer(seconds, self.heal)
        timer.daemon = True
        try:
            getattr(self, kind)(**arguments)
            timer.start()
            yield
        finally:
            timer.cancel()
            self.heal()


CHUNK = 64 * 1024
HELD_CHUNKS = 256  # per direction: a receiver slower than its sender holds the sender back beyond this


class Relay:
    """A TCP relay from `listen` to `upstream` (port 0: any free port, then `port`) that forwards bytes
    both ways in order, each chunk held until `delay` seconds after it was read; the end of a stream
    too. `delay` may be changed while it runs; a chunk keeps the delay it was read under (and waits for
    those read before it). It runs its own event loop in a thread, so that a caller blocked (a service
    starting up) does not stop its traffic."""

    def __init__(self, listen: tuple[str, int], upstream: tuple[str, int], delay: float = 0.0) -> None:
        self.listen = listen
        self.upstream = upstream
        self.delay = delay
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="relay", daemon=True)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    def __enter__(self) -> Relay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Relay:
        self._thread.start()
        serving = asyncio.start_server(self._connection, *self.listen)
        self._server = asyncio.run_coroutine_threadsafe(serving, self._loop).result(10)
        return self

    @property
    def port(self) -> int:
        assert self._server is not None, "the relay is not started"
        return self._server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        """Stop listening and close every connection through the relay."""

        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for connection in self._connections:
                connection.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _connection(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        writers = [client_w]
        try:
            server_r, server_w = await asyncio.open_connection(*self.upstream)
            writers.append(server_w)
            async with asyncio.TaskGroup() as group:
                for reader, writer in ((client_r, server_w), (server_r, client_w)):
                    held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(HELD_CHUNKS)
                    group.create_task(self._hold(reader, held))
                    group.create_task(self._release(held, writer))
        except* OSError:  # a side refused, reset or gone: the other is closed too
            pass
        finally:
            for writer in writers:
                writer.close()
            self._connections.discard(task)

    async def _hold(self, reader: asyncio.StreamReader, held: asyncio.Queue[tuple[float, bytes]]) -> None:
        """Read chunks, each with the time it is due; the end of the stream as an empty chunk."""
        while True:
            chunk = await reader.read(CHUNK)
            await held.put((self._loop.time() + self.delay, chunk))
            if not chunk:
                return

    async def _release(self, held: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter) -> None:
        while True:
            due, chunk = await held.get()
            while (wait := due - self._loop.time()) > 0:
                await asyncio.sleep(wait)
            if not chunk:
                writer.write_eof()
                return
            writer.write(chunk)
            await writer.drain()
