"""The `jobq` command: the commands that talk to a running service (worker, enqueue, job, jobs, stats,
workers, dead, queues, schedules, workflows), and those other installed distributions add (the server's serve,
migrate, database-url and openapi).

Each command here takes `--url` ($JOBQ_URL, default http://127.0.0.1:8000) and `--token` ($JOBQ_TOKEN);
the ones that print answers take `--json` for scripts (the API's objects, one JSON document) instead of
tables for people. Exit status: 0 done, 1 the service refused (its detail on stderr), 2 bad usage, 3 the
service could not be reached or is unavailable.

The command line is the standard library's argparse, so that the client needs nothing else for it.

Commands of other distributions
-------------------------------
A distribution adds commands with entry points in the `jobq.commands` group, each added under the entry
point's name (`serve = "app.cli:serve"`). An entry point names an object (an instance, or a module) with:

- `help`: a `str`, the one line `jobq --help` lists the command with;
- `add_arguments(parser)`: adds the command's arguments to `parser`, the command's own
  `argparse.ArgumentParser` (`jobq NAME --help` describes it with the object's `description` if it has
  one, else with its help);
- `run(args)`: runs the command with the `argparse.Namespace` parsed, and returns its exit status (`None`
  for 0). It may raise `UsageError` for a mistake the parser cannot see (exit 2, with the command's usage),
  or `SystemExit`.

`Command(run, add_arguments)` is such an object, its help and description taken from `run`'s docstring.
An object with `help` and `commands` (a mapping of names to such objects) is a group of commands instead,
run as `jobq NAME COMMAND` (`Group` is one).

A command that cannot be loaded (a distribution installed without its dependencies, or one naming an
object that is not a command) is left out, with one line on stderr, and the others keep working; a name
already taken stays with the command that has it, the client's first. Only one distribution owns the
`jobq` script.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import re
import sys
import textwrap
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeAlias, TypeGuard, cast

from jobq.types import (
    FINISHED,
    NO_LIMIT,
    WORKFLOW_FINISHED,
    CatchUp,
    DeleteKeyResult,
    Job,
    JobqError,
    JobStatus,
    KeyView,
    NoLimit,
    QueueDetail,
    QueueRow,
    Rate,
    Schedule,
    Unauthorized,
    Unavailable,
    Workflow,
    WorkflowStatus,
)

# The HTTP clients and the runner are imported by the commands that use them: the commands other
# distributions add (`jobq serve`, `jobq migrate`) speak to no service and start without them.
if TYPE_CHECKING:
    from jobq.client import Client

EXIT_REFUSED, EXIT_USAGE, EXIT_UNAVAILABLE = 1, 2, 3

DEFAULT_URL = "http://127.0.0.1:8000"
# How a command retries (jobq.client.RetryPolicy's arguments): it gives up on an unreachable service
# after about 2 s (the worker keeps trying).
CLI_RETRY: dict[str, Any] = {"attempts": 4}


# --- commands, groups and the plug-in protocol -----------------------------------------------------


class UsageError(Exception):
    """A mistake in a command's arguments that its parser cannot see: `jobq` prints the command's usage
    and this message on stderr, and exits 2."""


class CommandLike(Protocol):
    """What an entry point of `jobq.commands` names to add one command (see the module's docstring)."""

    @property
    def help(self) -> str: ...

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int | None: ...


class GroupLike(Protocol):
    """What an entry point of `jobq.commands` names to add a group of commands."""

    @property
    def help(self) -> str: ...

    @property
    def commands(self) -> Mapping[str, CommandLike | GroupLike]: ...


Entry: TypeAlias = CommandLike | GroupLike


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    """A command that takes no arguments adds none."""


@dataclasses.dataclass(frozen=True)
class Command:
    """A command: `run` with the parsed arguments, which `add_arguments` declares. Its description (for
    `jobq NAME --help`) is `run`'s docstring, and its help (for `jobq --help`) that docstring's first
    sentence."""

    run: Callable[[argparse.Namespace], int | None]
    add_arguments: Callable[[argparse.ArgumentParser], None] = _no_arguments

    @property
    def description(self) -> str:
        # Docstrings mark code with backticks, which a terminal would show as they are: left out.
        return inspect.cleandoc(self.run.__doc__ or "").replace("`", "")

    @property
    def help(self) -> str:
        return _first_sentence(self.description)


@dataclasses.dataclass(frozen=True)
class Group:
    """Commands under one name: `jobq NAME COMMAND`."""

    help: str
    commands: Mapping[str, Entry]


def _first_sentence(text: str) -> str:
    """The first sentence of `text`, on one line: the help `jobq --help` lists a command with."""
    paragraph = " ".join(text.split("\n\n", 1)[0].split())
    return re.split(r"(?<=\.)\s+(?=[A-Z])", paragraph, maxsplit=1)[0]


def _is_group(entry: object) -> TypeGuard[GroupLike]:
    return isinstance(getattr(entry, "commands", None), Mapping)


NOT_A_COMMAND = "not a jobq command (it needs help, add_arguments and run: see jobq.cli)"


def _not_a_command(entry: object) -> str | None:
    """Why `entry` (a plug-in's object) is neither a command nor a group, if it is not."""
    if not isinstance(getattr(entry, "help", None), str):
        return NOT_A_COMMAND
    if _is_group(entry):
        for name, command in entry.commands.items():
            if (problem := _not_a_command(command)) is not None:
                return f"its command {name} is {problem}"
        return None
    if callable(getattr(entry, "add_arguments", None)) and callable(getattr(entry, "run", None)):
        return None
    return NOT_A_COMMAND


# --- talking to the service and printing answers ---------------------------------------------------

# The options of every command that talks to the service; also accepted before the command.
SERVICE_OPTIONS = ("--url", "--token")
# Namespace entries `jobq` reads and removes before a command's run sees the namespace.
_RUN, _PARSER, _TAKES_SERVICE = "jobq_run", "jobq_parser", "jobq_takes_service"
_URL_BEFORE, _TOKEN_BEFORE = "jobq_url_before", "jobq_token_before"


def _service_options(parser: argparse.ArgumentParser, as_json: bool = True) -> None:
    """--url and --token (their values from the line, else the environment, resolved by `_resolve`), and
    --json for a command that prints answers."""
    if as_json:
        parser.add_argument(
            "--json", dest="as_json", action="store_true", help="Print the answer as JSON, for scripts."
        )
    service = parser.add_argument_group("service")
    service.add_argument(
        "--url", metavar="URL", help=f"The jobq service [env: JOBQ_URL; default: {DEFAULT_URL}]."
    )
    service.add_argument("--token", metavar="TOKEN", help="Bearer token [env: JOBQ_TOKEN].")
    parser.set_defaults(**{_TAKES_SERVICE: True})


def _resolve(args: argparse.Namespace, url_before: str | None, token_before: str | None) -> None:
    """The service options of a command: its own, else those before the command, else the environment
    (where, as for an unset variable, an empty value is none)."""
    if args.url is None:
        args.url = url_before if url_before is not None else os.environ.get("JOBQ_URL") or DEFAULT_URL
    if args.token is None:
        args.token = token_before if token_before is not None else os.environ.get("JOBQ_TOKEN") or None


@contextmanager
def service(url: str, token: str | None) -> Iterator[Client]:
    """A client for one command; the service's refusals become an exit status and a line on stderr."""
    from jobq.client import Client, RetryPolicy

    try:
        with Client(url, token=token, retry=RetryPolicy(**CLI_RETRY)) as client:
            yield client
    except JobqError as exc:
        _refused(exc, token)


def _refused(exc: JobqError, token: str | None) -> NoReturn:
    """End the command on the service's refusal: its detail on stderr, in the command's own terms where
    the service speaks of HTTP (its `Authorization` header is this command's --token), and exit 3 when
    it is unavailable, 1 otherwise."""
    detail = exc.detail
    if isinstance(exc, Unauthorized):
        if token:
            detail = "the token given (--token or JOBQ_TOKEN) is not valid for this service"
        else:
            detail = "this service needs a token: pass --token or set JOBQ_TOKEN"
    print(f"jobq: {detail} ({exc.code})", file=sys.stderr)
    raise SystemExit(EXIT_UNAVAILABLE if isinstance(exc, Unavailable) else EXIT_REFUSED) from None


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _plain(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    return value


def print_json(value: Any) -> None:
    print(json.dumps(_plain(value), indent=2, ensure_ascii=False))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Aligned columns with a header; numbers to the right."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    numeric = [
        bool(rows) and all(isinstance(r[i], int | float) and not isinstance(r[i], bool) for r in rows)
        for i in range(len(headers))
    ]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if n else v.ljust(w) for v, w, n in zip(values, widths, numeric, strict=True)]
        return "  ".join(parts).rstrip()

    return "\n".join([line([h.upper() for h in headers]), *(line(r) for r in cells)])


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, datetime):
        return value.astimezone().strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def _seconds(value: float) -> str:
    return f"{value:.1f}s" if value < 100 else f"{value:.0f}s"


def _first_line(text: str | None, width: int = 72) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else "-"
    return line if len(line) <= width else line[: width - 1] + "…"


# --- producers and operators -----------------------------------------------------------------------


def _payload(text: str) -> Any:
    """The JSON of PAYLOAD_JSON, read from stdin for `-`: when the command runs, not while its arguments
    are parsed, so that `--help` never waits for stdin."""
    raw = sys.stdin.read() if text == "-" else text
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise UsageError(f"argument PAYLOAD_JSON: not JSON: {exc}") from None


def _payload_argument(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("payload_json", metavar="PAYLOAD_JSON", help=help)


# Exit statuses of a command given --wait: the job completed, it ended otherwise, or time ran out.
EXIT_COMPLETED, EXIT_FAILED, EXIT_UNFINISHED = 0, 1, 124  # 124: what timeout(1) exits with


def _wait_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wait",
        type=float,
        metavar="SECONDS",
        help="Wait up to this long for the job to finish, then print it. Exit status: 0 completed, "
        "1 dead or cancelled, 124 not finished in time.",
    )


def _waited(job: Job, as_json: bool) -> int:
    """Print a job waited for; the exit status says how it ended."""
    if as_json:
        print_json(job)
    else:
        print(_job_text(job))
    if job.status == JobStatus.COMPLETED:
        return EXIT_COMPLETED
    return EXIT_FAILED if job.status in FINISHED else EXIT_UNFINISHED


def _enqueue_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queue", metavar="QUEUE", help="Queue to add the job to.")
    _payload_argument(parser, "The job's payload, as JSON; - reads it from stdin.")
    parser.add_argument("--delay", type=float, metavar="SECONDS", help="Seconds before it may run.")
    parser.add_argument("--priority", type=int, metavar="N", help="Lower runs first [default: 0].")
    parser.add_argument(
        "--dedup-key", metavar="KEY", help="Skip it if an active job of the queue holds this key."
    )
    parser.add_argument(
        "--max-attempts", type=int, metavar="N", help="Tries before it goes dead [default: the queue's]."
    )
    parser.add_argument("--kind", help="What the job is (send_email), for workers to route it by.")
    parser.add_argument("--key", help="What flow control groups it by (a tenant, a customer).")
    _wait_option(parser)
    _service_options(parser)


def enqueue(args: argparse.Namespace) -> int | None:
    """Enqueue one job. Prints its id (or, for a taken dedup key, the job that holds it). With --wait,
    waits for the job to finish and prints it; the exit status says how it ended (see --wait)."""
    payload = _payload(args.payload_json)
    with service(args.url, args.token) as jobq:
        job = jobq.enqueue(
            args.queue,
            payload,
            delay=args.delay,
            priority=args.priority,
            dedup_key=args.dedup_key,
            max_attempts=args.max_attempts,
            kind=args.kind,
            key=args.key,
            wait=args.wait,
        )
    if args.wait is not None:
        return _waited(job, args.as_json)
    if args.as_json:
        print_json(job)
    elif job.duplicate:
        print(f"job {job.id} already holds dedup key {job.dedup_key!r} ({job.status}); nothing enqueued")
    else:
        when = f", runs at {_cell(job.run_at)}" if args.delay else ""
        print(f"enqueued job {job.id} on {job.queue}{when}")
    return None


def _json_block(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


def _job_text(job: Job) -> str:
    """A job for people: its fields aligned, then its last error, payload, result and progress."""
    head = f"job {job.id} on {job.queue}" + (f" ({job.kind})" if job.kind else "") + f": {job.status}"
    fields = [
        ("attempts", f"{job.attempts} of {job.max_attempts}"),
        ("priority", job.priority),
        ("run at", job.run_at),
        ("lease expires", job.lease_expires_at),
        ("dedup key", job.dedup_key),
        ("created", job.created_at),
        ("updated", job.updated_at),
        ("completed", job.completed_at),
    ]
    if job.depends_on is not None:  # only for jobs with parents: most have none
        parents = ", ".join(map(str, job.depends_on))
        fields.insert(1, ("depends on", f"{parents} (runs if {job.run_if or 'completed'})"))
    if job.workflow_id is not None:
        fields.insert(1, ("workflow", job.workflow_id))
    width = max(len(name) for name, _ in fields)
    lines = [head, *(f"  {name.ljust(width)}  {_cell(value)}" for name, value in fields)]
    if job.last_error:
        lines += ["last error:", job.last_error.rstrip()]
    lines += ["payload:", _json_block(job.payload)]
    # Null is "none": an ack without a result, no progress reported yet.
    lines += ["result:", "-" if job.result is None else _json_block(job.result)]
    lines += ["progress:", "-" if job.progress is None else _json_block(job.progress)]
    return "\n".join(lines)


def _job_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id", type=int, metavar="ID", help="The job's id.")
    _wait_option(parser)
    _service_options(parser)


def job_command(args: argparse.Namespace) -> int | None:
    """A job, whatever its state: its fields, payload, result (what its ack kept) and progress (what
    its worker last reported). With --wait, once it has finished."""
    with service(args.url, args.token) as jobq:
        found = jobq.get_job(args.job_id) if args.wait is None else jobq.wait(args.job_id, args.wait)
    if args.wait is not None:
        return _waited(found, args.as_json)
    if args.as_json:
        print_json(found)
    else:
        print(_job_text(found))
    return None


def _page_options(parser: argparse.ArgumentParser, most: int) -> None:
    """The options of a paged list (`jobs`, `dead list`), after its filters."""
    parser.add_argument("--limit", type=int, default=20, metavar="N", help=f"How many (1..{most}).")
    parser.add_argument("--before-id", type=int, metavar="ID", help="Older than this id (for the next page).")


def _jobs_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--queue", help="Only this queue's.")
    parser.add_argument(
        "--status", choices=[status.value for status in JobStatus], help="Only jobs in this status."
    )
    parser.add_argument("--kind", help="Only jobs of this kind.")
    parser.add_argument("--key", help="Only jobs of this key.")
    parser.add_argument(
        "--search",
        metavar="TEXT",
        help="Text to find, in any case, in the dedup key, the last error or the payload.",
    )
    _page_options(parser, 500)
    _service_options(parser)


def jobs_command(args: argparse.Namespace) -> None:
    """Jobs of any status, newest first, filtered and searched."""
    with service(args.url, args.token) as jobq:
        page = jobq.admin.jobs(
            args.queue,
            status=args.status,
            kind=args.kind,
            key=args.key,
            search=args.search,
            limit=args.limit,
            before_id=args.before_id,
        )
    if args.as_json:
        print_json(page)
        return
    if page.jobs:
        print(
            table(
                ["id", "queue", "kind", "status", "attempts", "updated", "last error"],
                [
                    [
                        j.id,
                        j.queue,
                        j.kind or "",
                        j.status,
                        j.attempts,
                        j.updated_at,
                        _first_line(j.last_error),
                    ]
                    for j in page.jobs
                ],
            )
        )
    else:
        print("no jobs" + (" in this page" if page.next_before_id is not None else ""))
    if page.next_before_id is not None:
        print(f"\nmore: add --before-id {page.next_before_id}")


_QUEUE_COLUMNS = ["queue", "pending", "scheduled", "running", "dead", "completed", "lag", "paused"]


def _queue_cells(row: QueueRow) -> list[Any]:
    lag = _seconds(row.oldest_pending_age_seconds)
    return [row.queue, row.pending, row.scheduled, row.running, row.dead, row.completed, lag, row.paused]


def _stats_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "queue", nargs="?", metavar="QUEUE", help="One queue, with its settings [default: all]."
    )
    _service_options(parser)


def stats(args: argparse.Namespace) -> None:
    """Counts per queue: pending (ready now), scheduled (later), running, dead, completed; lag is the
    age of the oldest ready job."""
    with service(args.url, args.token) as jobq:
        queue = args.queue
        answer: QueueDetail | list[QueueRow] = jobq.admin.queue(queue) if queue else jobq.admin.queues()
    if args.as_json:
        print_json(answer)
    elif isinstance(answer, QueueDetail):
        print(table(_QUEUE_COLUMNS, [_queue_cells(answer)]))
        s = answer.settings
        print(
            f"\nsettings: visibility_timeout {s.visibility_timeout:g}s, max_attempts {s.max_attempts}, "
            f"backoff {s.backoff_base:g}s doubling up to {s.backoff_cap:g}s, retention {s.retention:g}s"
        )
    elif answer:
        print(table(_QUEUE_COLUMNS, [_queue_cells(r) for r in answer]))
    else:
        print("no queues yet")


def workers_command(args: argparse.Namespace) -> None:
    """Workers that leased in the last hour (by the worker_id they send; `jobq worker` sends host:pid),
    and any holding a running job: queues, last seen, jobs leased and held now."""
    with service(args.url, args.token) as jobq:
        workers = jobq.admin.workers()
    if args.as_json:
        print_json(workers)
    elif workers:
        rows = [[w.worker_id, ",".join(w.queues), w.last_seen, w.leased, w.held] for w in workers]
        print(table(["worker", "queues", "last seen", "leased", "held"], rows))
    else:
        print("no worker has leased in the last hour")


# --- dead jobs -------------------------------------------------------------------------------------


def _dead_list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--queue", help="Only this queue's.")
    _page_options(parser, 1000)
    _service_options(parser)


def dead_list(args: argparse.Namespace) -> None:
    """Dead jobs, newest first, with their attempts and last error."""
    with service(args.url, args.token) as jobq:
        page = jobq.admin.dead_jobs(args.queue, limit=args.limit, before_id=args.before_id)
    if args.as_json:
        print_json(page)
        return
    if not page.jobs:
        print("no dead jobs")
        return
    rows: list[Job] = page.jobs
    print(
        table(
            ["id", "queue", "attempts", "died", "last error"],
            [[j.id, j.queue, j.attempts, j.updated_at, _first_line(j.last_error)] for j in rows],
        )
    )
    if page.next_before_id is not None:
        print(f"\nmore: jobq dead list --before-id {page.next_before_id}")


def _dead_retry_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("ids", nargs="*", type=int, metavar="ID", help="Dead job ids.")
    parser.add_argument("--queue", help="Every dead job of this queue (among the ids, if given).")
    _service_options(parser)


def dead_retry(args: argparse.Namespace) -> int | None:
    """Put dead jobs back to pending, attempts reset, to run now."""
    ids: list[int] = args.ids
    if not ids and not args.queue:
        raise UsageError("give job ids, --queue, or both")
    with service(args.url, args.token) as jobq:
        answer = jobq.admin.retry_dead(ids or None, queue=args.queue)
    if args.as_json:
        print_json(answer)
        return None
    print(f"retried {answer.retried}")
    if answer.skipped:
        print(f"left dead (an active job holds their dedup key): {', '.join(map(str, answer.skipped))}")
    given = len(set(ids))
    missed = given - answer.retried - len(answer.skipped)
    if missed > 0:  # ids that named no dead job (of the queue, with --queue)
        ids_given = f"{given} job id{'s' if given > 1 else ''} given"
        names = "names" if missed == 1 else "name"
        where = f" of queue {args.queue}" if args.queue else ""
        print(
            f"{missed} of {ids_given} {names} no dead job{where} (not dead, or no such job)", file=sys.stderr
        )
        return 1
    return None


def _dead_purge_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("ids", nargs="+", type=int, metavar="ID", help="Dead job ids.")
    _service_options(parser)


def dead_purge(args: argparse.Namespace) -> None:
    """Delete dead jobs for good."""
    purged = []
    with service(args.url, args.token) as jobq:
        for job_id in args.ids:
            purged.append(jobq.admin.purge_dead(job_id))
            if not args.as_json:
                print(f"purged {job_id}")
    if args.as_json:
        print_json(purged)


# --- queues ----------------------------------------------------------------------------------------


def _queue_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queue", metavar="QUEUE", help="The queue.")


def _one_queue_arguments(parser: argparse.ArgumentParser) -> None:
    _queue_argument(parser)
    _service_options(parser)


def _show_row(row: QueueRow, as_json: bool) -> None:
    if as_json:
        print_json(row)
    else:
        print(table(_QUEUE_COLUMNS, [_queue_cells(row)]))


def queues_pause(args: argparse.Namespace) -> None:
    """Stop leasing from a queue; enqueues still land."""
    with service(args.url, args.token) as jobq:
        _show_row(jobq.admin.pause(args.queue), args.as_json)


def queues_resume(args: argparse.Namespace) -> None:
    """Lease from a paused queue again."""
    with service(args.url, args.token) as jobq:
        _show_row(jobq.admin.resume(args.queue), args.as_json)


def _rate(text: str) -> Rate | NoLimit:
    """`100/60` as Rate(100, 60.0); `none` as NO_LIMIT (the type of a rate option)."""
    if text.strip().lower() == "none":
        return NO_LIMIT
    try:
        limit, period = text.split("/")
        return Rate(int(limit), float(period))
    except ValueError:
        raise argparse.ArgumentTypeError(f"give LIMIT/SECONDS (100/60) or none, not {text!r}") from None


def _seconds_option(
    parser: argparse.ArgumentParser, option: str, help: str, default: float | None = None
) -> None:
    parser.add_argument(option, type=float, default=default, metavar="SECONDS", help=help)


def _configure_arguments(parser: argparse.ArgumentParser) -> None:
    _queue_argument(parser)
    _seconds_option(parser, "--visibility-timeout", "Seconds a lease lasts.")
    parser.add_argument("--max-attempts", type=int, metavar="N", help="Tries before a job goes dead.")
    _seconds_option(parser, "--backoff-base", "Seconds before the first retry; doubles.")
    _seconds_option(parser, "--backoff-cap", "Longest wait between retries, seconds.")
    _seconds_option(parser, "--retention", "Seconds completed jobs are kept.")
    parser.add_argument(
        "--key-concurrency",
        type=int,
        metavar="N",
        help="Jobs of one key running at once (1: also in order); 0 removes the limit.",
    )
    parser.add_argument(
        "--fair", action=argparse.BooleanOptionalAction, help="Hand out ready jobs across keys in turn."
    )
    parser.add_argument(
        "--rate", type=_rate, help="LIMIT/SECONDS: leases of the queue per window; 'none' removes."
    )
    parser.add_argument(
        "--key-rate",
        type=_rate,
        metavar="RATE",
        help="LIMIT/SECONDS: leases of each key per window; 'none' removes.",
    )
    _service_options(parser)


def queues_configure(args: argparse.Namespace) -> None:
    """Change some of a queue's settings; the others keep their values."""
    with service(args.url, args.token) as jobq:
        detail = jobq.admin.configure_queue(
            args.queue,
            visibility_timeout=args.visibility_timeout,
            max_attempts=args.max_attempts,
            backoff_base=args.backoff_base,
            backoff_cap=args.backoff_cap,
            retention=args.retention,
            key_concurrency=NO_LIMIT if args.key_concurrency == 0 else args.key_concurrency,
            fair=args.fair,
            rate=args.rate,
            key_rate=args.key_rate,
        )
    if args.as_json:
        print_json(detail)
    else:
        # Flow-control settings only when set: most queues have none.
        flow = {"key_concurrency", "fair", "rate", "key_rate"}
        settings = dataclasses.asdict(detail.settings)
        settings = {k: v for k, v in settings.items() if k not in flow or v not in (None, False)}
        print(", ".join(f"{k} {_setting_text(v)}" for k, v in settings.items()))


def _setting_text(value: object) -> str:
    if isinstance(value, dict):  # a rate
        return f"{value['limit']}/{value['period']:g}s"
    if isinstance(value, float):
        return f"{value:g}"
    return "none" if value is None else str(value).lower()


def _keys_arguments(parser: argparse.ArgumentParser) -> None:
    _queue_argument(parser)
    parser.add_argument("--limit", type=int, default=20, metavar="N", help="Keys to list, at most.")
    _service_options(parser)


def queues_keys(args: argparse.Namespace) -> None:
    """A queue's keys with the most jobs waiting, and keys with limits of their own."""
    with service(args.url, args.token) as jobq:
        keys = jobq.admin.keys(args.queue, limit=args.limit)
    if args.as_json:
        print_json(keys)
        return
    rows = [
        [k.key, str(k.pending), str(k.running), _setting_text(k.concurrency), _rate_text(k.rate)]
        for k in keys
    ]
    print(table(["key", "pending", "running", "concurrency", "rate"], rows))


def _rate_text(rate: Rate | None) -> str:
    return "queue's" if rate is None else f"{rate.limit}/{rate.period:g}s"


def _set_key_arguments(parser: argparse.ArgumentParser) -> None:
    _queue_argument(parser)
    parser.add_argument("key", metavar="KEY", help="The key.")
    parser.add_argument(
        "--concurrency", type=int, metavar="N", help="The key's own concurrency (none: the queue's)."
    )
    parser.add_argument("--rate", type=_rate, help="LIMIT/SECONDS: the key's own rate (none: the queue's).")
    parser.add_argument("--delete", action="store_true", help="Remove the key's own limits.")
    _service_options(parser)


def queues_set_key(args: argparse.Namespace) -> None:
    """Give a key limits of its own in place of the queue's key concurrency and key rate (replacing what
    it had), or remove them with --delete."""
    with service(args.url, args.token) as jobq:
        if args.delete:
            result: DeleteKeyResult | KeyView = jobq.admin.delete_key(args.queue, args.key)
        else:
            own_rate = args.rate if isinstance(args.rate, Rate) else None
            result = jobq.admin.set_key(args.queue, args.key, concurrency=args.concurrency, rate=own_rate)
    if args.as_json:
        print_json(result)
    elif isinstance(result, KeyView):
        concurrency_text = _setting_text(result.concurrency).replace("none", "queue's")
        print(f"{args.key}: concurrency {concurrency_text}, rate {_rate_text(result.rate)}")
    else:
        print(f"{args.key}: the queue's limits")


# --- schedules -------------------------------------------------------------------------------------


def _schedule_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="The schedule.")


def _one_schedule_arguments(parser: argparse.ArgumentParser) -> None:
    _schedule_argument(parser)
    _service_options(parser)


def _show_schedule(schedule: Schedule, as_json: bool) -> None:
    if as_json:
        print_json(schedule)
    elif schedule.next_run_at is None:
        print(f"schedule {schedule.name}: paused")
    else:
        print(f"schedule {schedule.name}: next run at {_cell(schedule.next_run_at)}")


def schedules_list(args: argparse.Namespace) -> None:
    """Every schedule, by name, with its next and last run (in local time)."""
    with service(args.url, args.token) as jobq:
        found = jobq.admin.schedules()
    if args.as_json:
        print_json(found)
    elif found:
        rows = [[s.name, s.cron, s.timezone, s.queue, s.next_run_at, s.last_run_at, s.paused] for s in found]
        print(table(["name", "cron", "timezone", "queue", "next run", "last run", "paused"], rows))
    else:
        print("no schedules")


def _schedules_set_arguments(parser: argparse.ArgumentParser) -> None:
    _schedule_argument(parser)
    parser.add_argument(
        "cron",
        metavar="CRON",
        help="When: 5 fields (minute hour day month weekday), or 6 with a leading seconds field.",
    )
    _queue_argument(parser)
    _payload_argument(parser, "Each job's payload, as JSON; - reads it from stdin.")
    parser.add_argument(
        "--timezone",
        metavar="ZONE",
        help="The IANA time zone the times are in (Europe/Berlin) [default: UTC].",
    )
    parser.add_argument("--kind", help="What the jobs are (send_email), for workers to route by.")
    parser.add_argument("--priority", type=int, metavar="N", help="Lower runs first [default: 0].")
    parser.add_argument(
        "--max-attempts", type=int, metavar="N", help="Tries before a job goes dead [default: the queue's]."
    )
    parser.add_argument("--key", help="Kept with the schedule, for keyed flow control.")
    parser.add_argument(
        "--catch-up",
        choices=[catch_up.value for catch_up in CatchUp],
        help="For the times it missed: no job, one, or one each [default: once].",
    )
    parser.add_argument("--paused", action="store_true", help="Create it paused.")
    _service_options(parser)


def schedules_set(args: argparse.Namespace) -> None:
    """Create or replace a schedule: at each time CRON names, enqueue PAYLOAD_JSON on QUEUE. On a
    replace, options left out take their defaults, not the old values. Prints its next run."""
    payload = _payload(args.payload_json)
    with service(args.url, args.token) as jobq:
        schedule = jobq.admin.set_schedule(
            args.name,
            args.cron,
            args.queue,
            payload,
            timezone=args.timezone,
            kind=args.kind,
            priority=args.priority,
            max_attempts=args.max_attempts,
            key=args.key,
            catch_up=args.catch_up,
            paused=args.paused or None,
        )
    _show_schedule(schedule, args.as_json)


def schedules_pause(args: argparse.Namespace) -> None:
    """Stop enqueuing on a schedule until it is resumed."""
    with service(args.url, args.token) as jobq:
        _show_schedule(jobq.admin.pause_schedule(args.name), args.as_json)


def schedules_resume(args: argparse.Namespace) -> None:
    """Enqueue on a paused schedule again, from its next time after now (the paused times are not
    caught up). Prints its next run."""
    with service(args.url, args.token) as jobq:
        _show_schedule(jobq.admin.resume_schedule(args.name), args.as_json)


def schedules_trigger(args: argparse.Namespace) -> None:
    """Enqueue a schedule's job now, whatever its times. Prints the job's id."""
    with service(args.url, args.token) as jobq:
        schedule = jobq.admin.trigger_schedule(args.name)
    if args.as_json:
        print_json(schedule)
    else:
        print(f"enqueued job {schedule.job_id} on {schedule.queue}")


def schedules_delete(args: argparse.Namespace) -> None:
    """Delete a schedule; the jobs it enqueued stay."""
    with service(args.url, args.token) as jobq:
        deleted = jobq.admin.delete_schedule(args.name)
    if args.as_json:
        print_json(deleted)
    else:
        print(f"deleted schedule {args.name}")


# --- workflows -------------------------------------------------------------------------------------


def _workflow_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workflow_id", type=int, metavar="ID", help="The workflow's id.")


def _one_workflow_arguments(parser: argparse.ArgumentParser) -> None:
    _workflow_argument(parser)
    _service_options(parser)


def _workflows_list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--status", choices=[status.value for status in WorkflowStatus], help="Only workflows in this status."
    )
    parser.add_argument("--name", help="Only workflows of this name.")
    _page_options(parser, 500)
    _service_options(parser)


def workflows_list(args: argparse.Namespace) -> None:
    """Workflows, newest first, with their status as last seen, and when they were made and finished."""
    with service(args.url, args.token) as jobq:
        page = jobq.workflows(status=args.status, name=args.name, limit=args.limit, before_id=args.before_id)
    if args.as_json:
        print_json(page)
        return
    if page.workflows:
        rows = [[w.id, w.name, w.status, w.created_at, w.finished_at] for w in page.workflows]
        print(table(["id", "name", "status", "created", "finished"], rows))
    else:
        print("no workflows")
    if page.next_before_id is not None:
        print(f"\nmore: add --before-id {page.next_before_id}")


def _workflow_text(workflow: Workflow) -> str:
    """A workflow for people: its status and counts, then its jobs with their parents' refs."""
    name = f" {workflow.name}" if workflow.name else ""
    head = f"workflow {workflow.id}{name}: {workflow.status}"
    when = f"  created {_cell(workflow.created_at)}, finished {_cell(workflow.finished_at)}"
    counts = ", ".join(f"{status} {n}" for status, n in sorted(workflow.counts.items()))
    rows = [
        [j.ref, j.id, j.queue, j.kind, j.status, ", ".join(map(str, j.depends_on)) or None]
        for j in workflow.jobs
    ]
    jobs = table(["ref", "id", "queue", "kind", "status", "after"], rows) if rows else "no jobs left"
    return "\n".join([head, when, f"  jobs: {counts or 'none'}", "", jobs])


def _show_workflow(workflow: Workflow, as_json: bool) -> None:
    if as_json:
        print_json(workflow)
    else:
        print(_workflow_text(workflow))


def _workflows_show_arguments(parser: argparse.ArgumentParser) -> None:
    _workflow_argument(parser)
    parser.add_argument(
        "--wait",
        type=float,
        metavar="SECONDS",
        help="Wait up to this long for the workflow to finish, then print it. Exit status: 0 completed, "
        "1 failed or cancelled, 124 not finished in time.",
    )
    _service_options(parser)


def workflows_show(args: argparse.Namespace) -> int | None:
    """A workflow: its status, its jobs' counts by status, and its jobs, each with its status and the
    refs of its parents (ids for parents outside the workflow). With --wait, once it has finished."""
    with service(args.url, args.token) as jobq:
        if args.wait is None:
            workflow = jobq.get_workflow(args.workflow_id)
        else:
            workflow = jobq.wait_workflow(args.workflow_id, args.wait)
    _show_workflow(workflow, args.as_json)
    if args.wait is None or workflow.status == WorkflowStatus.COMPLETED:
        return None
    return EXIT_FAILED if workflow.status in WORKFLOW_FINISHED else EXIT_UNFINISHED


def workflows_cancel(args: argparse.Namespace) -> None:
    """Cancel a workflow: its waiting and pending jobs are cancelled; running ones finish, and their
    children are cancelled. Prints the workflow then."""
    with service(args.url, args.token) as jobq:
        _show_workflow(jobq.cancel_workflow(args.workflow_id), args.as_json)


def workflows_retry(args: argparse.Namespace) -> None:
    """Resume a failed workflow where it failed: its dead jobs run again (attempts reset), and the jobs
    cancelled because of them wait for them again. Prints the workflow then."""
    with service(args.url, args.token) as jobq:
        _show_workflow(jobq.retry_workflow(args.workflow_id), args.as_json)


# --- the worker ------------------------------------------------------------------------------------


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not in the range x>=1")
    return value


def _worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target",
        metavar="MODULE[:NAME]",
        help="What to run: module:function, a handler taking the leased job (plain, run in a thread, "
        "or async); module:registry, a jobq.Tasks registry; or a module, its one registry, else its "
        "functions as tasks named after them (each job runs the task its kind names).",
    )
    parser.add_argument(
        "-q",
        "--queue",
        action="append",
        help="Queue to work on; repeat it for several [default for tasks: their queues].",
    )
    parser.add_argument(
        "-c", "--concurrency", type=_at_least_one, default=1, metavar="N", help="Jobs run at once."
    )
    _seconds_option(parser, "--grace", "Seconds running jobs get to finish on SIGTERM.", 30.0)
    _seconds_option(
        parser, "--visibility-timeout", "Seconds a lease lasts before it is extended [default: the queue's]."
    )
    _seconds_option(parser, "--wait", "Seconds each lease request long-polls (max 60).", 20.0)
    _seconds_option(
        parser, "--status-interval", "Seconds between status lines in the log (off a terminal).", 10.0
    )
    parser.add_argument("--log-level", default="info", metavar="LEVEL", help="debug, info, warning or error.")
    _service_options(parser, as_json=False)


def worker(args: argparse.Namespace) -> int | None:
    """Run a handler, or tasks, on the jobs of queues: ack when it returns, nack with the error when it
    raises (jobq.Retry and jobq.Fail choose when it runs again, or make it dead now).

    SIGTERM or Ctrl-C stops leasing and lets running jobs finish for --grace seconds; jobs still
    running then are released to run again elsewhere. A second signal releases them at once."""
    import asyncio
    import logging

    from jobq.client import AsyncClient
    from jobq.serving import StatusLine, load_target, serve
    from jobq.tasks import Tasks
    from jobq.tracing import export_from_environment
    from jobq.worker import Worker

    queue: list[str] | None = args.queue
    try:
        handler = load_target(args.target, queue[0] if queue else "default")
    except (ImportError, AttributeError, ValueError, TypeError) as exc:
        print(f"jobq: cannot load {args.target}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not queue and not isinstance(handler, Tasks):
        print("jobq: name the queue to work on (--queue)", file=sys.stderr)
        return EXIT_USAGE

    status_line = StatusLine(sys.stderr) if sys.stderr.isatty() else None
    output = status_line or logging.StreamHandler(sys.stderr)
    output.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=args.log_level.upper(), handlers=[output], force=True)
    logging.getLogger("httpx").setLevel(logging.WARNING)

    async def main() -> None:
        _settle_garbage_collection()
        async with AsyncClient(args.url, token=args.token) as client:
            runner = Worker(
                handler,
                queue or None,
                client=client,
                concurrency=args.concurrency,
                wait=args.wait,
                visibility_timeout=args.visibility_timeout,
                grace=args.grace,
            )
            await serve(runner, status_every=args.status_interval, status_line=status_line)

    flush_spans = export_from_environment()
    try:
        asyncio.run(main())
    except JobqError as exc:
        _refused(exc, args.token)
    finally:
        if flush_spans is not None:
            flush_spans()
    return None


def _settle_garbage_collection() -> None:
    """As `jobq serve` does: set aside what loading the handlers built (gc.freeze), and let a lease of
    a thousand jobs be read before the collector runs at all, instead of walking the young jobs again
    every 700 allocations. Reference counting still frees everything at once; only cycles wait longer."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


# --- the command line ------------------------------------------------------------------------------

COMMANDS: Mapping[str, Entry] = {
    "worker": Command(worker, _worker_arguments),
    "enqueue": Command(enqueue, _enqueue_arguments),
    "job": Command(job_command, _job_arguments),
    "jobs": Command(jobs_command, _jobs_arguments),
    "stats": Command(stats, _stats_arguments),
    "workers": Command(workers_command, _service_options),
    "dead": Group(
        "Dead jobs: list, retry, purge.",
        {
            "list": Command(dead_list, _dead_list_arguments),
            "retry": Command(dead_retry, _dead_retry_arguments),
            "purge": Command(dead_purge, _dead_purge_arguments),
        },
    ),
    "queues": Group(
        "Queues: pause, resume, configure, and their keys' limits.",
        {
            "pause": Command(queues_pause, _one_queue_arguments),
            "resume": Command(queues_resume, _one_queue_arguments),
            "configure": Command(queues_configure, _configure_arguments),
            "keys": Command(queues_keys, _keys_arguments),
            "set-key": Command(queues_set_key, _set_key_arguments),
        },
    ),
    "schedules": Group(
        "Schedules: jobs enqueued at the times a cron expression names.",
        {
            "list": Command(schedules_list, _service_options),
            "set": Command(schedules_set, _schedules_set_arguments),
            "pause": Command(schedules_pause, _one_schedule_arguments),
            "resume": Command(schedules_resume, _one_schedule_arguments),
            "trigger": Command(schedules_trigger, _one_schedule_arguments),
            "delete": Command(schedules_delete, _one_schedule_arguments),
        },
    ),
    "workflows": Group(
        "Workflows: jobs made together, each run after its parents.",
        {
            "list": Command(workflows_list, _workflows_list_arguments),
            "show": Command(workflows_show, _workflows_show_arguments),
            "cancel": Command(workflows_cancel, _one_workflow_arguments),
            "retry": Command(workflows_retry, _one_workflow_arguments),
        },
    ),
}

COMMANDS_GROUP = "jobq.commands"


def add_commands(commands: dict[str, Entry]) -> None:
    """Add to `commands` those that installed distributions name in COMMANDS_GROUP, by name.

    One that cannot be loaded (say, a distribution installed without its dependencies), or that is not a
    command, is left out, with a line on stderr: the commands already there must keep working. A name
    already taken stays with the command that has it."""
    from importlib.metadata import entry_points

    failed: dict[str, list[str]] = {}
    for entry in sorted(entry_points(group=COMMANDS_GROUP), key=lambda entry: entry.name):
        if entry.name in commands:
            failed.setdefault(f"the name is taken ({entry.value})", []).append(entry.name)
            continue
        try:
            command = entry.load()
        except Exception as exc:  # noqa: BLE001 - whatever a plug-in's import raises
            failed.setdefault(f"{type(exc).__name__}: {exc}", []).append(entry.name)
            continue
        problem = _not_a_command(command)
        if problem is not None:
            failed.setdefault(problem, []).append(entry.name)
            continue
        commands[entry.name] = command
    for reason, names in failed.items():
        _left_out(names, reason)


def _left_out(names: list[str], reason: str) -> None:
    print(f"jobq: left out {', '.join(names)}: {reason}", file=sys.stderr)


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's help, keeping the paragraphs of a description (a docstring's blank lines) and showing
    the default of an argument that has one."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = [" ".join(paragraph.split()) for paragraph in text.strip().split("\n\n")]
        return "\n\n".join(
            textwrap.fill(p, width, initial_indent=indent, subsequent_indent=indent) for p in paragraphs
        )

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "[default" in text:
            return action.help
        return f"{text} [default: %(default)s]"


class _Version(argparse.Action):
    """--version: the client's version, looked up only when asked for (importlib.metadata reads the
    installed distributions, which most commands need not)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> NoReturn:
        import jobq

        print(f"jobq {jobq.__version__}")
        parser.exit()


def _root_parser(commands: Mapping[str, Entry]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jobq",
        description="jobq: an HTTP job queue on PostgreSQL.",
        epilog="--url and --token may also come before the command (jobq --url URL stats); the command's own "
        "win. Exit status: 0 done, 1 the service refused, 2 bad usage, 3 the service is unreachable or "
        "unavailable.",
        formatter_class=_HelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--version", action=_Version, help="Print jobq's version and exit.")
    before = parser.add_argument_group("service, for the commands that talk to it")
    before.add_argument(
        "--url", dest=_URL_BEFORE, metavar="URL", help="The jobq service, as the command's --url."
    )
    before.add_argument(
        "--token", dest=_TOKEN_BEFORE, metavar="TOKEN", help="Bearer token, as the command's --token."
    )
    parser.set_defaults(**{_RUN: None, _PARSER: parser})
    _add_parsers(parser, commands)
    return parser


def _add_parsers(parent: argparse.ArgumentParser, commands: Mapping[str, Entry]) -> None:
    """A parser under `parent` for each of `commands` (and, for a group, for each of its commands)."""
    subparsers = parent.add_subparsers(title="commands", metavar="COMMAND")
    for name, entry in commands.items():
        try:
            parser = _add_parser(subparsers, name, entry)
        except Exception as exc:  # noqa: BLE001 - whatever a plug-in's add_arguments raises
            _left_out([f"{parent.prog} {name}".removeprefix("jobq ")], f"{type(exc).__name__}: {exc}")
            continue
        if _is_group(entry):
            _add_parsers(parser, entry.commands)


def _add_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser], name: str, entry: Entry
) -> argparse.ArgumentParser:
    """The parser of the command (or group) `entry`. A command's arguments go on a parser of their own
    first, the parent of the one the command line uses: so a plug-in whose add_arguments raises is left out
    like one that cannot be imported, instead of half added."""
    own = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    run = None
    if not _is_group(entry):
        command = cast(CommandLike, entry)
        command.add_arguments(own)
        run = command.run
    parser = subparsers.add_parser(
        name,
        parents=[own],
        # argparse fills in %(...)s in the help it lists, so a % of the text itself is doubled.
        help=entry.help.replace("%", "%%"),
        description=getattr(entry, "description", None) or entry.help,
        formatter_class=_HelpFormatter,
        allow_abbrev=False,
    )
    parser.set_defaults(**{_RUN: run, _PARSER: parser})
    return parser


def _command_named(args: Sequence[str]) -> str | None:
    """The first word of `args` after the service options given before the command: the command's name,
    if they name one."""
    rest = list(args)
    while rest and rest[0].split("=", 1)[0] in SERVICE_OPTIONS:
        option = rest.pop(0)
        if "=" not in option and rest:
            rest.pop(0)
    return rest[0] if rest else None


def _run(args: argparse.Namespace, unknown: list[str]) -> int:
    """Run the command `args` name, with its own arguments only."""
    options = vars(args)
    run: Callable[[argparse.Namespace], int | None] | None = options.pop(_RUN)
    parser: argparse.ArgumentParser = options.pop(_PARSER)
    if unknown:
        # Said by the command's parser, with its usage: the root's knows nothing of the command's options.
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    url_before, token_before = options.pop(_URL_BEFORE), options.pop(_TOKEN_BEFORE)
    if run is None:  # `jobq`, or a group, without a command
        parser.print_help()
        return EXIT_USAGE
    if options.pop(_TAKES_SERVICE, False):
        _resolve(args, url_before, token_before)
    elif url_before is not None or token_before is not None:
        given = "--url" if url_before is not None else "--token"
        parser.error(f"{given} is for the commands that talk to the service, not {parser.prog}")
    try:
        return run(args) or 0
    except UsageError as mistake:
        parser.error(str(mistake))


def _exit_status(code: object) -> int:
    """The exit status SystemExit(code) stands for, as Python itself reads it (a message: 1, on stderr)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def invoke(args: Sequence[str]) -> int:
    """Run the `jobq` command line `args` (without the program's name) in this process, and return its
    exit status.

    The plug-ins are loaded only when `args` do not name one of the client's commands: a name taken
    stays with its owner, and so a command of the client (or `--version`) needs none of them."""
    commands = dict(COMMANDS)
    if _command_named(args) not in (*commands, "--version"):
        add_commands(commands)
    parser = _root_parser(commands)
    try:
        return _run(*parser.parse_known_args(args))
    except SystemExit as stop:
        return _exit_status(stop.code)
    except KeyboardInterrupt:
        print("\nAborted!", file=sys.stderr)
        return 1


def main() -> NoReturn:
    """The `jobq` console script."""
    try:
        status = invoke(sys.argv[1:])
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader of the output went away (`jobq jobs | head -1`): stop quietly, and keep Python from
        # failing again on the flush of stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = 1
    sys.exit(status)
