"""`make chaos`: jobq under faults, its whole history checked afterwards.

    python -m chaos.run --scenario mixed --seconds 120 [--seed N] [--out chaos/results] [--record]
    python -m chaos.run --check chaos/results [--record]     # a run's history checked again

A run makes its own PostgreSQL (chaos/system.py) and three jobq replicas, one of them in a network
namespace when the machine allows it (chaos/network.py); the clients (chaos/workload.py) load them while
the nemesis injects the scenario's faults, one at a time, each for a few seconds, with quiet seconds
between. Then every fault is healed, the schedule paused and the producers stopped; the workers drain
what is left (at most a minute), and the checker (chaos/checker.py) reads the history and the database.
The history (history.jsonl), the database's final state (final.json) and the report (report.json) are
written to `--out`, and with `--record` the report's summary to docs/data/chaos.json, where the
documentation's page on faults reads it. The exit status is 1 when any promise was broken, 2 when the run
itself could not be made. Network faults need root, `ip` and `nft`: without them a run leaves those
faults out and says so, except under CI=true, where it stops.

Scenarios, each fault bounded in time and undone by the nemesis itself:

- none: load alone, the reference every other scenario is read against;
- kill: SIGKILL of a replica, started again a second later;
- pause: SIGSTOP of a replica for longer than the visibility timeout, then SIGCONT (its workers' leases
  expire while they think they hold them);
- restart: PostgreSQL restarted, fast and immediate (a crash and WAL recovery);
- partition: the namespaced replica cut from PostgreSQL, and its clients cut from it;
- delay: 100 ms each way between the namespaced replica and PostgreSQL, and between it and its clients;
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
import os
import random
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from chaos.checker import Final, check
from chaos.history import History
from chaos.system import Postgres, Replica, missing, tail
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
    "none": (),
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
    client_relay: Any = None  # and one between its clients and it
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
        entry["promoted"] = time.time()
    elif fault == "failover":
        # Only a standby in sync may be promoted: after a switchover, the old primary must follow first.
        await run.cluster.wait_replicating(120)
        old = await run.cluster.primary()
        run.cluster.lose(old)
        entry["lost"] = old
        entry["primary"] = await run.cluster.wait_primary(old, timeout=120)
        entry["promoted"] = time.time()
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
            run.relay.delay = run.client_relay.delay = 0.1
        else:
            sandbox.delay(100)
        await asyncio.sleep(HOLD)
    finally:
        sandbox.heal()
        if run.relay is not None:
            run.relay.delay = run.client_relay.delay = 0.0


async def nemesis(run: Run, faults: tuple[str, ...], seconds: float) -> None:
    """The faults in turn (shuffled) until `seconds` have passed; on a failover cluster each fault once, in
    order (a lost node stays lost), then load alone."""
    deadline = time.monotonic() + seconds
    await asyncio.sleep(QUIET)
    if run.cluster is not None:
        for fault in faults:
            await inject(run, fault)
            await asyncio.sleep(QUIET)
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))
        return
    order = list(faults)
    run.random.shuffle(order)
    n = 0
    while order and time.monotonic() < deadline:
        await inject(run, order[n % len(order)])
        n += 1
        await asyncio.sleep(QUIET)
    await asyncio.sleep(max(0.0, deadline - time.monotonic()))


def serving_again(history: History, faults: list[dict[str, Any]]) -> None:
    """For each promotion, how long after it the service answered its first enqueue (`serving_after`)."""
    for entry in faults:
        if "promoted" in entry:
            answered = [
                op.received for op in history if op.op == "enqueue" and op.ok and op.sent >= entry["promoted"]
            ]
            entry["serving_after"] = round(min(answered) - entry["promoted"], 2) if answered else None


async def drain(workload: Workload, tasks: list[asyncio.Task], dsn: str, timeout: float = 60) -> float:
    """Producers stopped and the schedule paused, the workers work until no job is left unfinished;
    the seconds it took."""
    workload.producing.clear()
    await workload.pause_schedule()
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        with contextlib.suppress(OSError, asyncpg.PostgresError):
            if await unfinished(dsn) == 0:
                break
        await asyncio.sleep(1.0)
    await workload.stop(tasks)
    return time.monotonic() - started


async def build(run: Run, scenario: str, faults: tuple[str, ...], replicas: int) -> None:
    """The system under test, into `run` as it is made, so that a failure half-way leaves teardown
    everything already started."""
    if scenario in ("failover", "patroni"):
        run.cluster = _cluster(scenario, run.root)
        await run.cluster.up()
        run.dsn = run.cluster.dsn
    else:
        run.postgres = Postgres(run.root / "postgres")
        await asyncio.to_thread(run.postgres.init)
        run.dsn = run.postgres.dsn
    settings = dict(SETTINGS)
    if run.cluster is not None:
        settings["JOBQ_LISTEN_URL"] = run.dsn
    for n in range(replicas):
        run.replicas.append(Replica(f"r{n}", run.dsn, settings, log=run.root / f"r{n}.log"))
    if set(faults) & set(NETWORK):
        _namespace(run, settings)
    for replica in run.replicas:
        await asyncio.to_thread(replica.start)


def _namespace(run: Run, settings: dict[str, str]) -> None:
    """The last replica moves into a network namespace, reaching PostgreSQL through the veth, its clients
    reaching it likewise (each through a delaying relay when the kernel has no netem)."""
    from chaos import network

    assert run.postgres is not None
    sandbox = run.sandbox = network.Sandbox("jobq-chaos", index=7)
    sandbox.up()
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
    replica = run.replicas[-1] = Replica(
        last.name, dsn, insecure, host=sandbox.ns_addr, launch=sandbox.command([]), log=last.log
    )
    if run.relay is not None:
        run.client_relay = network.Relay(listen=("127.0.0.1", 0), upstream=(sandbox.ns_addr, replica.port))
        run.client_relay.start()
        replica.url = f"http://127.0.0.1:{run.client_relay.port}"


def _cluster(scenario: str, root: Path) -> Any:
    if scenario == "patroni":
        from chaos.patroni import PatroniCluster

        return PatroniCluster(root / "patroni")
    from chaos.autofailover import AutoFailoverCluster

    return AutoFailoverCluster(root / "autofailover")


def teardown(run: Run) -> None:
    """Everything the run started, stopped, whatever state it is in; each step whatever the last did."""
    steps = [replica.stop for replica in run.replicas]
    relays = (run.relay and run.relay.stop, run.client_relay and run.client_relay.stop)
    steps += [x for x in (*relays, run.sandbox and run.sandbox.down) if x]
    steps += [x for x in (run.cluster and run.cluster.down, run.postgres and run.postgres.destroy) if x]
    for step in steps:
        try:
            step()
        except Exception as error:  # noqa: BLE001 - the next step must run
            print(f"chaos: teardown: {step}: {error!r}", file=sys.stderr)


def check_again(out: Path) -> dict[str, Any]:
    """A run's history and final state, as `chaos` wrote them to `out`, checked again (by this checker),
    its report rewritten."""
    history = History.read(out / "history.jsonl")
    jobs = {int(k): v for k, v in json.loads((out / "final.json").read_text()).items()}
    report = check(history, Final(jobs, QUEUES, SCHEDULES))
    summary = {**json.loads((out / "report.json").read_text()), **report.summary()}
    (out / "report.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(report.text())
    return {**summary, "ok": report.ok}


def faults_here(scenario: str) -> tuple[str, ...]:
    """The scenario's faults this machine can inject: without what network faults need, the others (and
    under CI=true, none: SystemExit)."""
    from chaos import network

    faults = SCENARIOS[scenario]
    why = network.available() if set(faults) & set(NETWORK) else None
    if why is None:
        return faults
    if os.environ.get("CI") == "true":
        raise SystemExit(f"chaos: {why}")
    print(f"chaos: {why}; the run leaves the network faults out", file=sys.stderr)
    return tuple(f for f in faults if f not in NETWORK)


async def chaos(scenario: str, seconds: float, seed: int, out: Path, replicas: int = 3) -> dict[str, Any]:
    """One run; its report (also written to `out`)."""
    out.mkdir(parents=True, exist_ok=True)
    faults = faults_here(scenario)
    history = History()
    with tempfile.TemporaryDirectory(prefix="jobq-chaos-", ignore_cleanup_errors=True) as tmp:
        root = Path(tmp)
        root.chmod(0o777)
        run = Run(root, None, "", [], random.Random(seed))
        try:
            await build(run, scenario, faults, replicas)
            workload = Workload(history, lambda n: run.replicas[n % len(run.replicas)].url, Mix(), seed)
            await workload.configure()
            tasks = workload.start()
            started = time.monotonic()
            await nemesis(run, faults, seconds)
            loaded = time.monotonic() - started
            drained = await drain(workload, tasks, run.dsn)
            jobs = await final_state(run.dsn)
        finally:
            logs = {r.name: "\n".join(tail(r.log, 20)) for r in run.replicas if r.log}
            await asyncio.to_thread(teardown, run)
    serving_again(history, run.faults)
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
    (out / "final.json").write_text(json.dumps({str(k): v for k, v in jobs.items()}, default=str) + "\n")
    (out / "report.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(report.text())
    if not report.ok:
        for name, lines in logs.items():
            print(f"--- {name}, last lines of its log:\n{lines}")
    summary["ok"] = report.ok
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.run", description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="mixed")
    parser.add_argument("--seconds", type=float, default=120.0, help="how long faults are injected")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--record", action="store_true", help="keep the summary in docs/data/chaos.json")
    parser.add_argument("--check", type=Path, metavar="DIR", help="check the run written to DIR again")
    args = parser.parse_args(argv)
    if args.check:
        summary = check_again(args.check)
        if args.record:
            record(summary)
        return 0 if summary["ok"] else 1
    why = missing()
    if why is not None:
        print(f"chaos: {why}", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)

    async def stoppable() -> dict[str, Any]:
        # SIGTERM (a CI job's timeout, say) cancels the run, so that it still stops what it started.
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)
        return await chaos(args.scenario, args.seconds, seed, args.out, args.replicas)

    try:
        summary = asyncio.run(stoppable())
    except asyncio.CancelledError:
        print("chaos: stopped (SIGTERM) before the end; what it had started is stopped", file=sys.stderr)
        return 2
    print(f"seed {seed}; history and report in {args.out}")
    if args.record:
        record(summary)
    return 0 if summary["ok"] else 1


RECORDED = Path(__file__).resolve().parent.parent / "docs" / "data" / "chaos.json"


def record(summary: dict[str, Any]) -> None:
    """The run's summary in docs/data/chaos.json, in place of the last one of its scenario."""
    runs = json.loads(RECORDED.read_text()) if RECORDED.exists() else {}
    kinds: dict[str, int] = {}
    for entry in summary["faults"]:
        kinds[entry["fault"]] = kinds.get(entry["fault"], 0) + 1
    runs[summary["scenario"]] = {
        "date": time.strftime("%Y-%m-%d"),
        "seed": summary["seed"],
        "seconds": summary["seconds"],
        "faults": kinds,
        "promotions": [
            {k: entry.get(k) for k in ("fault", "seconds", "serving_after")}
            for entry in summary["faults"]
            if "promoted" in entry
        ],
        "jobs": summary["jobs"],
        "operations": summary["operations"],
        "outcomes": summary["outcomes"],
        "rules": summary["rules"],
        "violations": summary["violations"],
    }
    RECORDED.write_text(json.dumps(dict(sorted(runs.items())), indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
