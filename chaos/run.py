"""`make chaos`: jobq under faults, its whole history checked afterwards.

    python -m chaos.run --scenario mixed --seconds 120 [--seed N] [--out chaos/results]

A run makes its own PostgreSQL (chaos/system.py) and three jobq replicas, one of them in a network
namespace when the machine allows it (chaos/network.py); the clients (chaos/workload.py) load them while
the nemesis injects the scenario's faults, one at a time, each for a few seconds, with quiet seconds
between. Then every fault is healed, the schedule paused and the producers stopped; the workers drain
what is left (at most a minute), and the checker (chaos/checker.py) reads the history and the database.
The history (history.jsonl) and the report (report.json) are written to `--out`; the exit status is 1
when any promise was broken, 2 when the run itself could not be made.

Scenarios, each fault bounded in time and undone by the nemesis itself:

- kill: SIGKILL of a replica, started again a second later;
- pause: SIGSTOP of a replica for longer than the visibility timeout, then SIGCONT (its workers' leases
  expire while they think they hold them);
- restart: PostgreSQL restarted, fast and immediate (a crash and WAL recovery);
- partition: the namespaced replica cut from PostgreSQL, and its clients cut from it;
- delay: 100 ms each way between the namespaced replica and PostgreSQL;
- mixed: all of the above, in turn;
- failover: PostgreSQL under pg_auto_failover (a monitor, two nodes, synchronous replication), the
  primary's machine lost mid-run;
- patroni: PostgreSQL under Patroni (three etcd members, two nodes, synchronous mode): a switchover,
  then the primary's machine lost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.checker import Final, check
from chaos.history import History
from chaos.system import Postgres, Replica, missing
from chaos.workload import QUEUES, SCHEDULES, VISIBILITY, Mix, Workload, final_state, unfinished

HOLD = 4.0  # seconds each fault lasts
QUIET = 3.0  # seconds between faults
SETTINGS = {
    "JOBQ_STATEMENT_TIMEOUT": "5",
    "JOBQ_POOL_ACQUIRE_TIMEOUT": "2",
    "JOBQ_WAKEUP_SAFETY_INTERVAL": "1",
    "JOBQ_EXPIRE_INTERVAL": "0.5",
    "JOBQ_METRICS_INTERVAL": "60",
    "JOBQ_ACCESS_LOG": "false",
}
LOCAL = ("kill", "pause", "restart-fast", "restart-immediate")
NETWORK = ("partition-db", "partition-clients", "delay")
SCENARIOS: dict[str, tuple[str, ...]] = {
    "kill": ("kill",),
    "pause": ("pause",),
    "restart": ("restart-fast", "restart-immediate"),
    "partition": ("partition-db", "partition-clients"),
    "delay": ("delay",),
    "mixed": LOCAL + NETWORK,
    "failover": ("failover",),
    "patroni": ("switchover", "failover"),
}


@dataclass
class Run:
    """The system under test, and what the nemesis did to it."""

    root: Path
    postgres: Postgres | None
    dsn: str
    replicas: list[Replica]
    random: random.Random
    sandbox: Any = None  # a network.Sandbox holding one replica
    relay: Any = None  # a network.Relay between the namespaced replica and PostgreSQL, without netem
    cluster: Any = None  # a failover cluster (pg_auto_failover or Patroni)
    faults: list[dict[str, Any]] = field(default_factory=list)

    @property
    def namespaced(self) -> Replica | None:
        return next((r for r in self.replicas if r.launch), None)


async def inject(run: Run, fault: str) -> None:
    """One fault, held for HOLD seconds (a pause: longer than the visibility timeout), then undone."""
    started = time.time()
    entry: dict[str, Any] = {"fault": fault, "at": started}
    if fault == "kill":
        replica = run.random.choice(run.replicas)
        entry["replica"] = replica.name
        replica.kill()
        await asyncio.sleep(1.0)
        await asyncio.to_thread(replica.start)
    elif fault == "pause":
        replica = run.random.choice(run.replicas)
        entry["replica"] = replica.name
        replica.pause()
        await asyncio.sleep(VISIBILITY + 1.5)
        replica.resume()
    elif fault.startswith("restart-"):
        assert run.postgres is not None
        await asyncio.to_thread(run.postgres.stop, fault.removeprefix("restart-"))
        await asyncio.sleep(1.0)
        await asyncio.to_thread(run.postgres.start)
    elif fault in NETWORK:
        await _network(run, fault)
    elif fault == "switchover":
        entry["primary"] = await run.cluster.switchover()
    elif fault == "failover":
        old = await run.cluster.primary()
        run.cluster.lose(old)
        entry["lost"] = old
        entry["primary"] = await run.cluster.wait_primary(old, timeout=120)
    entry["seconds"] = round(time.time() - started, 2)
    run.faults.append(entry)


async def _network(run: Run, fault: str) -> None:
    sandbox, replica = run.sandbox, run.namespaced
    assert sandbox is not None and replica is not None
    port = run.relay.port if run.relay else run.postgres.port  # type: ignore[union-attr]
    try:
        if fault == "partition-db":
            sandbox.partition_database(port)
        elif fault == "partition-clients":
            sandbox.partition_clients(replica.port)
        elif run.relay is not None:
            run.relay.delay = 0.1
        else:
            sandbox.delay(100)
        await asyncio.sleep(HOLD)
    finally:
        sandbox.heal()
        if run.relay is not None:
            run.relay.delay = 0.0


async def nemesis(run: Run, faults: tuple[str, ...], seconds: float) -> None:
    order = list(faults)
    run.random.shuffle(order)
    deadline = time.monotonic() + seconds
    await asyncio.sleep(QUIET)
    n = 0
    while time.monotonic() < deadline:
        await inject(run, order[n % len(order)])
        n += 1
        await asyncio.sleep(QUIET)


async def drain(workload: Workload, tasks: list[asyncio.Task], dsn: str, timeout: float = 60) -> float:
    """Producers stopped and the schedule paused, the workers work until no job is left unfinished;
    the seconds it took."""
    workload.producing.clear()
    await workload.pause_schedule()
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        with contextlib.suppress(OSError, Exception):
            if await unfinished(dsn) == 0:
                break
        await asyncio.sleep(1.0)
    await workload.stop(tasks)
    return time.monotonic() - started


async def build(scenario: str, root: Path, seed: int, replicas: int) -> Run:
    faults = SCENARIOS[scenario]
    if scenario in ("failover", "patroni"):
        cluster = await _cluster(scenario, root)
        run = Run(root, None, cluster.dsn, [], random.Random(seed), cluster=cluster)
    else:
        postgres = Postgres(root / "postgres")
        await asyncio.to_thread(postgres.init)
        run = Run(root, postgres, postgres.dsn, [], random.Random(seed))
    settings = dict(SETTINGS)
    if run.cluster is not None:
        settings["JOBQ_LISTEN_URL"] = run.dsn
    for n in range(replicas):
        run.replicas.append(Replica(f"r{n}", run.dsn, settings, log=root / f"r{n}.log"))
    if set(faults) & set(NETWORK):
        _namespace(run, settings)
    for replica in run.replicas:
        await asyncio.to_thread(replica.start)
    return run


def _namespace(run: Run, settings: dict[str, str]) -> None:
    """The last replica moves into a network namespace, reaching PostgreSQL through the veth (and through a
    delaying relay when the kernel has no netem)."""
    from chaos import network

    why = network.available()
    if why is not None:
        raise SystemExit(f"chaos: the network faults need {why}")
    assert run.postgres is not None
    sandbox = network.Sandbox("jobq-chaos", index=7)
    sandbox.up()
    run.sandbox = sandbox
    port = run.postgres.port
    if not network.netem_available():
        run.relay = network.Relay(listen=(sandbox.host_addr, 0), upstream=("127.0.0.1", port))
        run.relay.start()
        port = run.relay.port
    dsn = f"postgresql://postgres@{sandbox.host_addr}:{port}/jobq"
    last = run.replicas[-1]
    # Listening beyond loopback without tokens, which jobq refuses unless told: the namespace's address is
    # reachable from this machine alone.
    insecure = {**settings, "JOBQ_ALLOW_INSECURE": "true"}
    run.replicas[-1] = Replica(
        last.name, dsn, insecure, host=sandbox.ns_addr, launch=sandbox.command([]), log=last.log
    )


async def _cluster(scenario: str, root: Path) -> Any:
    if scenario == "patroni":
        from chaos.patroni import PatroniCluster

        cluster = PatroniCluster(root / "patroni")
    else:
        from chaos.autofailover import AutoFailoverCluster

        cluster = AutoFailoverCluster(root / "autofailover")
    await cluster.up()
    return cluster


def teardown(run: Run) -> None:
    for replica in run.replicas:
        with contextlib.suppress(Exception):
            replica.stop()
    if run.relay is not None:
        run.relay.stop()
    if run.sandbox is not None:
        run.sandbox.down()
    if run.cluster is not None:
        run.cluster.down()
    if run.postgres is not None:
        run.postgres.destroy()


async def chaos(scenario: str, seconds: float, seed: int, out: Path, replicas: int = 3) -> dict[str, Any]:
    """One run; its report (also written to `out`)."""
    out.mkdir(parents=True, exist_ok=True)
    history = History()
    with tempfile.TemporaryDirectory(prefix="jobq-chaos-", ignore_cleanup_errors=True) as tmp:
        root = Path(tmp)
        root.chmod(0o777)
        run = await build(scenario, root, seed, replicas)
        try:
            workload = Workload(history, lambda n: run.replicas[n % len(run.replicas)].url, Mix(), seed)
            await workload.configure()
            tasks = workload.start()
            started = time.monotonic()
            await nemesis(run, SCENARIOS[scenario], seconds)
            loaded = time.monotonic() - started
            drained = await drain(workload, tasks, run.dsn)
            jobs = await final_state(run.dsn)
        finally:
            logs = {r.name: _tail(r.log) for r in run.replicas if r.log}
            teardown(run)
    final = Final(jobs, QUEUES, SCHEDULES)
    report = check(history, final)
    summary = {
        "scenario": scenario,
        "seed": seed,
        "seconds": round(loaded, 1),
        "drained_in": round(drained, 1),
        "jobs": len(jobs),
        "faults": run.faults,
        **report.summary(),
    }
    history.write(out / "history.jsonl")
    (out / "report.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(report.text())
    if not report.ok:
        for name, tail in logs.items():
            print(f"--- {name}, last lines of its log:\n{tail}")
    summary["ok"] = report.ok
    return summary


def _tail(path: Path | None, lines: int = 20) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path else ""
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.run", description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="mixed")
    parser.add_argument("--seconds", type=float, default=120.0, help="how long faults are injected")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    why = missing()
    if why is not None:
        print(f"chaos: {why}", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    summary = asyncio.run(chaos(args.scenario, args.seconds, seed, args.out, args.replicas))
    print(f"seed {seed}; history and report in {args.out}")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
