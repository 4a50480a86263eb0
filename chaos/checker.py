"""The checker: a run's history (chaos/history.py) and the database's final state, against jobq's promises.

Pure: it reads what it is given and touches nothing, so each rule is tested on histories written by hand
(tests/unit/test_chaos_checker.py). Every rule looks for a violation that the history *proves*, never one
it merely allows: an operation whose outcome is unknown (``info``) may have happened at any time after it
was sent, so it counts as done for what it may have caused and as not done for what it proves.

Times. A lease was granted, at the latest, when its answer came (`granted_by`, the client's wall clock)
and, at the earliest, when the claim's transaction began (`start`: `lease_expires_at` less the visibility
timeout asked for, both from PostgreSQL's `now()`, which is the transaction's start, not the moment the
job was taken: a claim of several round trips over a slow network began long before). Every other time
is a client's wall clock, on the same machine. A lease ends, at the earliest, when its deadline passes (as
the last `extend` the history knows set it) or when an ack, nack, release or await under its token was
*sent*, whichever comes first: `end_lower`. So a lease is surely live over [`granted_by`, `end_lower`),
and the rules compare those. Each allows `tolerance` seconds (50 ms) besides.

The rules, each reported with how many cases it checked and its first violations:

- enqueues: every enqueue answered 2xx exists with the id it was answered, and one uid (a producer's
  `Idempotency-Key`, also in the payload) is one job at most; a uid whose every answer was a refusal
  does not exist; no job exists that no producer asked for.
- final: every job reaches `completed`, `dead` or `cancelled`.
- leases: no two leases of one job are live at once (the next granted after the previous ended), and
  nothing done under a token succeeds once a later lease of the job has been granted (fencing).
- acks: at most one ack of a job succeeds; a job acked with a 2xx is `completed`, and a `completed` job
  had an ack that succeeded or may have.
- key_concurrency: never more leases of one key live at once than the queue allows; with 1, a key's jobs
  run in the order they were enqueued (each one's leases all end before the next job's first starts).
- rate: never more than `limit` leases of the queue granted in any `period` seconds.
- schedules: every slot of a schedule fired once: no slot twice, and none missing between the first
  and the last (for schedules that catch up `all` and fire every `step` seconds).
- dependencies: a child (`depends_on`, run if its parents completed) is decided once and as its parents
  ended: run (completed or dead) when every parent completed, else cancelled; and no lease of it starts
  before each parent's first ack that succeeded or may have was sent.
- steps: a step of a job is recorded once (one 2xx), the job keeps the result of the write that
  succeeded, and every `409` answered that result.
- answers: no 5xx other than a 503 (a 500 is a bug, whatever the fault), and no 400 or 422: the run's own
  requests are valid, so such an answer is the run's bug, and a rule may have checked nothing.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from chaos.history import FAIL, INFO, OK, History, Op

FINAL = frozenset({"completed", "dead", "cancelled"})
ENDING = ("ack", "nack", "release", "await")  # operations that end a lease when they succeed
SHOWN = 5  # violations shown per rule


@dataclass
class Lease:
    """A lease the history knows of: from an answered `/lease`, with what was done under its token."""

    job: int
    token: str
    queue: str
    key: str | None
    start: float  # when its claim's transaction began: the earliest it was granted (the database's clock)
    expires: float
    grant: Op
    under: list[Op] = field(default_factory=list)  # later operations naming its token

    @property
    def granted_by(self) -> float:
        """The latest it was granted: when its answer came."""
        return self.grant.received

    @property
    def end_lower(self) -> float:
        """The earliest the lease may have ended: its last known deadline, or the sending of the first
        ack, nack, release or await under it that succeeded or may have."""
        expires = max([self.expires, *(_time(op.body["lease_expires_at"]) for op in self.under_ok("extend"))])
        ended = [op.sent for op in self.under if op.op in ENDING and item_outcome(op) in (OK, INFO)]
        return min([expires, *ended])

    def under_ok(self, kind: str) -> list[Op]:
        return [op for op in self.under if op.op == kind and item_outcome(op) == OK]


@dataclass
class Rule:
    name: str
    checked: int = 0
    violations: list[str] = field(default_factory=list)

    def see(self, count: int = 1) -> None:
        self.checked += count

    def fail(self, what: str, *ops: Op) -> None:
        self.violations.append("\n".join([what, *(f"    {op.brief()}" for op in ops)]))


@dataclass
class Report:
    rules: dict[str, Rule]
    operations: int
    outcomes: dict[str, int]

    @property
    def ok(self) -> bool:
        return not any(rule.violations for rule in self.rules.values())

    def summary(self) -> dict[str, Any]:
        return {
            "operations": self.operations,
            "outcomes": self.outcomes,
            "rules": {
                name: {"checked": rule.checked, "violations": len(rule.violations)}
                for name, rule in self.rules.items()
            },
            "violations": sum(len(rule.violations) for rule in self.rules.values()),
        }

    def text(self) -> str:
        lines = [f"{self.operations} operations: {json.dumps(self.outcomes)}"]
        for name, rule in self.rules.items():
            lines.append(f"  {name:<16} {rule.checked:>8} checked  {len(rule.violations):>4} violations")
        for name, rule in self.rules.items():
            for violation in rule.violations[:SHOWN]:
                lines.append(f"{name}: {violation}")
        return "\n".join(lines)


@dataclass
class Final:
    """What the database holds after the run, and the settings the run used."""

    jobs: Mapping[int, Mapping[str, Any]]  # id -> status, queue, key, uid, schedule, schedule_slot, steps
    queues: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # name -> key_concurrency, rate
    schedules: Mapping[str, float] = field(default_factory=dict)  # name -> seconds between slots


def item_outcome(op: Op) -> str:
    """A release answers per item (the workload sends one): ok only when its item was."""
    if op.op == "release" and op.outcome == OK:
        return OK if op.body["results"][0]["ok"] else FAIL
    return op.outcome


def _time(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def leases(history: History) -> dict[int, list[Lease]]:
    """Every lease the history knows of, by job, in the order they started, each with the operations
    under its token."""
    by_token: dict[str, Lease] = {}
    for op in history:
        if op.op == "lease" and op.ok:
            visibility = op.request["visibility_timeout"]
            for job in op.body["jobs"]:
                expires = _time(job["lease_expires_at"])
                by_token[job["lease_token"]] = Lease(
                    job["id"],
                    job["lease_token"],
                    job["queue"],
                    job.get("key"),
                    expires - visibility,
                    expires,
                    op,
                )
        elif op.op != "lease":
            token = _token(op)
            if token in by_token:
                by_token[token].under.append(op)
    out: dict[int, list[Lease]] = defaultdict(list)
    for lease in by_token.values():
        out[lease.job].append(lease)
    for job_leases in out.values():
        job_leases.sort(key=lambda lease: lease.start)
    return out


def _token(op: Op) -> str | None:
    if op.op == "release":
        return op.request["items"][0]["lease_token"]
    return op.request.get("lease_token")


def check(history: History, final: Final, tolerance: float = 0.05) -> Report:
    by_job = leases(history)
    rules = {
        name: Rule(name)
        for name in (
            "enqueues",
            "final",
            "leases",
            "acks",
            "key_concurrency",
            "rate",
            "schedules",
            "dependencies",
            "steps",
            "answers",
        )
    }
    _enqueues(history, final, rules["enqueues"])
    _final(final, rules["final"])
    _leases(by_job, tolerance, rules["leases"])
    _acks(history, by_job, final, rules["acks"])
    _key_concurrency(by_job, final, tolerance, rules["key_concurrency"])
    _rate(by_job, final, tolerance, rules["rate"])
    _schedules(final, tolerance, rules["schedules"])
    _dependencies(history, by_job, final, tolerance, rules["dependencies"])
    _steps(history, final, rules["steps"])
    _answers(history, rules["answers"])
    outcomes: dict[str, int] = defaultdict(int)
    for op in history:
        outcomes[op.outcome] += 1
    return Report(rules, len(history), dict(outcomes))


def _enqueues(history: History, final: Final, rule: Rule) -> None:
    sent: dict[str, list[Op]] = defaultdict(list)
    for op in history:
        if op.op == "enqueue":
            sent[op.request["payload"]["uid"]].append(op)
    stored: dict[str, list[int]] = defaultdict(list)
    for job_id, job in final.jobs.items():
        if job.get("uid") is not None:
            stored[job["uid"]].append(job_id)
    for uid, ops in sent.items():
        rule.see()
        answered = {op.body["id"] for op in ops if op.ok}
        jobs = stored.get(uid, [])
        if len(answered) > 1:
            rule.fail(f"uid {uid}: answered as {len(answered)} different jobs {sorted(answered)}", *ops)
        for job_id in answered:
            if job_id not in final.jobs:
                rule.fail(f"uid {uid}: answered as job {job_id}, which does not exist (lost)", *ops)
        if len(jobs) > 1:
            rule.fail(f"uid {uid}: stored as {len(jobs)} jobs {sorted(jobs)} (twice)", *ops)
        if jobs and all(op.outcome == FAIL for op in ops):
            rule.fail(f"uid {uid}: every answer was a refusal, yet job {jobs[0]} exists", *ops)
    for uid, jobs in stored.items():
        if uid not in sent:
            rule.fail(f"jobs {jobs} carry uid {uid}, which no producer sent")


def _final(final: Final, rule: Rule) -> None:
    for job_id, job in sorted(final.jobs.items()):
        rule.see()
        if job["status"] not in FINAL:
            rule.fail(f"job {job_id} ended the run {job['status']}, not in a final state: {dict(job)}")


def _leases(by_job: Mapping[int, list[Lease]], tolerance: float, rule: Rule) -> None:
    """Each pair of a job's leases: surely live at one moment, or (the first surely granted before the
    second's claim began) something done under the first succeeding once the second was surely granted.
    Their order is not assumed from their starts: a claim that began first (over a slow network, say) may
    have taken the job last."""
    for job_id, job_leases in sorted(by_job.items()):
        rule.see(len(job_leases))
        for a, b in itertools.combinations(job_leases, 2):
            both_from, both_until = max(a.granted_by, b.granted_by), min(a.end_lower, b.end_lower)
            if both_from < both_until - tolerance:
                rule.fail(
                    f"job {job_id}: two leases surely live at once, from {both_from:.3f} "
                    f"until {both_until:.3f}",
                    a.grant,
                    b.grant,
                    *a.under,
                    *b.under,
                )
            for earlier, later in ((a, b), (b, a)):
                if earlier.granted_by >= later.start:
                    continue
                for op in earlier.under:
                    if item_outcome(op) == OK and op.sent > later.granted_by + tolerance:
                        rule.fail(
                            f"job {job_id}: {op.op} under a token succeeded though a later lease was granted "
                            f"by {later.granted_by:.3f}, before it was sent",
                            earlier.grant,
                            later.grant,
                            op,
                        )


def _acks(history: History, by_job: Mapping[int, list[Lease]], final: Final, rule: Rule) -> None:
    acks: dict[int, list[Op]] = defaultdict(list)
    for op in history:
        if op.op == "ack":
            acks[op.request["id"]].append(op)
    for job_id in sorted(set(acks) | set(final.jobs)):
        rule.see()
        ops = acks.get(job_id, [])
        succeeded = [op for op in ops if op.ok]
        status = final.jobs.get(job_id, {}).get("status")
        if len(succeeded) > 1:
            tokens = {op.request["lease_token"] for op in succeeded}
            if len(tokens) > 1:  # the same lease's ack answered twice is one ack
                rule.fail(
                    f"job {job_id}: {len(succeeded)} acks under {len(tokens)} leases succeeded", *succeeded
                )
        if succeeded and status != "completed":
            rule.fail(f"job {job_id}: an ack succeeded, yet the job is {status}", *succeeded)
        if status == "completed" and not [op for op in ops if op.maybe]:
            rule.fail(f"job {job_id} is completed, yet no ack of it succeeded or may have", *ops)


def _key_concurrency(by_job: Mapping[int, list[Lease]], final: Final, tolerance: float, rule: Rule) -> None:
    by_key: dict[tuple[str, str], list[Lease]] = defaultdict(list)
    for job_leases in by_job.values():
        for lease in job_leases:
            limit = final.queues.get(lease.queue, {}).get("key_concurrency")
            if limit is not None and lease.key is not None:
                by_key[(lease.queue, lease.key)].append(lease)
    for (queue, key), key_leases in sorted(by_key.items()):
        limit = final.queues[queue]["key_concurrency"]
        rule.see(len(key_leases))
        _most_at_once(key_leases, limit, tolerance, f"queue {queue} key {key}", rule)
        if limit == 1:
            _in_order(key_leases, tolerance, f"queue {queue} key {key}", rule)


def _most_at_once(key_leases: list[Lease], limit: int, tolerance: float, where: str, rule: Rule) -> None:
    """A sweep over [granted_by, end_lower - tolerance): more than `limit` at once is proven."""
    edges = []
    for lease in key_leases:
        end = lease.end_lower - tolerance
        if end > lease.granted_by:
            edges += [(lease.granted_by, 1, lease), (end, -1, lease)]
    live: list[Lease] = []
    for _, step, lease in sorted(edges, key=lambda e: (e[0], e[1])):
        if step < 0:
            live.remove(lease)
            continue
        live.append(lease)
        if len(live) > limit:
            rule.fail(f"{where}: {len(live)} leases live at once, {limit} allowed", *(x.grant for x in live))
            return


def _in_order(key_leases: list[Lease], tolerance: float, where: str, rule: Rule) -> None:
    """With one at a time, a key's jobs run in the order they were enqueued (ids: the workload enqueues
    each key's jobs one after another): every lease of a job ends before the next job's first starts."""
    by_job: dict[int, list[Lease]] = defaultdict(list)
    for lease in key_leases:
        by_job[lease.job].append(lease)
    jobs = sorted(by_job)
    for earlier, later in zip(jobs, jobs[1:], strict=False):
        first = min(by_job[later], key=lambda lease: lease.start)
        last_end = max(lease.end_lower for lease in by_job[earlier])
        if first.granted_by < last_end - tolerance:
            held = max(by_job[earlier], key=lambda lease: lease.end_lower)
            rule.fail(
                f"{where}: job {later} started before job {earlier} (enqueued first) ended",
                held.grant,
                first.grant,
            )


def _rate(by_job: Mapping[int, list[Lease]], final: Final, tolerance: float, rule: Rule) -> None:
    starts: dict[str, list[Lease]] = defaultdict(list)
    for job_leases in by_job.values():
        for lease in job_leases:
            if final.queues.get(lease.queue, {}).get("rate"):
                starts[lease.queue].append(lease)
    for queue, queue_leases in sorted(starts.items()):
        limit, period = final.queues[queue]["rate"]["limit"], final.queues[queue]["rate"]["period"]
        queue_leases.sort(key=lambda lease: lease.start)
        rule.see(len(queue_leases))
        for i in range(len(queue_leases) - limit):
            window = queue_leases[i : i + limit + 1]
            spread = max(lease.granted_by for lease in window) - window[0].start
            if spread < period - tolerance:
                rule.fail(
                    f"queue {queue}: {limit + 1} leases granted within {spread:.3f} s, "
                    f"{limit} allowed per {period} s",
                    *(lease.grant for lease in window[:3]),
                )
                break


def _schedules(final: Final, tolerance: float, rule: Rule) -> None:
    slots: dict[str, list[float]] = defaultdict(list)
    for job in final.jobs.values():
        if job.get("schedule") in final.schedules and job.get("schedule_slot") is not None:
            slots[job["schedule"]].append(_time(job["schedule_slot"]))
    for name, step in final.schedules.items():
        fired = sorted(slots.get(name, []))
        rule.see(len(fired))
        for at, count in _counts(fired).items():
            if count > 1:
                rule.fail(
                    f"schedule {name}: slot {datetime.fromtimestamp(at).isoformat()} fired {count} times"
                )
        for earlier, later in zip(fired, fired[1:], strict=False):
            if later - earlier > step + tolerance:
                missing = round((later - earlier) / step) - 1
                rule.fail(
                    f"schedule {name}: {missing} slots missing after "
                    f"{datetime.fromtimestamp(earlier).isoformat()}"
                )


def _counts(values: Iterable[float]) -> dict[float, int]:
    counts: dict[float, int] = defaultdict(int)
    for value in values:
        counts[value] += 1
    return counts


def _dependencies(
    history: History, by_job: Mapping[int, list[Lease]], final: Final, tolerance: float, rule: Rule
) -> None:
    acked: dict[int, float] = {}  # a job's first ack that succeeded or may have: when it was sent
    for op in history:
        if op.op == "ack" and op.maybe:
            acked.setdefault(op.request["id"], op.sent)
    for job_id, job in sorted(final.jobs.items()):
        parents = job.get("depends_on")
        if not parents:
            continue
        rule.see()
        ended = {parent: final.jobs.get(parent, {}).get("status") for parent in parents}
        ran = set(ended.values()) == {"completed"}
        if ran and job["status"] not in ("completed", "dead"):
            rule.fail(f"job {job_id} is {job['status']}, though its parents all completed: {ended}")
        if not ran and job["status"] != "cancelled":
            rule.fail(f"job {job_id} is {job['status']}, though not all its parents completed: {ended}")
        leased = by_job.get(job_id, [])
        if not leased:
            continue
        first = leased[0]
        for parent in parents:
            done = acked.get(parent)
            if done is None or first.granted_by < done - tolerance:
                rule.fail(
                    f"job {job_id} was leased by {first.granted_by:.3f}, before its parent {parent} could "
                    f"have completed (its first ack sent at {done})",
                    first.grant,
                )


def _steps(history: History, final: Final, rule: Rule) -> None:
    writes: dict[tuple[int, str], list[Op]] = defaultdict(list)
    for op in history:
        if op.op == "step":
            writes[(op.job, op.request["name"])].append(op)
    for (job_id, name), ops in sorted(writes.items()):
        rule.see()
        kept = (final.jobs.get(job_id, {}).get("steps") or {}).get(name, _ABSENT)
        recorded = [op for op in ops if op.ok]
        if len(recorded) > 1:
            rule.fail(f"job {job_id} step {name}: recorded {len(recorded)} times", *recorded)
        if recorded and kept != recorded[0].request["result"]:
            rule.fail(f"job {job_id} step {name}: the job keeps {kept!r}, not the result recorded", *recorded)
        if kept is not _ABSENT and kept not in [op.request["result"] for op in ops if op.maybe]:
            rule.fail(
                f"job {job_id} step {name}: the job keeps {kept!r}, "
                "which no write that may have succeeded sent",
                *ops,
            )
        for op in ops:
            if op.status == 409 and op.body.get("code") == "conflict" and op.body.get("result") != kept:
                rule.fail(
                    f"job {job_id} step {name}: a 409 answered {op.body.get('result')!r}, "
                    f"the job keeps {kept!r}",
                    op,
                )


_ABSENT = object()


def _answers(history: History, rule: Rule) -> None:
    for op in history:
        rule.see()
        if op.status is not None and (op.status >= 500 and op.status != 503 or op.status in (400, 422)):
            rule.fail(f"{op.op} answered {op.status}", op)
