"""Workflows built in code: `Flow`, and `chain`, `group` and `chord` built on it.

    flow = jobq.Flow("checkout")
    charged = flow.add(charge.s(order=7))                       # a ref: "charge-1"
    rendered = flow.add(render_invoice.s(order=7))
    flow.add(send_invoice.s(order=7), after=[charged, rendered])  # runs once both completed
    flow.add(refund.s(order=7), after=[charged], run_if="failed")  # runs only if charge failed
    made = flow.submit(client)                                  # or: await flow.asubmit(async_client)
    made.ids["send_invoice-1"]                                  # each job's id, by ref

- A flow is a workflow's request (`POST /workflows`) written out job by job: `add` takes a signature
  (`task.s(...)`, its queue and options those of the task, or of `task.using(...)`), or a plain job
  mapping (`{"queue": ..., "payload": ..., "kind": ...}`) for work no task of this program describes.
- Each job has a ref, what its children name it by: given (`ref="charge"`), else made of its kind (or
  queue) and a count, `charge-1`, `charge-2`. `add` returns it.
- `after` names its parents: refs this flow returned before, and ids (or `Job`s) of jobs that exist
  already. A ref must be added before the jobs that name it, so a flow has no cycle by construction and
  an unknown ref is a ValueError at once; the service checks the rest (a job id that does not exist,
  limits) and refuses the whole workflow in words (`ValidationError`).
- `run_if` says what the parents must end as for the job to run (`completed`, the default; `finished`;
  `failed`); else it is cancelled.
- A workflow is made whole or not at all, in one request, 1-1000 jobs. Each job's handler reads what its
  parents returned with `jobq.parents()` / `jobq.parent_results()`.

`chain(a, b, c)` runs them one after the other, `group(a, b, c)` side by side, `chord(group, callback)`
the callback once all of the group completed (its results, in order: `jobq.parent_results()`). Each is a
`Flow`, to submit, or to add more to.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from jobq.client import AsyncClient, Client
from jobq.tasks import Signature
from jobq.types import Job, RunIf, WorkflowMade

__all__ = ["Flow", "chain", "chord", "group"]

ParentLike = str | int | Job  # a ref of the flow's own, or an existing job (its id)
MAX_JOBS = 1000  # jobs in one workflow, at most (the service's limit)


class Flow:
    """A workflow being built: jobs added one by one, each after the parents named; `submit` makes them
    all at once. `name` says what it is, for people and for `client.workflows(name=...)`."""

    def __init__(self, name: str | None = None) -> None:
        self.name = name
        self._jobs: dict[str, dict[str, Any]] = {}  # by ref, in the order added
        self._signatures: list[Signature] = []
        self._counts: dict[str, int] = {}

    def add(
        self,
        job: Signature | Mapping[str, Any],
        *,
        after: ParentLike | Iterable[ParentLike] = (),
        run_if: RunIf | str | None = None,
        ref: str | None = None,
    ) -> str:
        """Add a job; its ref. `job`: a signature (`task.s(...)`) or a job mapping (the fields of
        `Client.enqueue_many`'s jobs, without `dedup_key` or `debounce`). `after`: its parents, refs this
        flow gave and ids (or `Job`s) of existing jobs, one or a list. `run_if`: what the parents must
        end as for it to run (default `completed`: all of them completed). `ref`: its name in the flow,
        by default its kind (or queue) and a count (`charge-1`)."""
        if isinstance(job, Signature):
            self._signatures.append(job)
            body = job.job()
        else:
            body = dict(job)
        if "ref" in body or "depends_on" in body or "run_if" in body:
            raise ValueError("give a job's ref, parents and run_if to Flow.add (ref=, after=, run_if=)")
        for option in ("dedup_key", "debounce"):
            if body.get(option) is not None:
                raise ValueError(f"a workflow's jobs take no {option}")
        if len(self._jobs) >= MAX_JOBS:
            raise ValueError(f"a workflow has at most {MAX_JOBS} jobs")
        if ref is None:
            ref = self._new_ref(str(body.get("kind") or body.get("queue") or "job"))
        elif not ref or ref in self._jobs:
            raise ValueError(f"ref {ref!r} is {'taken in this flow' if ref else 'empty'}")
        parents = self._parents(after)
        if parents:
            body["depends_on"] = parents
            if run_if is not None:
                body["run_if"] = run_if
        elif run_if is not None:
            raise ValueError("run_if goes with parents (after=): it says what they must end as")
        self._jobs[ref] = {"ref": ref, **body}
        return ref

    def _new_ref(self, stem: str) -> str:
        count = self._counts.get(stem, 0)
        while True:
            count += 1
            ref = f"{stem}-{count}"
            if ref not in self._jobs:
                self._counts[stem] = count
                return ref

    def _parents(self, after: ParentLike | Iterable[ParentLike]) -> list[str | int]:
        given: Iterable[ParentLike] = [after] if isinstance(after, str | int | Job) else after
        parents: list[str | int] = []
        for parent in given:
            if isinstance(parent, Job):
                parent = parent.id
            if isinstance(parent, bool) or not isinstance(parent, str | int):
                raise TypeError(f"after= takes refs of this flow and job ids, not {parent!r}")
            if isinstance(parent, str) and parent not in self._jobs:
                known = ", ".join(self._jobs) or "none yet"
                raise ValueError(f"no job of this flow has ref {parent!r} (add it first; refs: {known})")
            if parent not in parents:
                parents.append(parent)
        return parents

    @property
    def refs(self) -> list[str]:
        """The refs of its jobs, in the order added."""
        return list(self._jobs)

    def jobs(self) -> list[dict[str, Any]]:
        """Its jobs as `Client.create_workflow` takes them, in the order added."""
        return [dict(job) for job in self._jobs.values()]

    def leaves(self) -> list[str]:
        """The refs of the jobs no other job of the flow depends on: where it ends."""
        named = {p for job in self._jobs.values() for p in job.get("depends_on", ()) if isinstance(p, str)}
        return [ref for ref in self._jobs if ref not in named]

    def copy(self, name: str | None = None) -> Flow:
        """A flow with the same jobs (and refs), to add more to; `name` if given, else this one's."""
        flow = Flow(self.name if name is None else name)
        flow._jobs = {ref: dict(job) for ref, job in self._jobs.items()}
        flow._signatures = list(self._signatures)
        flow._counts = dict(self._counts)
        return flow

    def __len__(self) -> int:
        return len(self._jobs)

    def __repr__(self) -> str:
        return f"Flow({self.name!r}, {len(self)} jobs)"

    def submit(self, client: Client | None = None, *, idempotency_key: str | None = None) -> WorkflowMade:
        """Make the workflow (`client.create_workflow`): all its jobs, or none. The answer has each job's
        id by ref (`made.ids`). `client` defaults to that of the first task added (its registry's)."""
        if client is None:
            client = self._signature("submit").task.tasks.client
        return client.create_workflow(self.jobs(), name=self.name, idempotency_key=idempotency_key)

    async def asubmit(
        self, client: AsyncClient | None = None, *, idempotency_key: str | None = None
    ) -> WorkflowMade:
        """`submit` through an `AsyncClient` (default: the first task's registry's)."""
        if client is None:
            client = self._signature("asubmit").task.tasks.async_client
        return await client.create_workflow(self.jobs(), name=self.name, idempotency_key=idempotency_key)

    def _signature(self, what: str) -> Signature:
        if not self._signatures:
            raise ValueError(f"Flow.{what}: no task was added to say which client to use; pass a client")
        return self._signatures[0]


def _flow_of(
    jobs: Iterable[Signature | Mapping[str, Any]] | Flow, name: str | None
) -> tuple[Flow, list[str]]:
    """A flow of `jobs` side by side (or a copy of a flow), and the refs where it ends."""
    if isinstance(jobs, Flow):
        flow = jobs.copy(name)
        return flow, flow.leaves()
    flow = Flow(name)
    return flow, [flow.add(job) for job in jobs]


def chain(*jobs: Signature | Mapping[str, Any], name: str | None = None) -> Flow:
    """A flow running `jobs` one after the other: each once the one before it completed (a failure
    cancels the rest). Its last job reads the one before's result with `jobq.parent_results()`."""
    flow = Flow(name)
    previous: list[ParentLike] = []
    for job in jobs:
        previous = [flow.add(job, after=previous)]
    return flow


def group(*jobs: Signature | Mapping[str, Any], name: str | None = None) -> Flow:
    """A flow running `jobs` side by side, none waiting for another."""
    return _flow_of(jobs, name)[0]


def chord(
    header: Iterable[Signature | Mapping[str, Any]] | Flow,
    callback: Signature | Mapping[str, Any],
    *,
    run_if: RunIf | str | None = None,
    name: str | None = None,
) -> Flow:
    """A flow running `header` (jobs side by side, or a flow, a `group` say), then `callback` once all of
    them completed (or as `run_if` says), after the header's last jobs (its leaves). The callback reads
    their results in the order they were added with `jobq.parent_results()`."""
    flow, ends = _flow_of(header, name)
    if not ends:
        raise ValueError("a chord needs jobs to wait for")
    flow.add(callback, after=ends, run_if=run_if)
    return flow
