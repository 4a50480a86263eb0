"""The job state machine as data (app/core/states.py): every statement of app/db/sql that writes a status is
in ``MOVES``, every status written in the SQL is a job status, the table in app/core/states.py's docstring
says what ``MOVES`` says, and the client knows the same statuses. tests/service/test_states.py runs each move
against a real database."""

from __future__ import annotations

import importlib
import pkgutil
import re
from typing import Any

from app.core import states
from app.core.states import JobStatus
from app.db import sql as q
from app.db.sql import sqs as sq
from tests.helpers import front_claim_statements, function_body

# What makes a statement a status change: it sets `status`, or inserts or deletes jobs. A workflow's status
# (jobq.workflows) is not a job's.
CHANGES_STATUS = re.compile(
    r"SET\s+status\s*=|(INSERT\s+INTO|DELETE\s+FROM)\s+jobq\.jobs(_history\w*)?\b", re.IGNORECASE
)
WORKFLOW_STATUS = re.compile(r"UPDATE\s+jobq\.workflows\s+SET\s+status\s*=", re.IGNORECASE)


# A statement that calls a function of jobq's schema changes what the function's statements change.
CALLED = {
    q.LEASE_FLOW_FRONT.name: "".join(query.text for query in front_claim_statements()),
    q.AWAIT_EVENT.name: function_body("jobq.await_event"),
    q.SEND_EVENT.name: function_body("jobq.send_event"),
}


def changes_status(query: q.Query) -> bool:
    return bool(CHANGES_STATUS.search(WORKFLOW_STATUS.sub("", CALLED.get(query.name, query.text))))


def defined(module: Any) -> dict[str, q.Query]:
    return {name: value for name, value in vars(module).items() if isinstance(value, q.Query)}


def test_every_status_change_is_in_the_table():
    changing = {query.name for query in defined(q).values() if changes_status(query)}
    tabled = {move.statement for move in states.MOVES if move.statement in vars(q)}
    # Statements that only ever keep a job's status write none.
    keeping = tabled - {move.statement for move in states.MOVES if move.before != move.after}
    assert keeping == {"EXTEND", "RUN_NOW", "RETURN_DEAD_LETTERS"}
    assert changing == {getattr(q, name).name for name in tabled - keeping}
    # ...and none among the SQS API's own.
    assert not [
        name
        for name, query in defined(sq).items()
        if changes_status(query) and query not in defined(q).values()
    ]


def test_the_package_exports_every_statement():
    """Callers, and the checks above, see the statements through the package (`from app.db import sql as
    q`): every statement of every topic module is there, under its name. The SQS API's own are not."""
    for module in pkgutil.iter_modules(q.__path__):
        topic = importlib.import_module(f"{q.__name__}.{module.name}")
        statements = {
            name: value
            for name, value in vars(topic).items()
            if isinstance(value, q.Query)
            or (isinstance(value, dict) and value and all(isinstance(v, q.Query) for v in value.values()))
        }
        if module.name == "sqs":
            assert not [name for name, value in statements.items() if vars(q).get(name) is value]
        else:
            assert {name: vars(q).get(name) for name in statements} == statements, module.name


def test_every_status_written_in_the_sql_is_a_job_status():
    """The SQL spells statuses as literals; on each line that names `status`, every literal is one
    (notification channels aside)."""
    literals = {
        literal
        for query in defined(q).values()
        for line in query.text.splitlines()
        if re.search(r"\bstatus\b", line)
        for literal in re.findall(r"'([a-z_]+)'", re.sub(r"pg_notify\('\w+'", "", line))
    }
    assert {"pending", "running", "completed", "dead", "cancelled"} <= literals <= set(JobStatus)


def states_table() -> dict[JobStatus, tuple[set[str], set[str]]]:
    """The table in app/core/states.py's docstring: status -> (led in by, led out by), each statement with
    its note in parentheses, if any."""
    lines = states.__doc__.splitlines()
    rules = [i for i, line in enumerate(lines) if line.startswith("=========")]
    widths = [len(column) for column in lines[rules[0]].split("  ")]
    starts = [sum(widths[:i]) + 2 * i for i in range(3)]
    rows: dict[str, list[str]] = {}
    status = ""
    for line in lines[rules[1] + 1 : rules[2]]:
        cells = [line[start : start + width].strip() for start, width in zip(starts, widths, strict=True)]
        status = cells[0] or status
        row = rows.setdefault(status, ["", ""])
        row[0], row[1] = f"{row[0]} {cells[1]}", f"{row[1]} {cells[2]}"

    def names(cell: str) -> set[str]:
        # Commas outside parentheses part the statements.
        return {" ".join(name.split()) for name in re.split(r",(?![^(]*\))", cell) if name.strip()}

    return {JobStatus(status): (names(into), names(out)) for status, (into, out) in rows.items()}


def labels(moves: tuple[states.Move, ...]) -> set[str]:
    """Each statement of `moves` once, with the case of its moves when they all have the same one."""
    cases: dict[str, set[str]] = {}
    for move in moves:
        cases.setdefault(move.statement, set()).add(move.when)
    labelled = set()
    for name, whens in cases.items():
        (when,) = whens if len(whens) == 1 else {""}
        labelled.add(f"{name} ({when})" if when else name)
    return labelled


def test_the_states_table_says_what_moves_says():
    assert states_table() == {
        status: (labels(states.led_in(status)), labels(states.led_out(status))) for status in JobStatus
    }


def test_the_client_knows_the_same_statuses():
    import jobq.types

    assert {status.value for status in jobq.types.JobStatus} == {status.value for status in JobStatus}
