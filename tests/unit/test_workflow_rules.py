"""The rules of workflows without a database: a graph's refs and cycles (app/service/workflows.py,
check_graph), and a workflow's status from its jobs' (app/core/states.py, workflow_status)."""

from __future__ import annotations

import pytest

from app.core.errors import Invalid
from app.core.states import JobStatus, WorkflowStatus, workflow_status
from app.service.arguments import WorkflowJob
from app.service.workflows import check_graph


def job(ref: str, *parents: str | int) -> WorkflowJob:
    return WorkflowJob(ref, "q", None, depends_on=list(parents) or None)


def test_a_graph_without_a_cycle_passes():
    check_graph([job("a"), job("b", "a"), job("c", "a", "b"), job("d", "c", 42)])


def test_a_chain_of_a_thousand_is_checked_without_recursion():
    check_graph([job("0")] + [job(str(i), str(i - 1)) for i in range(1, 1000)])
    with pytest.raises(Invalid, match="cycle"):
        check_graph([job("0", "999")] + [job(str(i), str(i - 1)) for i in range(1, 1000)])


@pytest.mark.parametrize(
    ("jobs", "words"),
    [
        ([job("a"), job("b"), job("a")], "jobs[2].ref 'a' is used twice (also jobs[0])"),
        ([job("a", "x"), job("b", "y", "x")], "refs that are no job of the workflow: 'x', 'y'"),
        ([job("a", "b"), job("b", "a")], "depends_on makes a cycle: 'a' -> 'b' -> 'a'"),
        ([job("a"), job("b", "a", "c"), job("c", "b")], "depends_on makes a cycle: 'b' -> 'c' -> 'b'"),
        ([job("a", "a")], "depends_on makes a cycle: 'a' -> 'a'"),
    ],
)
def test_a_bad_graph_is_named(jobs, words):
    with pytest.raises(Invalid) as refused:
        check_graph(jobs)
    assert words in str(refused.value)


W, P, R, C, D, X = JobStatus


@pytest.mark.parametrize(
    ("statuses", "status"),
    [
        ([C, C], WorkflowStatus.COMPLETED),
        ([C, W], WorkflowStatus.RUNNING),
        ([D, P], WorkflowStatus.RUNNING),
        ([D, R], WorkflowStatus.RUNNING),
        ([C, D], WorkflowStatus.FAILED),
        ([C, X], WorkflowStatus.FAILED),
        ([], WorkflowStatus.COMPLETED),
    ],
)
def test_a_workflows_status_is_its_jobs(statuses, status):
    assert workflow_status(statuses) == status
    assert workflow_status(statuses, cancelled=True) == WorkflowStatus.CANCELLED
