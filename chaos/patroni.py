"""A Patroni cluster on one machine, for chaos runs and tests: three etcd members and two PostgreSQL 15
nodes managed by Patroni, on local ports, every file under one directory.

Choices, and why:

- The DCS is etcd through Patroni's `etcd3` section. Debian's etcd-server is etcd 3.4, which serves the v2
  API only when started with `--enable-v2` (off by default) and whose v2 store is deprecated (etcd 3.6
  drops it). Patroni's `etcd3` module speaks the v3 API through etcd's gRPC gateway (JSON over HTTP, at
  `/v3` from etcd 3.4) with its own urllib3 client, so no gRPC package is needed; it still imports
  python-etcd (Debian's python3-etcd) for the error classes it shares with the v2 module.
- `synchronous_mode: true`: Patroni names the replica in `synchronous_standby_names`, so the primary
  acknowledges a commit only once the replica has flushed it, and only the node recorded in the DCS as
  the synchronous standby may be promoted. The new primary therefore holds every acknowledged commit: a
  failover loses none.
- `synchronous_mode_strict: false`: with its replica gone, the primary empties `synchronous_standby_names`
  and takes writes alone, as does a replica promoted after its primary was lost (a lost node stays down).
  Strict mode would make every commit wait for a standby that never comes back. The price: what is
  committed while a node is alone is on that node only.
- `ttl: 10, loop_wait: 1, retry_timeout: 3`, quickened from 30, 10 and 10 so that a failover takes seconds:
  the leader key expires 10 s after a lost primary last renewed it, and the replica takes it within a loop.
  Patroni's rule `loop_wait + 2 * retry_timeout <= ttl` (7 <= 10) lets a primary that cannot reach etcd
  give up its role before its key can expire and another node be promoted.
- `maximum_lag_on_failover: 1 MiB` (Patroni's default): the synchronous standby is never behind an
  acknowledged commit, only behind WAL in flight, which under load stays far below it; a larger bound
  would only let a stale asynchronous replica be promoted, which synchronous mode forbids anyway.
- etcd's heartbeat and election timeout are doubled (200 ms, 2 s) so that a machine busy for a second does
  not set off an etcd election, during which Patroni's requests would wait.

PostgreSQL will not run as root: Patroni (and with it PostgreSQL) runs as the postgres user when this
process is root, started as that user directly rather than through `runuser`, which, sent SIGTERM, kills
its child with SIGKILL two seconds later and would cut short Patroni's shutdown of PostgreSQL.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from chaos.system import PG_BIN, free_port, tail, until

NODES = ("node1", "node2")
ETCD_MEMBERS = ("etcd1", "etcd2", "etcd3")
TIMINGS = {"ttl": 10, "loop_wait": 1, "retry_timeout": 3}
MAXIMUM_LAG_ON_FAILOVER = 1 << 20
HBA = [
    "local all all trust",
    "local replication all trust",
    "host all all 127.0.0.1/32 trust",
    "host replication all 127.0.0.1/32 trust",
]
PROBE_ERRORS = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError)  # TimeoutError is an OSError


def missing_packages() -> list[str]:
    """The Debian packages this machine lacks for a PatroniCluster."""
    missing = [
        package
        for tool, package in (("patroni", "patroni"), ("etcd", "etcd-server"))
        if not shutil.which(tool)
    ]
    if not (PG_BIN / "pg_ctl").exists():
        missing.append("postgresql-15")
    if shutil.which("patroni"):
        found = subprocess.run(["/usr/bin/python3", "-c", "import etcd"], capture_output=True, check=False)
        if found.returncode != 0:
            missing.append("python3-etcd")
    return missing


def check_timings(timings: dict[str, int]) -> None:
    """Patroni's rule for its timings: a leader retries etcd for up to `retry_timeout`, twice, between
    loops; it must have given up its role before its key (`ttl`) expires."""
    if timings["loop_wait"] + 2 * timings["retry_timeout"] > timings["ttl"]:
        raise ValueError(f"loop_wait + 2 * retry_timeout must not exceed ttl: {timings}")


class PatroniCluster:
    """Three etcd members and two Patroni nodes (`node1`, `node2`) on local ports, with their data and
    logs under `root` (which the postgres user must be able to write in). `port()` hands out its ten
    ports; the default, the kernel's pick, may be taken by an outgoing connection before the server
    binds it, so a caller with ports set aside (the tests' `free_port`) passes its own."""

    def __init__(self, root: Path, port: Callable[[], int] = free_port) -> None:
        check_timings(TIMINGS)
        self.root = root
        self.ports = {name: port() for name in NODES}  # PostgreSQL's
        self.api_ports = {name: port() for name in NODES}  # Patroni's REST API
        self.etcd_ports = {name: port() for name in ETCD_MEMBERS}  # clients'
        self.peer_ports = {name: port() for name in ETCD_MEMBERS}  # etcd members' own
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        hosts = ",".join(f"127.0.0.1:{self.ports[name]}" for name in NODES)
        self.dsn = f"postgresql://postgres@{hosts}/jobq?target_session_attrs=read-write"

    def node_dsn(self, name: str) -> str:
        """The `jobq` database on one node, whatever its role."""
        return f"postgresql://postgres@127.0.0.1:{self.ports[name]}/jobq"

    def api_url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.api_ports[name]}"

    def data_dir(self, name: str) -> Path:
        return self.root / name

    # --- bring-up ------------------------------------------------------------------------------------

    async def up(self) -> None:
        """etcd, then both nodes at once: one bootstraps (initdb, then `CREATE DATABASE jobq` as its
        post_bootstrap) and leads, the other clones it with pg_basebackup and follows. Returns once the
        leader takes writes and the other streams to it as its synchronous standby. `root` is made if
        missing, writable by all (the postgres user makes the data directories in it)."""
        if not self.root.exists():
            self.root.mkdir(parents=True)
            self.root.chmod(0o777)
        for member in ETCD_MEMBERS:
            self.start(member, self.etcd_command(member), as_postgres=False)
        try:
            await until(self.etcd_healthy, timeout=60, every=0.2, what="etcd's members report healthy")
            for name in NODES:
                config = self.root / f"patroni-{name}.yml"
                config.write_text(json.dumps(self.patroni_config(name), indent=2))  # JSON is YAML
                self.start(name, [shutil.which("patroni") or "patroni", str(config)], as_postgres=True)
            await self.wait_replicating(timeout=240)
        except TimeoutError as failed:
            raise TimeoutError(f"{failed}\n{await self.story()}") from None

    def etcd_command(self, member: str) -> list[str]:
        peers = ",".join(f"{m}=http://127.0.0.1:{self.peer_ports[m]}" for m in ETCD_MEMBERS)
        client, peer = (
            f"http://127.0.0.1:{self.etcd_ports[member]}",
            f"http://127.0.0.1:{self.peer_ports[member]}",
        )
        return [
            shutil.which("etcd") or "etcd",
            *("--name", member, "--data-dir", str(self.root / member)),
            *("--listen-client-urls", client, "--advertise-client-urls", client),
            *("--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer),
            *("--initial-cluster", peers, "--initial-cluster-state", "new"),
            *("--initial-cluster-token", f"jobq-chaos-{self.peer_ports[ETCD_MEMBERS[0]]}"),
            *("--heartbeat-interval", "200", "--election-timeout", "2000", "--logger", "zap"),
        ]

    def patroni_config(self, name: str) -> dict[str, Any]:
        address = f"127.0.0.1:{self.ports[name]}"
        api = f"127.0.0.1:{self.api_ports[name]}"
        return {
            "scope": "jobq",
            "namespace": "/chaos/",
            "name": name,
            "log": {"level": "INFO"},
            "restapi": {"listen": api, "connect_address": api},
            "etcd3": {"hosts": [f"127.0.0.1:{port}" for port in self.etcd_ports.values()]},
            "bootstrap": {
                "dcs": {
                    **TIMINGS,
                    "maximum_lag_on_failover": MAXIMUM_LAG_ON_FAILOVER,
                    "synchronous_mode": True,
                    "synchronous_mode_strict": False,
                    # A former primary whose timeline has diverged is rewound rather than cloned anew
                    # (Patroni always sets wal_log_hints, which pg_rewind needs).
                    "postgresql": {"use_pg_rewind": True, "use_slots": True},
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C.UTF-8"}],
                "pg_hba": HBA,
                "post_bootstrap": f"{PG_BIN / 'psql'} -qX -c 'CREATE DATABASE jobq'",
            },
            "postgresql": {
                "listen": address,
                "connect_address": address,
                "data_dir": str(self.data_dir(name)),
                "bin_dir": str(PG_BIN),
                "pgpass": str(self.root / f"{name}.pgpass"),
                "authentication": {
                    role: {"username": "postgres"} for role in ("superuser", "replication", "rewind")
                },
                "pg_hba": HBA,
                "parameters": {"unix_socket_directories": str(self.root)},
                "basebackup": {"checkpoint": "fast"},  # not a spread checkpoint of minutes on the leader
            },
            "watchdog": {"mode": "off"},
        }

    def start(self, name: str, command: list[str], as_postgres: bool) -> None:
        """`command` in a session (and process group) of its own, so that SIGKILL to the group is a lost
        machine; its output in `<root>/<name>.log`."""
        user = "postgres" if as_postgres and os.geteuid() == 0 else None
        env = {"PATH": f"{PG_BIN}:/usr/bin:/bin", "LC_ALL": "C.UTF-8", "HOME": str(self.root)}
        with open(self.root / f"{name}.log", "ab") as log:
            self.processes[name] = subprocess.Popen(
                command,
                cwd=self.root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                user=user,
                group=user,
                extra_groups=[] if user else None,
            )

    async def etcd_healthy(self) -> bool:
        async with httpx.AsyncClient(timeout=2) as http:
            for port in self.etcd_ports.values():
                try:
                    r = await http.get(f"http://127.0.0.1:{port}/health")
                except httpx.HTTPError:
                    return False
                if r.status_code != 200 or r.json().get("health") != "true":
                    return False
        return True

    # --- state ---------------------------------------------------------------------------------------

    async def members(self) -> list[dict[str, Any]]:
        """Patroni's view of the cluster (`GET /cluster`) from the first node whose REST API answers:
        each member's name, role (`leader`, `sync_standby`, `replica`), state, timeline and lag. Empty if
        no node answers."""
        async with httpx.AsyncClient(timeout=3) as http:
            for name in NODES:
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    r = await http.get(f"{self.api_url(name)}/cluster")
                    if r.status_code == 200:
                        return list(r.json()["members"])
        return []

    async def primary(self) -> str:
        """The leader's name, as Patroni records it in etcd. Between a primary's loss and the expiry of
        its key that is still the lost node; `wait_primary` says which node takes writes."""
        leaders = [m["name"] for m in await self.members() if m["role"] == "leader"]
        if not leaders:
            raise LookupError(f"no leader\n{await self.story()}")
        return str(leaders[0])

    async def takes_writes(self, name: str) -> bool:
        """The node's `jobq` database commits a transaction that has a transaction id: it is a primary,
        and (in synchronous mode) its standby, if it names one, confirms the commit."""
        try:
            conn = await asyncpg.connect(self.node_dsn(name), timeout=2)
        except PROBE_ERRORS:
            return False
        try:
            if await conn.fetchval("SELECT pg_is_in_recovery()", timeout=2):
                return False
            return bool(await conn.fetchval("SELECT txid_current()", timeout=3))
        except PROBE_ERRORS:
            return False
        finally:
            conn.terminate()

    async def streaming(self, leader: str) -> set[str]:
        """The names of the standbys streaming to `leader` as synchronous standbys."""
        try:
            conn = await asyncpg.connect(self.node_dsn(leader), timeout=2)
        except PROBE_ERRORS:
            return set()
        try:
            rows = await conn.fetch(
                "SELECT application_name FROM pg_stat_replication"
                " WHERE state = 'streaming' AND sync_state = 'sync'",
                timeout=2,
            )
            return {row["application_name"] for row in rows}
        except PROBE_ERRORS:
            return set()
        finally:
            conn.terminate()

    async def replicating(self) -> bool:
        """Both nodes serve: one leads and takes writes, the other is its synchronous standby in Patroni's
        records and streams to it. Only then can either node take over without losing a commit."""
        members = {m["name"]: m for m in await self.members()}
        roles = {name: (m["role"], m["state"]) for name, m in members.items()}
        leaders = [name for name, role in roles.items() if role == ("leader", "running")]
        standbys = {name for name, role in roles.items() if role == ("sync_standby", "running")}
        if len(leaders) != 1 or standbys | set(leaders) != set(NODES):
            return False
        return standbys <= await self.streaming(leaders[0]) and await self.takes_writes(leaders[0])

    async def wait_replicating(self, timeout: float) -> None:
        """Until `replicating()`: after `up`, and after a switchover once the old leader has come back as
        the new one's standby. Before then, losing the primary leaves no node that may be promoted."""
        await until(self.replicating, timeout, every=0.5, what="a leader and its streaming sync standby")

    async def wait_primary(self, not_name: str, timeout: float) -> str:
        """Until a node other than `not_name` takes writes; its name."""

        async def writable() -> str | None:
            for name in NODES:
                if name != not_name and await self.takes_writes(name):
                    return name
            return None

        return await until(writable, timeout, every=0.1, what=f"a node other than {not_name} takes writes")

    # --- faults --------------------------------------------------------------------------------------

    async def switchover(self, timeout: float = 180) -> str:
        """A planned switchover from the leader to the other node (Patroni's `POST /switchover`), once the
        other streams as its synchronous standby (Patroni refuses any other candidate in synchronous
        mode); the new leader's name once it takes writes. The old leader shuts PostgreSQL down, then
        follows the new one; `wait_replicating` says when it does."""
        await self.wait_replicating(timeout)
        leader = await self.primary()
        candidate = next(name for name in NODES if name != leader)
        async with httpx.AsyncClient(timeout=60) as http:
            r = await http.post(
                f"{self.api_url(leader)}/switchover", json={"leader": leader, "candidate": candidate}
            )
        if r.status_code != 200 and r.status_code != 503:  # 503: Patroni stopped waiting for the outcome
            raise RuntimeError(f"switchover to {candidate} refused: {r.status_code} {r.text}")
        return await self.wait_primary(leader, timeout)

    def lose(self, name: str) -> None:
        """The node's machine is gone: its Patroni and its PostgreSQL killed at once with SIGKILL. Patroni
        starts PostgreSQL in a session of its own, so that is two process groups (and any third that a
        postmaster being started at the moment has)."""
        groups = self.groups(name)
        for group in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)

    def groups(self, name: str) -> set[int]:
        """The process groups of a node: Patroni's, and those of the processes working on its data
        directory (the postmaster and its children, pg_basebackup, pg_rewind)."""
        groups = set()
        process = self.processes.get(name)
        if process is not None and process.poll() is None:
            groups.add(process.pid)
        for pid in self.pids_using(self.data_dir(name)):
            with contextlib.suppress(ProcessLookupError):
                groups.add(os.getpgid(pid))
        return groups

    @staticmethod
    def pids_using(data_dir: Path) -> Iterable[int]:
        """The processes with `data_dir`, or a file in it, among their arguments."""
        inside = f"{data_dir}/"
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
                if any(
                    arg == str(data_dir) or arg.startswith(inside) or arg.endswith(f"={data_dir}")
                    for arg in args
                ):
                    yield int(entry.name)

    # --- shutdown ------------------------------------------------------------------------------------

    def down(self, timeout: float = 30) -> None:
        """Everything stopped: both Patronis sent SIGTERM together (each stops its PostgreSQL; one at a
        time, the other would fail over first), then etcd's members one after another (stopped together,
        their leader waited 9 s for peers already gone). Whatever is left after `timeout` seconds gets
        SIGKILL, and so does a PostgreSQL left behind by a Patroni that did not stop it. Calling it again
        does nothing more."""
        self.stop([name for name in NODES if name in self.processes], timeout)
        for name in NODES:
            self.lose(name)
        for member in ETCD_MEMBERS:
            if member in self.processes:
                self.stop([member], timeout)

    def stop(self, names: list[str], timeout: float) -> None:
        """SIGTERM to the process groups of `names`, then SIGKILL to those left after `timeout` seconds."""
        for name in names:
            if self.processes[name].poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.processes[name].pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for name in names:
            process = self.processes[name]
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    # --- diagnosis -----------------------------------------------------------------------------------

    async def story(self) -> str:
        """Patroni's view of each node, whether each takes writes, and the end of each process's log (with
        PostgreSQL's own output in its node's): why a cluster did not come up or fail over."""
        members = await self.members()
        told = [f"  {m}" for m in members] or ["  no node's REST API answered"]
        for name in NODES:
            told.append(f"  {name} takes writes: {await self.takes_writes(name)}")
        for name, process in self.processes.items():
            told += [
                f"--- {name}.log (exit code {process.poll()}), last lines:",
                *tail(self.root / f"{name}.log", 30),
            ]
        return "\n".join(told)
