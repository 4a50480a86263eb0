"""The history checker's rules (chaos/checker.py) on histories written by hand: each rule passes a history
that keeps the promise and reports the one that breaks it, naming the operations."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from chaos.checker import Final, check
from chaos.history import FAIL, INFO, OK, History, Op, outcome

T0 = 1_800_000_000.0
VT = 2.0


def at(seconds: float) -> str:
    return datetime.fromtimestamp(T0 + seconds, UTC).isoformat()


class Script:
    """A history under construction: each call one operation, sent at `t` seconds after T0."""

    def __init__(self) -> None:
        self.history = History()

    def op(
        self,
        op: str,
        t: float,
        request: dict[str, Any],
        status: int | None,
        body: Any = None,
        took: float = 0.01,
    ) -> Op:
        record = Op("p", op, request, T0 + t, t, T0 + t + took, t + took, status, outcome(status, body), body)
        return self.history.add(record)

    def enqueue(self, t: float, uid: str, job_id: int | None, status: int | None = 201) -> None:
        self.op(
            "enqueue", t, {"queue": "q", "payload": {"uid": uid}}, status, {"id": job_id} if job_id else None
        )

    def lease(
        self, t: float, job_id: int, token: str, key: str | None = None, queue: str = "q", took: float = 0.01
    ) -> None:
        """A lease whose claim began at `t` (its deadline t + VT) and was answered `took` seconds later."""
        job = {"id": job_id, "queue": queue, "key": key, "lease_token": token, "lease_expires_at": at(t + VT)}
        self.op("lease", t, {"queue": queue, "visibility_timeout": VT}, 200, {"jobs": [job]}, took)

    def ack(self, t: float, job_id: int, token: str, status: int | None = 200) -> None:
        self.op("ack", t, {"id": job_id, "lease_token": token}, status, {"id": job_id})

    def done(self, t: float, job_id: int, token: str, key: str | None = None, queue: str = "q") -> None:
        self.lease(t, job_id, token, key, queue)
        self.ack(t + 0.1, job_id, token)


def job(status: str = "completed", uid: str | None = None, **more: Any) -> dict[str, Any]:
    return {"status": status, "queue": "q", "key": None, "uid": uid, **more}


def violations(script: Script, final: Final) -> dict[str, int]:
    report = check(script.history, final)
    return {name: len(rule.violations) for name, rule in report.rules.items() if rule.violations}


def test_outcomes_follow_the_answer():
    assert outcome(201, {}) == OK
    assert outcome(409, {}) == FAIL
    assert outcome(503, {"nothing_done": True}) == FAIL
    assert outcome(503, {}) == INFO
    assert outcome(None, "ReadTimeout") == INFO
    assert outcome(500, {}) == INFO


def test_a_clean_history_passes():
    s = Script()
    s.enqueue(0, "a", 1)
    s.done(1, 1, "t1")
    assert violations(s, Final({1: job(uid="a")})) == {}


def test_an_acknowledged_enqueue_missing_or_doubled_is_reported():
    s = Script()
    s.enqueue(0, "a", 1)
    s.enqueue(0.1, "b", None, status=None)  # unknown: may exist or not
    s.enqueue(0.2, "c", None, status=413)
    assert violations(s, Final({})) == {"enqueues": 1}  # "a" lost; "b" may be missing
    assert violations(s, Final({1: job("dead", uid="a")})) == {}
    doubled = {1: job("dead", uid="a"), 2: job("dead", uid="a")}
    assert violations(s, Final(doubled)) == {"enqueues": 1}
    refused = {1: job("dead", uid="a"), 3: job("dead", uid="c")}
    assert violations(s, Final(refused)) == {"enqueues": 1}
    phantom = {1: job("dead", uid="a"), 4: job("dead", uid="z")}
    assert violations(s, Final(phantom))["enqueues"] == 1


def test_a_job_left_unfinished_is_reported():
    s = Script()
    s.enqueue(0, "a", 1)
    assert violations(s, Final({1: job("pending", uid="a")})) == {"final": 1}


def test_two_live_leases_of_one_job_are_reported():
    s = Script()
    s.enqueue(0, "a", 1)
    s.lease(1, 1, "t1")  # live until 3 at least
    s.lease(2, 1, "t2")
    s.ack(2.1, 1, "t2")
    assert violations(s, Final({1: job(uid="a")})) == {"leases": 1}


def test_a_lease_after_the_deadline_or_a_release_is_fine():
    s = Script()
    s.enqueue(0, "a", 1)
    s.lease(1, 1, "t1")
    s.lease(3.5, 1, "t2")  # after t1's deadline (3)
    s.op(
        "release", 3.6, {"items": [{"id": 1, "lease_token": "t2"}]}, 200, {"results": [{"id": 1, "ok": True}]}
    )
    s.done(3.7, 1, "t3")
    assert violations(s, Final({1: job(uid="a")})) == {}


def test_a_claim_begun_before_a_deadline_and_answered_after_it_is_no_overlap():
    """A claim's `now()` is its transaction's start: over a slow network it begins before the last lease's
    deadline and takes the job after it, so its lease seems to start early."""
    s = Script()
    s.enqueue(0, "a", 1)
    s.lease(1, 1, "t1")  # live until 3
    s.lease(2.9, 1, "t2", took=0.3)  # began at 2.9, answered at 3.2
    s.ack(3.3, 1, "t2")
    assert violations(s, Final({1: job(uid="a")})) == {}
    s.lease(2.5, 1, "t3", took=0.1)  # surely granted by 2.6, while t1 was live, and live when t2 was
    assert violations(s, Final({1: job(uid="a")})) == {"leases": 2}


def test_an_extended_lease_is_live_until_its_new_deadline():
    s = Script()
    s.enqueue(0, "a", 1)
    s.lease(1, 1, "t1")
    s.op("extend", 2.5, {"id": 1, "lease_token": "t1"}, 200, {"id": 1, "lease_expires_at": at(4.5)})
    s.done(3.5, 1, "t2")  # before t1's extended deadline
    assert violations(s, Final({1: job(uid="a")})) == {"leases": 1}


def test_a_stale_token_that_succeeds_is_reported():
    s = Script()
    s.enqueue(0, "a", 1)
    s.lease(1, 1, "t1")
    s.lease(3.5, 1, "t2")
    s.ack(4, 1, "t1")  # after t2 began: fencing must refuse it
    assert violations(s, Final({1: job(uid="a")})) == {"leases": 1}


def test_two_acks_under_two_leases_and_a_completed_job_never_acked():
    s = Script()
    s.enqueue(0, "a", 1)
    s.done(1, 1, "t1")
    s.done(4, 1, "t2")  # a completed job leased again: its second ack must have been refused
    assert violations(s, Final({1: job(uid="a")})) == {"acks": 1}
    s = Script()
    s.enqueue(0, "a", 1)
    s.lease(1, 1, "t1")
    s.ack(1.1, 1, "t1", status=409)
    assert violations(s, Final({1: job(uid="a")})) == {"acks": 1}
    s = Script()
    s.enqueue(0, "a", 1)
    s.lease(1, 1, "t1")
    s.ack(1.1, 1, "t1", status=None)  # unknown: may have completed it
    assert violations(s, Final({1: job(uid="a")})) == {}


def test_key_concurrency_and_order():
    queues = {"q": {"key_concurrency": 1}}
    s = Script()
    s.enqueue(0, "a", 1)
    s.enqueue(0, "b", 2)
    s.done(1, 1, "t1", key="k")
    s.done(1.5, 2, "t2", key="k")
    final = Final({1: job(uid="a"), 2: job(uid="b")}, queues)
    assert violations(s, final) == {}
    s = Script()
    s.enqueue(0, "a", 1)
    s.enqueue(0, "b", 2)
    s.lease(1, 1, "t1", key="k")
    s.lease(1.05, 2, "t2", key="k")  # while job 1 is live: two at once, and out of order
    s.ack(1.2, 1, "t1")
    s.ack(1.2, 2, "t2")
    assert violations(s, Final({1: job(uid="a"), 2: job(uid="b")}, queues)) == {"key_concurrency": 2}
    s = Script()
    s.enqueue(0, "a", 1)
    s.enqueue(0, "b", 2)
    s.done(1, 2, "t2", key="k")  # the later job first
    s.done(2, 1, "t1", key="k")
    assert violations(s, Final({1: job(uid="a"), 2: job(uid="b")}, queues)) == {"key_concurrency": 1}
    s.history.ops.clear()
    queues["q"]["key_concurrency"] = 2  # two at once allowed, in any order
    assert violations(s, Final({}, queues)) == {}


def test_rate_windows():
    queues = {"q": {"rate": {"limit": 2, "period": 1}}}
    s = Script()
    for n, t in enumerate([1.0, 1.5, 2.1, 2.6]):
        s.enqueue(0, str(n), n + 1)
        s.done(t, n + 1, f"t{n}")
    final = Final({n + 1: job(uid=str(n)) for n in range(4)}, queues)
    assert violations(s, final) == {}
    s.done(2.7, 1, "again")  # a third lease within [2.1, 3.1)
    assert violations(s, final)["rate"] == 1


def test_schedule_slots_once_each_and_none_missing():
    def slots(*seconds: float) -> dict[int, dict[str, Any]]:
        return {n: job("dead", schedule="tick", schedule_slot=at(t)) for n, t in enumerate(seconds)}

    assert violations(Script(), Final(slots(1, 2, 3), schedules={"tick": 1.0})) == {}
    assert violations(Script(), Final(slots(1, 2, 2, 3), schedules={"tick": 1.0})) == {"schedules": 1}
    assert violations(Script(), Final(slots(1, 2, 5), schedules={"tick": 1.0})) == {"schedules": 1}


def test_steps_are_recorded_once_and_kept():
    s = Script()
    s.enqueue(0, "a", 1)
    s.lease(1, 1, "t1")
    step = {"lease_token": "t1", "name": "charge"}
    s.op("step", 1.1, {**step, "result": 1}, 200, {"recorded": True}).job = 1
    s.op("step", 1.2, {**step, "result": 2}, 409, {"code": "conflict", "result": 1}).job = 1
    s.ack(1.3, 1, "t1")
    assert violations(s, Final({1: job(uid="a", steps={"charge": 1})})) == {}
    assert violations(s, Final({1: job(uid="a", steps={"charge": 2})})) == {"steps": 3}


def test_a_500_or_a_request_refused_as_invalid_is_reported():
    s = Script()
    s.op("lease", 1, {"queue": "q", "visibility_timeout": VT}, 500, {})
    s.op("lease", 1, {"queue": "q", "visibility_timeout": VT}, 503, {})
    s.op("extend", 1, {"id": 1, "lease_token": "t"}, 422, {})
    assert violations(s, Final({})) == {"answers": 2}


def test_the_history_is_written_and_read_back(tmp_path):
    s = Script()
    s.enqueue(0, "a", 1)
    s.done(1, 1, "t1")
    s.history.write(tmp_path / "h.jsonl")
    again = History.read(tmp_path / "h.jsonl")
    assert [op.brief() for op in again] == [op.brief() for op in s.history]
    assert violations(Script(), Final({})) == {}


def test_a_child_runs_once_its_parents_completed_and_is_cancelled_otherwise():
    s = Script()
    s.enqueue(0, "a", 1)
    s.enqueue(0, "b", 2)
    s.done(1, 1, "t1")
    s.done(2, 2, "t2")  # after its parent's ack
    final = {1: job(uid="a"), 2: job(uid="b", depends_on=[1])}
    assert violations(s, Final(final)) == {}
    assert violations(s, Final({**final, 1: job("dead", uid="a")})) == {"dependencies": 1, "acks": 1}
    assert violations(s, Final({**final, 2: job("cancelled", uid="b", depends_on=[1])})) == {
        "dependencies": 1,
        "acks": 1,
    }
    s = Script()
    s.enqueue(0, "a", 1)
    s.enqueue(0, "b", 2)
    s.done(1, 2, "t2")  # before its parent's ack
    s.done(2, 1, "t1")
    assert violations(s, Final(final)) == {"dependencies": 1}


def test_a_claim_begun_first_may_take_the_job_last():
    """Two claims of one job over a slow network: the one begun first took it after the other had
    released it. Both succeeded at what they did under their leases; no order of the two is proven, so
    no violation is."""
    s = Script()
    s.enqueue(0, "a", 1)
    s.lease(1.0, 1, "slow", took=1.0)  # began at 1.0, answered at 2.0
    s.lease(1.2, 1, "fast")
    s.op(
        "release",
        1.25,
        {"items": [{"id": 1, "lease_token": "fast"}]},
        200,
        {"results": [{"id": 1, "ok": True}]},
    )
    s.ack(2.1, 1, "slow")
    assert violations(s, Final({1: job(uid="a")})) == {}
