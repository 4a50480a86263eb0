"""jobq's benchmark suite: every scenario against its reference, measured in the same run.

    make bench            (or: .venv/bin/python bench/run.py [--quick] [--only drain_single,...])

PostgreSQL is JOBQ_BENCH_DATABASE_URL, by default the local server on 127.0.0.1:5432 (over TCP for jobq
and the references alike); each run uses a fresh database. jobq runs as `jobq serve` in its own process
and is driven over HTTP by bench/served.py's client; references run in this process on bare asyncpg. Throughputs are
medians of `--repeat` alternating runs; each figure is also given as a ratio to its reference, since on a
shared, noisy machine only same-run ratios mean much. Results: a table here, JSON in bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time
from datetime import timedelta

import asyncpg
import peer
import pickup
import push_endpoint
import raw
import served
import worker
from common import ROOT, OtlpSink, Service, fresh_database, summary_ms, write_results

PAYLOAD = {"to": "ada@example.com", "template": "welcome", "n": 1}
PAYLOAD_TEXT = '{"to": "ada@example.com", "template": "welcome", "n": 1}'


class Bench:
    def __init__(self, dsn: str, service: Service, bare_url: str, repeat: int, scale: float) -> None:
        self.dsn, self.service, self.url, self.bare_url = dsn, service, service.url, bare_url
        self.repeat, self.scale = repeat, scale
        self.results: dict[str, dict] = {}
        self.rss: dict[str, float] = {}
        self._n = 0

    def n(self, count: int) -> int:
        return max(100, int(count * self.scale) // 100 * 100)

    def queue(self, name: str) -> str:
        self._n += 1
        return f"{name}-{self._n}"

    async def sql(self, statement: str, *args: object) -> object:
        conn = await asyncpg.connect(self.dsn)
        try:
            return await conn.fetchval(statement, *args)
        finally:
            await conn.close()

    async def reset(self) -> None:
        await self.sql(
            "TRUNCATE jobq.jobs, jobq.jobs_history, jobq.job_edges, jobq.job_waits, jobq.job_journal"
        )
        await self.sql("VACUUM ANALYZE jobq.jobs")

    async def backlog(self, queue: str, count: int, **columns: str) -> None:
        extra = "".join(f", {k}" for k in columns)
        values = "".join(f", {v}" for v in columns.values())
        await self.sql("INSERT INTO jobq.queues (name) VALUES ($1) ON CONFLICT DO NOTHING", queue)
        await self.sql(
            f"INSERT INTO jobq.jobs (queue, payload{extra}) SELECT $1, $2::jsonb{values} FROM generate_series(1, $3) g",
            queue,
            PAYLOAD_TEXT,
            count,
        )

    async def finished(
        self, queue: str, count: int, table: str = "jobq.jobs_history", purge_after: str = ""
    ) -> None:
        """`count` completed jobs of `queue` kept in jobs_history (or `table`), purged a day from now (or at
        `purge_after`)."""
        await self.sql(
            f"""INSERT INTO {table} (id, queue, status, payload, priority, run_at, attempts, created_at,
                                     updated_at, completed_at, awaited, purge_after)
                SELECT nextval('jobq.jobs_id_seq'), $1, 'completed', $2::jsonb, 0, now(), 1, now(), now(),
                       now(), false, {purge_after or "now() + interval '1 day'"}
                FROM generate_series(1, $3)""",
            queue,
            PAYLOAD_TEXT,
            count,
        )

    def record(self, name: str, jobq: float, reference: float, unit: str, target: str, against: str) -> None:
        self.results[name] = {
            "jobq": round(jobq, 1),
            "reference": round(reference, 1),
            "ratio": round(jobq / reference, 3) if reference else None,
            "unit": unit,
            "reference_is": against,
            "target": target,
        }
        print(
            f"  {name:34} jobq {jobq:9.1f}  ref {reference:9.1f} {unit:7} ratio {jobq / reference:5.2f}  ({target})"
        )

    async def alternate(self, jobq, reference, *more) -> tuple[float, ...]:
        """Medians of `repeat` alternating runs of two measurements or more (each returns a rate)."""
        measures = (jobq, reference, *more)
        rates: list[list[float]] = [[] for _ in measures]
        for _ in range(self.repeat):
            for measure, kept in zip(measures, rates, strict=True):
                await self.reset()
                kept.append(await measure())
        return tuple(statistics.median(kept) for kept in rates)

    # --- scenarios -------------------------------------------------------------------------------------

    async def enqueue_single(self) -> None:
        total = self.n(3000)

        async def jobq() -> float:
            return total / await served.enqueue_single(self.url, self.queue("es"), 64, total, PAYLOAD)

        async def bare() -> float:
            return total / await served.enqueue_single(self.bare_url, self.queue("es"), 64, total, PAYLOAD)

        async def rawsql() -> float:
            return total / await raw.enqueue_single(self.dsn, self.queue("es"), 16, total, PAYLOAD_TEXT)

        j, b = await self.alternate(jobq, bare)
        self.record(
            "enqueue single, 64 clients",
            j,
            b,
            "jobs/s",
            ">= 0.6 x bare FastAPI",
            "bare FastAPI + asyncpg insert",
        )
        j, r = await self.alternate(jobq, rawsql)
        self.record("enqueue single vs raw insert", j, r, "jobs/s", "-", "raw single-row INSERT, 16 conns")

    async def enqueue_batch(self) -> None:
        for size in (100, 1000):
            total = self.n(20000)

            async def jobq(size=size, total=total) -> float:
                return total / await served.enqueue_batches(self.url, self.queue("eb"), size, total, PAYLOAD)

            async def rawsql(size=size, total=total) -> float:
                return total / await raw.enqueue_batches(
                    self.dsn, self.queue("eb"), size, total, PAYLOAD_TEXT
                )

            async def floor(size=size, total=total) -> float:
                return total / await served.enqueue_batches(
                    self.bare_url, self.queue("eb"), size, total, PAYLOAD
                )

            j, r, f = await self.alternate(jobq, rawsql, floor)
            self.record(
                f"enqueue batch {size}", j, r, "jobs/s", ">= 0.5 x raw", f"raw INSERT ... unnest of {size}"
            )
            # What HTTP, JSON and Python cost alone: the same insert behind a bare ASGI endpoint
            # (bench/bare_app.py), with an answer as large as jobq's.
            self.record(
                f"enqueue batch {size}, floor", f, r, "jobs/s", "-", "the same raw insert, served bare"
            )
            self.record(
                f"enqueue batch {size} vs floor", j, f, "jobs/s", "-", "bare ASGI endpoint, raw insert"
            )

    async def drain_single(self) -> None:
        total = self.n(5000)
        targets = {16: "-", 32: ">= 1.0 x raw (16)", 64: ">= 0.8 x raw (16)"}
        for workers, target in targets.items():

            async def jobq(workers=workers) -> float:
                queue = self.queue("ds")
                await self.backlog(queue, total)
                done, seconds = await served.drain(self.url, queue, workers, 1)
                self.rss["under load"] = max(self.rss.get("under load", 0), self.service.rss_mb())
                return done / seconds

            async def rawsql() -> float:
                queue = self.queue("ds")
                await self.backlog(queue, total)
                done, seconds = await raw.drain(self.dsn, queue, 16, 1)
                return done / seconds

            j, r = await self.alternate(jobq, rawsql)
            self.record(
                f"drain single, {workers} workers", j, r, "jobs/s", target, "raw claim 1 + ack 1, 16 conns"
            )

    async def drain_batch(self) -> None:
        async def jobq(total: int) -> float:
            queue = self.queue("db")
            await self.backlog(queue, total)
            done, seconds = await served.drain(self.url, queue, 4, 100)
            return done / seconds

        async def rawsql(total: int) -> float:
            queue = self.queue("db")
            await self.backlog(queue, total)
            done, seconds = await raw.drain(self.dsn, queue, 4, 100)
            return done / seconds

        total = self.n(100_000)  # a few seconds of draining: 20,000 jobs were gone in 0.4 s
        j, r = await self.alternate(lambda: jobq(total), lambda: rawsql(total))
        self.record(
            "drain batch 100, 4 workers", j, r, "jobs/s", ">= 0.5 x raw", "raw claim 100 + ack 100, 4 conns"
        )
        total = self.n(20000)  # pgqueuer slows down on bigger backlogs; compared at its own size
        for batch in (10, 100):

            async def pgq(batch=batch) -> float:
                done, seconds = await peer.drain(self.dsn, total, batch)
                return done / seconds

            j2, p = await self.alternate(lambda: jobq(total), pgq)
            target = ">= 1.5 x pgqueuer" if batch == 100 else "-"
            self.record(
                f"drain batch 100 vs pgqueuer {batch}",
                j2,
                p,
                "jobs/s",
                target,
                f"pgqueuer 1.6, batch {batch}",
            )

    async def dependencies(self) -> None:
        """Acking parents (API part 6): a drain of jobs that each have a waiting child, which the ack
        decides in its own transaction (jobq.parents_ended()), against the same drain of jobs without
        children; and a fan-out of 10,000 children decided by one parent's ack, against the ack of a job
        without children."""
        total = self.n(20000)

        async def with_children() -> float:
            queue = self.queue("dp")
            await self.backlog(queue, total)
            await self.children_of(queue, self.queue("dc"), per_parent=1)
            done, seconds = await served.drain(self.url, queue, 4, 100)
            return done / seconds

        async def without() -> float:
            queue = self.queue("dp")
            await self.backlog(queue, total)
            done, seconds = await served.drain(self.url, queue, 4, 100)
            return done / seconds

        async def by_hand() -> float:
            queue, children = self.queue("dp"), self.queue("dc")
            await self.backlog(queue, total)

            async def enqueue_children(http: served.Session, jobs: list[dict]) -> None:
                items = [{"queue": children, "payload": {"after": job["id"]}} for job in jobs]
                await served.post(http, f"{self.url}/jobs/batch", {"jobs": items})

            done, seconds = await served.drain(self.url, queue, 4, 100, after_ack=enqueue_children)
            return done / seconds

        j, r, hand = await self.alternate(with_children, without, by_hand)
        self.record(
            "drain batch 100, parents", j, r, "jobs/s", ">= 0.8 x no children", "the same drain, no children"
        )
        # What the feature replaces: a worker that enqueues each child itself once it has acked the parent.
        self.record(
            "drain batch 100, parents vs by hand",
            j,
            hand,
            "jobs/s",
            ">= 1 x by hand",
            "the same drain, each worker enqueueing the children after its ack",
        )

        fanout = self.n(10000)

        async def ack_one(children: int) -> float:
            queue = self.queue("fp")
            await self.backlog(queue, 1)
            if children:
                await self.children_of(queue, self.queue("fc"), per_parent=children)
            async with served.Session() as http:
                (job,) = (await served.post(http, f"{self.url}/lease", {"queue": queue}))["jobs"]
                started = time.perf_counter()
                await served.post(
                    http, f"{self.url}/ack", {"id": job["id"], "lease_token": job["lease_token"]}
                )
                seconds = time.perf_counter() - started
            if children:
                waiting = await self.sql("SELECT count(*) FROM jobq.jobs WHERE status = 'waiting'")
                assert waiting == 0, f"{waiting} children left waiting"
            return 1 / seconds

        j, r = await self.alternate(lambda: ack_one(fanout), lambda: ack_one(0))
        self.record(
            f"ack deciding {fanout} children", 1 / j, 1 / r, "s", "< 2 s", "the ack of a job without children"
        )

    async def durable(self) -> None:
        """Durable steps (API part 8): leases of jobs that each carry 10 recorded steps (60 bytes of result
        each, in jobq.job_journal), which every lease hands out, against leases of the same jobs without
        any; and the same two drains (lease and ack)."""
        total = self.n(20000)
        steps = json.dumps(
            {
                f"step-{n}": {"id": f"ch_{n:08d}", "amount": 4200 + n, "currency": "EUR", "ok": True}
                for n in range(10)
            }
        )

        async def jobs(with_steps: bool) -> str:
            queue = self.queue("ds")
            if not with_steps:
                await self.backlog(queue, total)
                return queue
            await self.backlog(queue, total, journaled="true")
            await self.sql(
                "INSERT INTO jobq.job_journal (job_id, steps) SELECT id, $2::jsonb FROM jobq.jobs WHERE queue = $1",
                queue,
                steps,
            )
            return queue

        async def leases(with_steps: bool) -> float:
            queue = await jobs(with_steps)
            done, seconds = await served.lease_all(self.url, queue, 4, 100)
            return done / seconds

        async def drain(with_steps: bool) -> float:
            done, seconds = await served.drain(self.url, await jobs(with_steps), 4, 100)
            return done / seconds

        j, r = await self.alternate(lambda: leases(True), lambda: leases(False))
        self.record(
            "lease batch 100, 10 steps each",
            j,
            r,
            "jobs/s",
            ">= 0.8 x no steps",
            "the same leases, jobs without steps",
        )
        j, r = await self.alternate(lambda: drain(True), lambda: drain(False))
        self.record(
            "drain batch 100, 10 steps each", j, r, "jobs/s", "-", "the same drain, jobs without steps"
        )

    async def children_of(self, parents: str, queue: str, per_parent: int) -> None:
        """`per_parent` waiting children in `queue` for each job of `parents`, linked as POST /jobs links
        them (jobq.add_parents())."""
        await self.sql("INSERT INTO jobq.queues (name) VALUES ($1) ON CONFLICT DO NOTHING", queue)
        await self.sql(
            """
            WITH children AS (
                INSERT INTO jobq.jobs (queue, payload, status, depends_on, run_if)
                SELECT $2, $3::jsonb, 'waiting', ARRAY[p.id], 'completed'
                FROM jobq.jobs p CROSS JOIN generate_series(1, $4) g WHERE p.queue = $1
                RETURNING id
            )
            SELECT count(*) FROM children
            """,
            parents,
            queue,
            PAYLOAD_TEXT,
            per_parent,
        )
        await self.sql(
            """SELECT jobq.add_parents(array_agg(id), array_fill(NULL::float8, ARRAY[count(*)::int]))
               FROM jobq.jobs WHERE queue = $1""",
            queue,
        )

    async def pooled(self) -> None:
        """Through PgBouncer in transaction mode (no prepared statements kept) against PostgreSQL itself,
        in alternating rounds: the batch drain and the one-job drain. Then pickup with the LISTEN
        connection down, where long-polls are woken by the safety poll only."""
        from tests.pgbouncer import pgbouncer_binary, running_pgbouncer, through_pooler

        binary = pgbouncer_binary()
        if binary is None:
            print("  (skipped: PgBouncer is not installed; apt-get install pgbouncer)")
            return
        # The transaction mode's own cost (no prepared statements kept) measured apart, on PostgreSQL itself.
        env = {"JOBQ_DATABASE_POOL_MODE": "transaction", "JOBQ_LISTEN_URL": self.dsn}
        with running_pgbouncer(binary, self.dsn) as address:
            async with (
                Service(through_pooler(self.dsn, address), port=8915, **env) as bounced,
                Service(self.dsn, port=8917, **env) as uncached,
            ):
                for workers, batch, total in ((4, 100, self.n(50_000)), (16, 1, self.n(5000))):

                    async def drain(url: str, workers=workers, batch=batch, total=total) -> float:
                        queue = self.queue("pb")
                        await self.backlog(queue, total)
                        done, seconds = await served.drain(url, queue, workers, batch)
                        return done / seconds

                    for name, url in (
                        ("via PgBouncer", bounced.url),
                        ("without prepared statements", uncached.url),
                    ):
                        j, r = await self.alternate(lambda url=url: drain(url), lambda: drain(self.url))
                        self.record(
                            f"drain {batch} x {workers} {name}",
                            j,
                            r,
                            "jobs/s",
                            "measured",
                            "the same, PostgreSQL itself, statements prepared once",
                        )
        safety = 0.5
        nowhere = "postgresql://postgres@127.0.0.1:9/none"  # the discard port: nothing listens there
        # Migrated already: a migration would need the session JOBQ_LISTEN_URL names.
        deaf_env = {"JOBQ_LISTEN_URL": nowhere, "JOBQ_WAKEUP_SAFETY_INTERVAL": str(safety)}
        async with Service(self.dsn, port=8916, JOBQ_MIGRATE_ON_START="false", **deaf_env) as deaf:
            down = summary_ms(await pickup.jobq_pickup(deaf.url, max(20, int(60 * self.scale))))
        self.results["pickup, LISTEN down"] = {
            "jobq": down,
            "target": f"p99 <= safety interval + 100 ms = {1000 * safety + 100:.0f} ms",
        }
        print(
            f"  {'pickup, LISTEN down (ms)':34} p50 {down['p50_ms']} p99 {down['p99_ms']} (safety poll {safety}s)"
        )

    async def tracing(self) -> None:
        """The service exporting every span (OpenTelemetry, 100 % sampling, to an OTLP receiver that
        keeps nothing) against the same service not tracing, in alternating rounds, on jobs that all
        carry a trace context: the batch drain and the one-job drain."""
        traced_job = {"traceparent": "'00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'"}
        with OtlpSink() as sink:
            async with Service(self.dsn, port=8919, JOBQ_MIGRATE_ON_START="false", **sink.env) as traced:
                for workers, batch, total in ((4, 100, self.n(50_000)), (16, 1, self.n(5000))):

                    async def drain(url: str, workers=workers, batch=batch, total=total) -> float:
                        queue = self.queue("tr")
                        await self.backlog(queue, total, **traced_job)
                        done, seconds = await served.drain(url, queue, workers, batch)
                        return done / seconds

                    j, r = await self.alternate(lambda: drain(traced.url), lambda: drain(self.url))
                    self.record(
                        f"drain {batch} x {workers}, traced",
                        j,
                        r,
                        "jobs/s",
                        ">= 0.9 x untraced",
                        "the same, tracing off",
                    )

    async def limited_backlog(
        self, queue: str, count: int, keyed: bool, limited: bool = True, fair: bool = False
    ) -> None:
        """`count` jobs; keyed: over 1,000 keys, in a queue with key_concurrency 2 (flow control) unless
        not `limited`, or with `fair` alone."""
        if not keyed:
            await self.backlog(queue, count)
            return
        await self.backlog(queue, count, key="'k' || (g % 1000)")
        if fair:
            await self.sql("UPDATE jobq.queues SET fair = true, flow = true WHERE name = $1", queue)
        elif limited:
            await self.sql("UPDATE jobq.queues SET key_concurrency = 2, flow = true WHERE name = $1", queue)

    async def keyed(self) -> None:
        """Flow control's cost: the batch drain and one-job claims of a queue with 1,000 active keys and
        key_concurrency 2, against the same without keys or limits (the plain LEASE), in the same run.
        Also the drain of keyed jobs in a queue without limits (the plain LEASE): what the keys alone cost
        (an index of each key's running jobs, written by every lease of a keyed job); and the same keyed
        jobs in a `fair` queue, drained by batches and by 16 workers leasing one job at a time."""

        async def drain(
            keyed: bool,
            total: int,
            limited: bool = True,
            fair: bool = False,
            workers: int = 4,
            batch: int = 100,
        ) -> float:
            queue = self.queue("kd")
            await self.limited_backlog(queue, total, keyed, limited, fair)
            # An empty answer is not the end under limits: workers long-poll until every job is done.
            started = time.perf_counter()
            await served.drain_count(self.url, queue, workers, batch, total)
            return total / (time.perf_counter() - started)

        total = self.n(100_000)
        k, p, u, f = await self.alternate(
            lambda: drain(True, total),
            lambda: drain(False, total),
            lambda: drain(True, total, limited=False),
            lambda: drain(True, total, fair=True),
        )
        self.record(
            "drain batch 100, 1,000 keys, limit 2",
            k,
            p,
            "jobs/s",
            ">= 0.8 x no keys",
            "the same without keys",
        )
        self.record(
            "drain batch 100, 1,000 keys, no limit",
            u,
            p,
            "jobs/s",
            "measured",
            "the same without keys",
        )
        self.record(
            "drain batch 100, 1,000 keys, fair",
            f,
            p,
            "jobs/s",
            "measured",
            "the same without keys",
        )
        singles = self.n(10_000)
        f1, p1 = await self.alternate(
            lambda: drain(True, singles, fair=True, workers=16, batch=1),
            lambda: drain(False, singles, workers=16, batch=1),
        )
        self.record(
            "drain 1 x 16, 1,000 keys, fair",
            f1,
            p1,
            "jobs/s",
            "measured",
            "the same without keys",
        )
        # One-job claims in `repeat` alternating rounds of 1,000 each (plain, keyed, fair, then the other
        # way round, ...), the percentiles over all of a kind's claims: a p99 of one pass of each was one
        # noisy moment of the machine in either (ratios of 1.2 to 3.2 between runs of the same code).
        rounds = 1000
        kinds = ("plain", "keyed", "fair")
        timed: dict[str, list[float]] = {kind: [] for kind in kinds}
        for n in range(self.repeat):
            for kind in kinds if n % 2 == 0 else kinds[::-1]:
                await self.reset()
                queue = self.queue("kc")
                await self.limited_backlog(queue, rounds, kind != "plain", fair=kind == "fair")
                timed[kind] += await self._claim_latencies(queue, rounds)
        latencies = {kind: summary_ms(values) for kind, values in timed.items()}
        ratio = latencies["keyed"]["p99_ms"] / latencies["plain"]["p99_ms"]
        fair_ratio = latencies["fair"]["p99_ms"] / latencies["plain"]["p99_ms"]
        self.results["one-job claim, 1,000 keys, limit 2"] = {
            "keyed": latencies["keyed"],
            "plain": latencies["plain"],
            "ratio_p99": round(ratio, 3),
            "target": "p99 <= 2 x plain",
        }
        self.results["one-job claim, 1,000 keys, fair"] = {
            "fair": latencies["fair"],
            "plain": latencies["plain"],
            "ratio_p99": round(fair_ratio, 3),
            "target": "measured",
        }
        notes = {
            "plain": "",
            "keyed": f"   ratio p99 {ratio:.2f} (<= 2)",
            "fair": f"   ratio p99 {fair_ratio:.2f}",
        }
        for kind, summary in latencies.items():
            label = f"one-job claim p50/p99 ms, {kind}"
            print(f"  {label:34} {summary['p50_ms']} / {summary['p99_ms']}{notes[kind]}")

    async def fairness(self) -> None:
        """`fair`: 16 workers with 10 ms handlers drain key A's backlog; after 13 s key B sends 10 jobs a
        second until the backlog is gone. B's wait from enqueue to lease over the whole drain, and A's rate
        in B's first 20 s against A's rate alone (less B's share)."""
        await self.reset()
        queue = self.queue("fa")
        backlog = self.n(100_000)
        await self.backlog(queue, backlog, key="'A'")
        await self.sql("UPDATE jobq.queues SET fair = true, flow = true WHERE name = $1", queue)
        done = {"A": 0, "B": 0}
        waits: list[float] = []
        stop = asyncio.Event()

        async def work() -> None:
            async with served.Session() as http:
                while not stop.is_set():
                    body = {"queue": queue, "max_jobs": 1, "wait": 1}
                    for job in (await served.post(http, f"{self.url}/lease", body))["jobs"]:
                        if job["key"] == "B":
                            waits.append(time.time() - job["payload"])
                        await asyncio.sleep(0.01)
                        ack = {"id": job["id"], "lease_token": job["lease_token"]}
                        await served.post(http, f"{self.url}/ack", ack)
                        done[job["key"]] += 1

        async def produce() -> None:
            async with served.Session() as http:
                while not stop.is_set():
                    job = {"queue": queue, "payload": time.time(), "key": "B"}
                    await served.post(http, f"{self.url}/jobs", job)
                    await asyncio.sleep(0.1)

        workers = [asyncio.create_task(work()) for _ in range(16)]
        await asyncio.sleep(3)  # warm up
        alone_from, a_from = time.perf_counter(), done["A"]
        await asyncio.sleep(10)
        alone = (done["A"] - a_from) / (time.perf_counter() - alone_from)
        producer = asyncio.create_task(produce())
        with_from, a_from, b_from = time.perf_counter(), done["A"], done["B"]
        await asyncio.sleep(20)
        seconds = time.perf_counter() - with_from
        with_b = (done["A"] - a_from) / seconds
        b_rate = (done["B"] - b_from) / seconds
        while done["A"] < backlog:  # B's waits are taken until A's backlog is gone
            await asyncio.sleep(0.2)
        stop.set()
        await asyncio.gather(*workers, producer)
        b_waits = summary_ms(waits)
        share = with_b / max(alone - b_rate, 1e-9)
        self.results["fair: key B's wait behind key A's backlog"] = {
            "b_wait": b_waits,
            "a_rate_alone": round(alone, 1),
            "a_rate_with_b": round(with_b, 1),
            "a_share_of_what_b_leaves": round(share, 3),
            "target": "B p99 <= 1000 ms, A >= 0.9",
        }
        print(f"  {'fair: B wait p50/p99 ms':34} {b_waits['p50_ms']} / {b_waits['p99_ms']} (<= 1000)")
        print(f"  {'fair: A jobs/s alone, with B':34} {alone:.0f}, {with_b:.0f}   share {share:.2f} (>= 0.9)")

    async def runner(self) -> None:
        """The Python worker runner (`jobq.Worker`, 16 slots). On no-op handlers, against the plain HTTP
        batch drain it is built on: what the runner's own machinery costs per job. On handlers of 1 and
        10 ms, against the most 16 of them can do (16 / duration): what the runner loses around real work."""
        total = self.n(20000)
        cases = (
            ("async", worker.coroutine, ">= 0.6 x HTTP batch"),
            ("plain", worker.plain, ">= 0.4 x HTTP batch"),
        )
        for kind, handler, target in cases:

            async def jobq(handler=handler) -> float:
                queue = self.queue("wr")
                await self.backlog(queue, total)
                return await worker.drain(self.url, queue, handler, 16, total)

            async def http() -> float:
                queue = self.queue("wr")
                await self.backlog(queue, total)
                done, seconds = await served.drain(self.url, queue, 4, 100)
                return done / seconds

            j, r = await self.alternate(jobq, http)
            self.record(
                f"worker runner, {kind} no-op, -c 16", j, r, "jobs/s", target, "4 x lease 100 + /ack/batch"
            )
        for milliseconds in (1, 10):
            ideal = 16 / (milliseconds / 1000)
            jobs = self.n(int(ideal * 3))  # about 3 s of work at the ideal rate
            for kind in ("async", "plain"):
                handler = worker.sleeping(milliseconds / 1000, kind == "async")
                rates = []
                for _ in range(self.repeat):
                    await self.reset()
                    queue = self.queue("wr")
                    await self.backlog(queue, jobs)
                    rates.append(await worker.drain(self.url, queue, handler, 16, jobs))
                self.record(
                    f"worker runner, {kind} {milliseconds} ms, -c 16",
                    statistics.median(rates),
                    ideal,
                    "jobs/s",
                    "as near 1 as can be",
                    "16 / handler time",
                )

    async def push(self) -> None:
        """Push delivery to a no-op endpoint (bench/push_endpoint.py): the drain of a backlog at
        concurrency 16 and 64 (requests in flight) against the Python runner's drain of the same backlog
        (16 async no-op slots), alternated; then pickup on an idle service, enqueue to the endpoint's
        handler starting."""
        total = self.n(20000)
        async with push_endpoint.Endpoint() as endpoint:
            measures = []
            for concurrency in (16, 64):

                async def pushed(concurrency=concurrency) -> float:
                    queue = self.queue("push")
                    await self.backlog(queue, total)
                    return await push_endpoint.drain(self.url, endpoint, queue, concurrency, total, self.sql)

                measures.append(pushed)

            async def runner() -> float:
                queue = self.queue("push")
                await self.backlog(queue, total)
                return await worker.drain(self.url, queue, worker.coroutine, 16, total)

            at_16, at_64, r = await self.alternate(*measures, runner)
            for concurrency, rate in ((16, at_16), (64, at_64)):
                self.record(
                    f"push delivery, no-op endpoint, -c {concurrency}",
                    rate,
                    r,
                    "jobs/s",
                    ">= 0.5 x runner",
                    "runner, async no-op, -c 16",
                )
            rounds = max(50, int(200 * self.scale))
            pickup_ = summary_ms(await push_endpoint.pickup(self.url, endpoint, rounds))
        self.results["push pickup latency"] = {"jobq": pickup_, "target": "p50 <= 10 ms"}
        print(f"  {'push pickup latency (ms)':34} p50 {pickup_['p50_ms']} p99 {pickup_['p99_ms']}")

    async def full_cycle(self) -> None:
        total = self.n(20000)
        for mode, batch in (("single", 1), ("batch", 100)):

            async def jobq(batch=batch) -> float:
                queue = self.queue("fc")
                started = time.perf_counter()
                if batch == 1:
                    producing = served.enqueue_single(self.url, queue, 16, total, PAYLOAD)
                else:
                    producing = served.enqueue_batches(self.url, queue, batch, total, PAYLOAD)
                workers = 16 if batch == 1 else 4
                await asyncio.gather(producing, served.drain_count(self.url, queue, workers, batch, total))
                return total / (time.perf_counter() - started)

            async def rawsql(batch=batch) -> float:
                queue = self.queue("fc")
                started = time.perf_counter()
                if batch == 1:
                    producing = raw.enqueue_single(self.dsn, queue, 16, total, PAYLOAD_TEXT)
                else:
                    producing = raw.enqueue_batches(self.dsn, queue, batch, total, PAYLOAD_TEXT)
                workers = 16 if batch == 1 else 4
                await asyncio.gather(producing, raw.drain_count(self.dsn, queue, workers, batch, total))
                return total / (time.perf_counter() - started)

            j, r = await self.alternate(jobq, rawsql)
            self.record(f"full cycle, {mode}", j, r, "jobs/s", "-", f"raw insert + claim/ack, {mode}")

    async def sqs(self) -> None:
        total = self.n(5000)

        async def through_sqs() -> float:
            return total / await served.sqs_cycle(self.url, self.queue("sqs"), total)

        async def native() -> float:
            return total / await served.native_cycle(self.url, self.queue("nat"), total)

        j, r = await self.alternate(through_sqs, native)
        self.record("SQS send 10 / receive 10 / delete 10", j, r, "msgs/s", "-", "jobq's own API, same shape")

    async def pickup(self) -> None:
        rounds = max(50, int(200 * self.scale))
        served_ = summary_ms(await pickup.jobq_pickup(self.url, rounds))
        runner_ = summary_ms(await pickup.runner_pickup(self.url, rounds))
        raw_ = summary_ms(await pickup.raw_pickup(self.dsn, rounds))
        self.results["pickup latency"] = {
            "jobq": served_,
            "runner": runner_,
            "reference": raw_,
            "target": "long-poll p99 <= 10 ms; runner p50 <= 4 ms, p99 <= 15 ms",
        }
        print(
            f"  {'pickup latency (ms)':34} long-poll p50 {served_['p50_ms']} p99 {served_['p99_ms']}"
            f"   runner p50 {runner_['p50_ms']} p99 {runner_['p99_ms']}"
            f"   raw p50 {raw_['p50_ms']} p99 {raw_['p99_ms']}"
        )

    async def waiting(self) -> None:
        """Waiting for jobs: latency across replicas, then 10,000 waiters on one replica (memory,
        database connections) answered by acks on the other."""
        rounds = max(50, int(200 * self.scale))
        count = self.n(10_000)
        async with (
            Service(self.dsn, port=8913, JOBQ_MAX_WAITERS=str(2 * count)) as a,
            Service(self.dsn, port=8914) as b,
        ):
            latency = summary_ms(await pickup.wait_latency(a.url, b.url, rounds))
            raw_ = summary_ms(await pickup.raw_wait_latency(self.dsn, rounds))
            child = summary_ms(await pickup.child_pickup(a.url, b.url, rounds))
            queue = self.queue("wa")
            ids: list[int] = []
            async with served.Session() as http:
                for start in range(0, count, 1000):
                    jobs = [{"queue": queue, "payload": i} for i in range(start, min(count, start + 1000))]
                    ids += [
                        j["id"]
                        for j in (await served.post(http, f"{b.url}/jobs/batch", {"jobs": jobs}))["jobs"]
                    ]
            await asyncio.sleep(1)
            idle = a.rss_mb()
            held = await pickup.hold_waits(a.url, ids)
            while (
                await self.sql("SELECT count(*) FROM jobq.jobs WHERE queue = $1 AND awaited", queue) < count
            ):
                await asyncio.sleep(0.2)
            await asyncio.sleep(2)
            waiting_rss = a.rss_mb()
            connections = await self.sql(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name LIKE 'jobq%'"
            )
            started = time.perf_counter()
            answers = asyncio.gather(*(pickup.answer_status(reader) for reader, _ in held))
            async with served.Session() as http:
                while leased := (
                    await served.post(http, f"{b.url}/lease", {"queue": queue, "max_jobs": 1000})
                )["jobs"]:
                    items = [{"id": j["id"], "lease_token": j["lease_token"]} for j in leased]
                    await served.post(http, f"{b.url}/ack/batch", {"items": items})
            statuses = await answers
            answered = time.perf_counter() - started
            for _, writer in held:
                writer.close()
        assert statuses == [200] * count, set(statuses)
        added = waiting_rss - idle
        self.results["fan-in child pickup"] = {
            "across replicas": child,
            "reference": latency,
            "target": "p99 <= 1 s from the last parent's ack to the child's lease on the other replica",
        }
        print(
            f"  {'fan-in child, across replicas':34} p50 {child['p50_ms']} p99 {child['p99_ms']}"
            f"   (a job's waiter p50 {latency['p50_ms']} p99 {latency['p99_ms']})"
        )
        self.results["waiting for jobs"] = {
            "across replicas": latency,
            "reference": raw_,
            f"{count}_waiters": {
                "rss_idle_mb": round(idle, 1),
                "rss_waiting_mb": round(waiting_rss, 1),
                "rss_added_mb": round(added, 1),
                "database_connections": connections,
                "all_answered_s": round(answered, 2),
            },
            "target": "across replicas p99 <= 20 ms; 10,000 waiters add < 30 MB and no connections",
        }
        print(
            f"  {'wait for a job, across replicas':34} p50 {latency['p50_ms']} p99 {latency['p99_ms']}"
            f"   raw p50 {raw_['p50_ms']} p99 {raw_['p99_ms']}"
        )
        print(
            f"  {f'{count:,} waiters':34} RSS +{added:.1f} MB ({idle:.0f} -> {waiting_rss:.0f}),"
            f" {connections} database connections (two replicas), all answered in {answered:.2f} s"
        )

    async def _claim_latencies(self, queue: str, rounds: int) -> list[float]:
        latencies = []
        async with served.Session() as http:
            for _ in range(rounds):
                started = time.perf_counter()
                (job,) = (await served.post(http, f"{self.url}/lease", {"queue": queue}))["jobs"]
                latencies.append(time.perf_counter() - started)
                await served.post(
                    http, f"{self.url}/ack", {"id": job["id"], "lease_token": job["lease_token"]}
                )
        return latencies

    async def scale_(self) -> None:
        """Finished jobs kept in jobq.jobs_history do not slow the claim: one-job claims with 10 M finished
        jobs kept, against none, in `repeat` alternating rounds of 1,000 claims each (the partition that
        holds them detached for the rounds without, attached for the others). The job list among them.
        Then retention: a day's partition of 2 M finished jobs dropped, against deleting the same rows
        1,000 at a time, as retention did before jobs_history."""
        rounds = 1000  # p99 of fewer calls is one noisy moment of a shared machine
        await self.reset()
        queue = self.queue("sc")
        finished = self.n(10_000_000)
        rare = self.queue("sc-rare")
        await self.finished(rare, 1000)  # below the rest
        await self.finished(queue, finished)
        await self.sql("VACUUM ANALYZE jobq.jobs_history")
        await self.sql("CHECKPOINT")  # the writes above, flushed before anything is timed
        partition = await self.sql(
            "SELECT tableoid::regclass::text FROM jobq.jobs_history WHERE queue = $1 LIMIT 1", queue
        )
        bounds = await self.sql(
            "SELECT pg_get_expr(relpartbound, oid) FROM pg_class WHERE oid = $1::regclass", partition
        )
        low, high = re.findall(r"'[^']*'", bounds)
        # A CHECK that implies the partition's bounds: attaching it again then needs no scan.
        await self.sql(
            f"ALTER TABLE {partition} ADD CONSTRAINT bench_bounds CHECK (purge_after >= {low} AND purge_after < {high})"
        )

        async def attach() -> None:  # the jobs acked meanwhile went to the default partition: out of the way
            await self.sql("DELETE FROM jobq.jobs_history_default")
            await self.sql(f"ALTER TABLE jobq.jobs_history ATTACH PARTITION {partition} {bounds}")

        latencies: dict[bool, list[float]] = {False: [], True: []}
        attached = True
        # Rounds in the order none, kept, kept, none, none, kept...: neither goes first every time.
        for n in range(self.repeat):
            for kept in (False, True) if n % 2 == 0 else (True, False):
                if kept and not attached:
                    await attach()
                elif attached and not kept:
                    await self.sql(f"ALTER TABLE jobq.jobs_history DETACH PARTITION {partition}")
                attached = kept
                round_queue = self.queue("sc-claims")
                await self.backlog(round_queue, rounds)
                latencies[kept] += await self._claim_latencies(round_queue, rounds)
        if not attached:  # the job list below reads among them
            await attach()
        empty, full = summary_ms(latencies[False]), summary_ms(latencies[True])
        self.results["claim latency with finished jobs kept"] = {
            "empty": empty,
            f"{finished}_completed": full,
            "ratio_p99": round(full["p99_ms"] / empty["p99_ms"], 3),
            "target": "p99 <= 1.1 x empty",
        }
        print(f"  {'claim p50/p99 ms, none kept':34} {empty['p50_ms']} / {empty['p99_ms']}")
        print(
            f"  {f'claim p50/p99 ms, {finished:,} kept':34} {full['p50_ms']} / {full['p99_ms']}"
            f"   ratio p99 {full['p99_ms'] / empty['p99_ms']:.2f} (<= 1.1)"
        )
        await self._job_list_latency(queue, rare, finished)
        await self.reset()
        await self._retention(self.n(2_000_000))

    async def _retention(self, count: int) -> None:
        """A day of `count` finished jobs: its partition dropped (what retention does now), against the
        same rows deleted in batches of 1,000 (what it did before). The partition is filled as a table of
        its own and attached just before the drop, so that the service's own retention round, which
        drops a past day's partition as soon as it sees one, does not take it first."""
        day = await self.sql("SELECT (now() AT TIME ZONE 'UTC')::date - 1")
        name = f"jobq.jobs_history_p{day:%Y%m%d}"
        bounds = f"FROM ('{day} 00:00:00+00') TO ('{day + timedelta(days=1)} 00:00:00+00')"
        fill = f"'{day} 12:00:00+00'"
        await self.sql(f"CREATE TABLE {name} (LIKE jobq.jobs_history INCLUDING DEFAULTS)")
        await self.finished("r", count, table=name, purge_after=fill)
        await self.sql(f"ALTER TABLE jobq.jobs_history ATTACH PARTITION {name} FOR VALUES {bounds}")
        started = time.perf_counter()
        await self.sql(f"DROP TABLE IF EXISTS {name}")
        dropped = time.perf_counter() - started
        await self.sql(f"CREATE TABLE {name} (LIKE jobq.jobs_history INCLUDING DEFAULTS)")
        await self.sql(f"ALTER TABLE {name} ADD PRIMARY KEY (id, purge_after)")
        await self.finished("r", count, table=name, purge_after=fill)
        await self.sql(f"VACUUM ANALYZE {name}")
        started = time.perf_counter()
        while await self.sql(
            f"""WITH doomed AS (SELECT id FROM {name} WHERE purge_after < now() LIMIT 1000 FOR UPDATE SKIP LOCKED),
                     gone AS (DELETE FROM {name} t USING doomed WHERE t.id = doomed.id RETURNING 1)
                SELECT count(*) FROM gone"""
        ):
            pass
        deleted = time.perf_counter() - started
        await self.sql(f"ANALYZE {name}")
        dead = await self.sql(f"SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = '{name}'::regclass")
        await self.sql(f"DROP TABLE {name}")
        self.record(
            f"retention: a day of {count:,} finished",
            dropped,
            deleted,
            "s",
            "drop < 1 s, no dead tuples",
            f"DELETE in batches of 1,000 (left {dead:,} dead tuples)",
        )

    async def _job_list_latency(self, queue: str, rare: str, finished: int) -> None:
        """GET /jobs among `finished` completed jobs, a filter at a time: the ones an index answers, and
        kind, key and search that match nothing, so that a page reads its whole window."""
        filters = {
            "none": {},
            "queue": {"queue": queue},
            "rare queue (oldest 1,000)": {"queue": rare},
            "status completed": {"status": "completed"},
            "status pending": {"status": "pending"},
            "status dead (none)": {"status": "dead"},
            "kind (no match)": {"kind": "nothing"},
            "key (no match)": {"key": "nothing"},
            "search (no match)": {"q": "needle"},
            "queue + search (no match)": {"queue": queue, "q": "needle"},
        }
        rows = {}
        async with served.Session() as http:
            for name, params in filters.items():
                query = "&".join(f"{k}={v}" for k, v in params.items())
                latencies = []
                for _ in range(100):
                    started = time.perf_counter()
                    status, _ = await http.get(f"{self.url}/jobs?{query}")
                    latencies.append(time.perf_counter() - started)
                    assert status == 200, (name, status)
                rows[name] = summary_ms(latencies)
                print(f"  {f'GET /jobs, {name}':34} p50 {rows[name]['p50_ms']} p99 {rows[name]['p99_ms']} ms")
        self.results[f"job list latency with {finished} finished"] = rows | {"target": "p99 <= 50 ms each"}

    async def burst(self) -> None:
        total = self.n(20000)

        async def run(same: bool) -> float:
            queue = self.queue("bu")
            if same:
                await self.backlog(queue, total, run_at="now() - interval '1 second'")
            else:
                await self.backlog(queue, total, run_at="now() - g * interval '1 millisecond'")
            done, seconds = await served.drain(self.url, queue, 32, 1)
            return done / seconds

        same, distinct = await self.alternate(lambda: run(True), lambda: run(False))
        self.record(
            "burst: one run_at, 32 callers", same, distinct, "jobs/s", ">= 0.9 x distinct", "distinct run_ats"
        )

    async def memory(self) -> None:
        self.rss["idle"] = self.service.rss_mb()
        writers = await pickup.hold_long_polls(self.url, 1000)
        await asyncio.sleep(3)
        self.rss["1000 long-polls"] = self.service.rss_mb()
        for writer in writers:
            writer.close()
        self.results["service memory"] = {k: round(v, 1) for k, v in self.rss.items()} | {
            "long_polls_added_mb": round(self.rss["1000 long-polls"] - self.rss["idle"], 1),
            "target": "1,000 long-polls add < 50 MB",
        }
        print(f"  {'service RSS (MB)':34} " + ", ".join(f"{k} {v:.0f}" for k, v in self.rss.items()))


SCENARIOS = [
    "enqueue_single",
    "enqueue_batch",
    "drain_single",
    "drain_batch",
    "dependencies",
    "durable",
    "keyed",
    "fairness",
    "runner",
    "push",
    "full_cycle",
    "sqs",
    "pooled",
    "tracing",
    "pickup",
    "waiting",
    "scale_",
    "burst",
    "memory",
]


class BareApp:
    def __init__(self, dsn: str, port: int = 8912) -> None:
        self.url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "JOBQ_DATABASE_URL": dsn, "PYTHONPATH": str(ROOT)}
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "bench.bare_app:app",
                "--port",
                str(port),
                "--log-level",
                "warning",
            ],
            env=env,
            cwd=ROOT,
        )

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


async def main(args: argparse.Namespace) -> None:
    chosen = args.only.split(",") if args.only else SCENARIOS
    started = time.perf_counter()
    async with fresh_database() as dsn, Service(dsn, JOBQ_PUSH_ALLOWED_URLS=push_endpoint.URL) as service:
        bare = BareApp(dsn)
        await asyncio.sleep(2)
        if bare.process.poll() is not None:  # a stale reference would answer in its place
            raise RuntimeError(
                f"the bare references (bench/bare_app.py) exited at start (is {bare.url} in use?)"
            )
        bench = Bench(dsn, service, bare.url, args.repeat, 0.25 if args.quick else 1.0)
        try:
            for name in chosen:
                print(name.strip("_"))
                before = set(bench.results)
                await getattr(bench, name)()
                for figure in bench.results.keys() - before:  # the scenario that reproduces it
                    bench.results[figure]["scenario"] = name
        finally:
            bare.stop()
    elapsed = time.perf_counter() - started
    path = write_results("run", {"seconds": round(elapsed), "repeat": args.repeat, "results": bench.results})
    print(f"done in {elapsed:.0f} s; written to {path}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=3, help="alternating runs per throughput figure")
    parser.add_argument("--quick", action="store_true", help="a quarter of the sizes, for a smoke run")
    parser.add_argument("--only", help="comma-separated scenarios: " + ", ".join(SCENARIOS))
    asyncio.run(main(parser.parse_args()))
