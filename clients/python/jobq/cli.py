"""The `jobq` command: the commands that talk to a running service (worker, enqueue, job, stats, dead,
queues, schedules), and those other installed distributions add (the server's serve, migrate and openapi).

Each command here takes `--url` ($JOBQ_URL, default http://127.0.0.1:8000) and `--token` ($JOBQ_TOKEN);
the ones that print answers take `--json` for scripts (the API's objects, one JSON document) instead of
tables for people. Exit status: 0 done, 1 the service refused (its detail on stderr), 2 bad usage, 3 the
service could not be reached or is unavailable.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import logging
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from jobq.types import (
    FINISHED,
    NO_LIMIT,
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
)

# The HTTP clients and the runner are imported by the commands that use them: the commands other
# distributions add (`jobq serve`, `jobq migrate`) speak to no service and start without them.
if TYPE_CHECKING:
    from jobq.client import Client

cli = typer.Typer(
    help="jobq: an HTTP job queue on PostgreSQL.",
    epilog="`--url` and `--token` may also come before the command (`jobq --url URL stats`). Exit status: "
    "0 done, 1 the service refused, 2 bad usage, 3 the service is unreachable or unavailable.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",
)

EXIT_REFUSED, EXIT_USAGE, EXIT_UNAVAILABLE = 1, 2, 3

Url = Annotated[
    str,
    typer.Option("--url", envvar="JOBQ_URL", help="The jobq service.", rich_help_panel="Service"),
]
Token = Annotated[
    str | None,
    typer.Option(
        "--token", envvar="JOBQ_TOKEN", help="Bearer token.", show_default=False, rich_help_panel="Service"
    ),
]
AsJson = Annotated[bool, typer.Option("--json", help="Print the answer as JSON, for scripts.")]
QueueName = Annotated[str, typer.Argument(help="The queue.", show_default=False)]
# The options of a paged list (`jobs`, `dead list`).
OnlyQueue = Annotated[str | None, typer.Option("--queue", help="Only this queue's.", show_default=False)]
BeforeId = Annotated[
    int | None, typer.Option(help="Older than this id (for the next page).", show_default=False)
]
DEFAULT_URL = "http://127.0.0.1:8000"
# How a command retries (jobq.client.RetryPolicy's arguments): it gives up on an unreachable service
# after about 2 s (the worker keeps trying).
CLI_RETRY: dict[str, Any] = {"attempts": 4}


# --- talking to the service and printing answers ---------------------------------------------------


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
    typer.echo(f"jobq: {detail} ({exc.code})", err=True)
    raise typer.Exit(EXIT_UNAVAILABLE if isinstance(exc, Unavailable) else EXIT_REFUSED) from None


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
    typer.echo(json.dumps(_plain(value), indent=2, ensure_ascii=False))


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
    raw = sys.stdin.read() if text == "-" else text
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise typer.BadParameter(f"not JSON: {exc}", param_hint="PAYLOAD_JSON") from None


# Exit statuses of a command given --wait: the job completed, it ended otherwise, or time ran out.
EXIT_COMPLETED, EXIT_FAILED, EXIT_UNFINISHED = 0, 1, 124  # 124: what timeout(1) exits with

Wait = Annotated[
    float | None,
    typer.Option(
        metavar="SECONDS",
        help="Wait up to this long for the job to finish, then print it. Exit status: 0 completed, "
        "1 dead or cancelled, 124 not finished in time.",
        show_default=False,
    ),
]


def _waited(job: Job, as_json: bool) -> None:
    """Print a job waited for, and exit with how it ended."""
    if as_json:
        print_json(job)
    else:
        typer.echo(_job_text(job))
    if job.status == JobStatus.COMPLETED:
        return
    raise typer.Exit(EXIT_FAILED if job.status in FINISHED else EXIT_UNFINISHED)


def enqueue(
    queue: Annotated[str, typer.Argument(help="Queue to add the job to.", show_default=False)],
    payload_json: Annotated[
        str,
        typer.Argument(metavar="PAYLOAD_JSON", help="The job's payload, as JSON; - reads it from stdin."),
    ],
    delay: Annotated[
        float | None, typer.Option(help="Seconds before it may run.", show_default=False)
    ] = None,
    priority: Annotated[
        int | None, typer.Option(help="Lower runs first [default: 0].", show_default=False)
    ] = None,
    dedup_key: Annotated[
        str | None,
        typer.Option(help="Skip it if an active job of the queue holds this key.", show_default=False),
    ] = None,
    max_attempts: Annotated[
        int | None, typer.Option(help="Tries before it goes dead [default: the queue's].", show_default=False)
    ] = None,
    kind: Annotated[
        str | None,
        typer.Option(help="What the job is (send_email), for workers to route it by.", show_default=False),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(help="What flow control groups it by (a tenant, a customer).", show_default=False),
    ] = None,
    wait: Wait = None,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Enqueue one job. Prints its id (or, for a taken dedup key, the job that holds it). With --wait,
    waits for the job to finish and prints it; the exit status says how it ended (see --wait)."""
    payload = _payload(payload_json)
    with service(url, token) as jobq:
        job = jobq.enqueue(
            queue,
            payload,
            delay=delay,
            priority=priority,
            dedup_key=dedup_key,
            max_attempts=max_attempts,
            kind=kind,
            key=key,
            wait=wait,
        )
    if wait is not None:
        _waited(job, as_json)
    elif as_json:
        print_json(job)
    elif job.duplicate:
        typer.echo(f"job {job.id} already holds dedup key {job.dedup_key!r} ({job.status}); nothing enqueued")
    else:
        when = f", runs at {_cell(job.run_at)}" if delay else ""
        typer.echo(f"enqueued job {job.id} on {job.queue}{when}")


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
    width = max(len(name) for name, _ in fields)
    lines = [head, *(f"  {name.ljust(width)}  {_cell(value)}" for name, value in fields)]
    if job.last_error:
        lines += ["last error:", job.last_error.rstrip()]
    lines += ["payload:", _json_block(job.payload)]
    # Null is "none": an ack without a result, no progress reported yet.
    lines += ["result:", "-" if job.result is None else _json_block(job.result)]
    lines += ["progress:", "-" if job.progress is None else _json_block(job.progress)]
    return "\n".join(lines)


def job_command(
    job_id: Annotated[int, typer.Argument(metavar="ID", help="The job's id.", show_default=False)],
    wait: Wait = None,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """A job, whatever its state: its fields, payload, result (what its ack kept) and progress (what
    its worker last reported). With --wait, once it has finished."""
    with service(url, token) as jobq:
        found = jobq.get_job(job_id) if wait is None else jobq.wait(job_id, wait)
    if wait is not None:
        _waited(found, as_json)
    elif as_json:
        print_json(found)
    else:
        typer.echo(_job_text(found))


def jobs_command(
    queue: OnlyQueue = None,
    status: Annotated[
        JobStatus | None, typer.Option(help="Only jobs in this status.", show_default=False)
    ] = None,
    kind: Annotated[str | None, typer.Option(help="Only jobs of this kind.", show_default=False)] = None,
    key: Annotated[str | None, typer.Option(help="Only jobs of this key.", show_default=False)] = None,
    search: Annotated[
        str | None,
        typer.Option(
            help="Text to find, in any case, in the dedup key, the last error or the payload.",
            show_default=False,
        ),
    ] = None,
    limit: Annotated[int, typer.Option(help="How many (1..500).")] = 20,
    before_id: BeforeId = None,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Jobs of any status, newest first, filtered and searched."""
    with service(url, token) as jobq:
        page = jobq.admin.jobs(
            queue,
            status=status.value if status else None,
            kind=kind,
            key=key,
            search=search,
            limit=limit,
            before_id=before_id,
        )
    if as_json:
        print_json(page)
        return
    if page.jobs:
        typer.echo(
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
        typer.echo("no jobs" + (" in this page" if page.next_before_id is not None else ""))
    if page.next_before_id is not None:
        typer.echo(f"\nmore: add --before-id {page.next_before_id}")


_QUEUE_COLUMNS = ["queue", "pending", "scheduled", "running", "dead", "completed", "lag", "paused"]


def _queue_cells(row: QueueRow) -> list[Any]:
    lag = _seconds(row.oldest_pending_age_seconds)
    return [row.queue, row.pending, row.scheduled, row.running, row.dead, row.completed, lag, row.paused]


def stats(
    queue: Annotated[
        str | None, typer.Argument(help="One queue, with its settings [default: all].", show_default=False)
    ] = None,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Counts per queue: pending (ready now), scheduled (later), running, dead, completed; lag is the
    age of the oldest ready job."""
    with service(url, token) as jobq:
        answer: QueueDetail | list[QueueRow] = jobq.admin.queue(queue) if queue else jobq.admin.queues()
    if as_json:
        print_json(answer)
    elif isinstance(answer, QueueDetail):
        typer.echo(table(_QUEUE_COLUMNS, [_queue_cells(answer)]))
        s = answer.settings
        typer.echo(
            f"\nsettings: visibility_timeout {s.visibility_timeout:g}s, max_attempts {s.max_attempts}, "
            f"backoff {s.backoff_base:g}s doubling up to {s.backoff_cap:g}s, retention {s.retention:g}s"
        )
    elif answer:
        typer.echo(table(_QUEUE_COLUMNS, [_queue_cells(r) for r in answer]))
    else:
        typer.echo("no queues yet")


def workers_command(url: Url = DEFAULT_URL, token: Token = None, as_json: AsJson = False) -> None:
    """Workers that leased in the last hour (by the worker_id they send; `jobq worker` sends host:pid),
    and any holding a running job: queues, last seen, jobs leased and held now."""
    with service(url, token) as jobq:
        workers = jobq.admin.workers()
    if as_json:
        print_json(workers)
    elif workers:
        rows = [[w.worker_id, ",".join(w.queues), w.last_seen, w.leased, w.held] for w in workers]
        typer.echo(table(["worker", "queues", "last seen", "leased", "held"], rows))
    else:
        typer.echo("no worker has leased in the last hour")


dead_cli = typer.Typer(
    help="Dead jobs: list, retry, purge.", no_args_is_help=True, rich_markup_mode="markdown"
)


@dead_cli.command("list")
def dead_list(
    queue: OnlyQueue = None,
    limit: Annotated[int, typer.Option(help="How many (1..1000).")] = 20,
    before_id: BeforeId = None,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Dead jobs, newest first, with their attempts and last error."""
    with service(url, token) as jobq:
        page = jobq.admin.dead_jobs(queue, limit=limit, before_id=before_id)
    if as_json:
        print_json(page)
        return
    if not page.jobs:
        typer.echo("no dead jobs")
        return
    rows: list[Job] = page.jobs
    typer.echo(
        table(
            ["id", "queue", "attempts", "died", "last error"],
            [[j.id, j.queue, j.attempts, j.updated_at, _first_line(j.last_error)] for j in rows],
        )
    )
    if page.next_before_id is not None:
        typer.echo(f"\nmore: jobq dead list --before-id {page.next_before_id}")


@dead_cli.command("retry")
def dead_retry(
    ids: Annotated[list[int] | None, typer.Argument(help="Dead job ids.", show_default=False)] = None,
    queue: Annotated[
        str | None,
        typer.Option(help="Every dead job of this queue (among IDS if given).", show_default=False),
    ] = None,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Put dead jobs back to pending, attempts reset, to run now."""
    if not ids and not queue:
        raise typer.BadParameter("give job ids, --queue, or both")
    with service(url, token) as jobq:
        answer = jobq.admin.retry_dead(ids or None, queue=queue)
    if as_json:
        print_json(answer)
        return
    typer.echo(f"retried {answer.retried}")
    if answer.skipped:
        typer.echo(f"left dead (an active job holds their dedup key): {', '.join(map(str, answer.skipped))}")
    given = len(set(ids or ()))
    missed = given - answer.retried - len(answer.skipped)
    if missed > 0:  # ids that named no dead job (of the queue, with --queue)
        ids_given = f"{given} job id{'s' if given > 1 else ''} given"
        names = "names" if missed == 1 else "name"
        where = f" of queue {queue}" if queue else ""
        typer.echo(f"{missed} of {ids_given} {names} no dead job{where} (not dead, or no such job)", err=True)
        raise typer.Exit(1)


@dead_cli.command("purge")
def dead_purge(
    ids: Annotated[list[int], typer.Argument(help="Dead job ids.", show_default=False)],
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Delete dead jobs for good."""
    purged = []
    with service(url, token) as jobq:
        for job_id in ids:
            purged.append(jobq.admin.purge_dead(job_id))
            if not as_json:
                typer.echo(f"purged {job_id}")
    if as_json:
        print_json(purged)


queues_cli = typer.Typer(
    help="Queues: pause, resume, configure, and their keys' limits.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)


def _show_row(row: QueueRow, as_json: bool) -> None:
    if as_json:
        print_json(row)
    else:
        typer.echo(table(_QUEUE_COLUMNS, [_queue_cells(row)]))


@queues_cli.command("pause")
def queues_pause(
    queue: QueueName,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Stop leasing from a queue; enqueues still land."""
    with service(url, token) as jobq:
        _show_row(jobq.admin.pause(queue), as_json)


@queues_cli.command("resume")
def queues_resume(
    queue: QueueName,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Lease from a paused queue again."""
    with service(url, token) as jobq:
        _show_row(jobq.admin.resume(queue), as_json)


def _setting(help: str) -> Any:
    return typer.Option(help=help, show_default=False)


@queues_cli.command("configure")
def queues_configure(
    queue: QueueName,
    visibility_timeout: Annotated[float | None, _setting("Seconds a lease lasts.")] = None,
    max_attempts: Annotated[int | None, _setting("Tries before a job goes dead.")] = None,
    backoff_base: Annotated[float | None, _setting("Seconds before the first retry; doubles.")] = None,
    backoff_cap: Annotated[float | None, _setting("Longest wait between retries, seconds.")] = None,
    retention: Annotated[float | None, _setting("Seconds completed jobs are kept.")] = None,
    key_concurrency: Annotated[
        int | None, _setting("Jobs of one key running at once (1: also in order); 0 removes the limit.")
    ] = None,
    fair: Annotated[bool | None, _setting("Hand out ready jobs across keys in turn.")] = None,
    rate: Annotated[
        str | None, _setting("LIMIT/SECONDS: leases of the queue per window; 'none' removes.")
    ] = None,
    key_rate: Annotated[
        str | None, _setting("LIMIT/SECONDS: leases of each key per window; 'none' removes.")
    ] = None,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Change some of a queue's settings; the others keep their values."""
    with service(url, token) as jobq:
        detail = jobq.admin.configure_queue(
            queue,
            visibility_timeout=visibility_timeout,
            max_attempts=max_attempts,
            backoff_base=backoff_base,
            backoff_cap=backoff_cap,
            retention=retention,
            key_concurrency=NO_LIMIT if key_concurrency == 0 else key_concurrency,
            fair=fair,
            rate=_parse_rate(rate, "--rate"),
            key_rate=_parse_rate(key_rate, "--key-rate"),
        )
    if as_json:
        print_json(detail)
    else:
        # Flow-control settings only when set: most queues have none.
        flow = {"key_concurrency", "fair", "rate", "key_rate"}
        settings = dataclasses.asdict(detail.settings)
        settings = {k: v for k, v in settings.items() if k not in flow or v not in (None, False)}
        typer.echo(", ".join(f"{k} {_setting_text(v)}" for k, v in settings.items()))


def _parse_rate(text: str | None, option: str) -> Rate | NoLimit | None:
    """`100/60` as Rate(100, 60.0); `none` as NO_LIMIT."""
    if text is None:
        return None
    if text.strip().lower() == "none":
        return NO_LIMIT
    try:
        limit, period = text.split("/")
        return Rate(int(limit), float(period))
    except ValueError:
        raise typer.BadParameter(
            f"give LIMIT/SECONDS (100/60) or none, not {text!r}", param_hint=option
        ) from None


def _setting_text(value: object) -> str:
    if isinstance(value, dict):  # a rate
        return f"{value['limit']}/{value['period']:g}s"
    if isinstance(value, float):
        return f"{value:g}"
    return "none" if value is None else str(value).lower()


@queues_cli.command("keys")
def queues_keys(
    queue: QueueName,
    limit: Annotated[int, typer.Option(help="Keys to list, at most.")] = 20,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """A queue's keys with the most jobs waiting, and keys with limits of their own."""
    with service(url, token) as jobq:
        keys = jobq.admin.keys(queue, limit=limit)
    if as_json:
        print_json(keys)
        return
    rows = [
        [k.key, str(k.pending), str(k.running), _setting_text(k.concurrency), _rate_text(k.rate)]
        for k in keys
    ]
    typer.echo(table(["key", "pending", "running", "concurrency", "rate"], rows))


def _rate_text(rate: Rate | None) -> str:
    return "queue's" if rate is None else f"{rate.limit}/{rate.period:g}s"


@queues_cli.command("set-key")
def queues_set_key(
    queue: QueueName,
    key: Annotated[str, typer.Argument(help="The key.", show_default=False)],
    concurrency: Annotated[int | None, _setting("The key's own concurrency (none: the queue's).")] = None,
    rate: Annotated[str | None, _setting("LIMIT/SECONDS: the key's own rate (none: the queue's).")] = None,
    delete: Annotated[bool, typer.Option("--delete", help="Remove the key's own limits.")] = False,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Give a key limits of its own in place of the queue's key concurrency and key rate (replacing what
    it had), or remove them with --delete."""
    with service(url, token) as jobq:
        if delete:
            result: DeleteKeyResult | KeyView = jobq.admin.delete_key(queue, key)
        else:
            own_rate = _parse_rate(rate, "--rate")
            result = jobq.admin.set_key(
                queue, key, concurrency=concurrency, rate=own_rate if isinstance(own_rate, Rate) else None
            )
    if as_json:
        print_json(result)
    elif isinstance(result, KeyView):
        concurrency_text = _setting_text(result.concurrency).replace("none", "queue's")
        typer.echo(f"{key}: concurrency {concurrency_text}, rate {_rate_text(result.rate)}")
    else:
        typer.echo(f"{key}: the queue's limits")


schedules_cli = typer.Typer(
    help="Schedules: jobs enqueued at the times a cron expression names.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)
ScheduleName = Annotated[str, typer.Argument(help="The schedule.", show_default=False)]


def _show_schedule(schedule: Schedule, as_json: bool) -> None:
    if as_json:
        print_json(schedule)
    elif schedule.next_run_at is None:
        typer.echo(f"schedule {schedule.name}: paused")
    else:
        typer.echo(f"schedule {schedule.name}: next run at {_cell(schedule.next_run_at)}")


@schedules_cli.command("list")
def schedules_list(url: Url = DEFAULT_URL, token: Token = None, as_json: AsJson = False) -> None:
    """Every schedule, by name, with its next and last run (in local time)."""
    with service(url, token) as jobq:
        found = jobq.admin.schedules()
    if as_json:
        print_json(found)
    elif found:
        rows = [[s.name, s.cron, s.timezone, s.queue, s.next_run_at, s.last_run_at, s.paused] for s in found]
        typer.echo(table(["name", "cron", "timezone", "queue", "next run", "last run", "paused"], rows))
    else:
        typer.echo("no schedules")


@schedules_cli.command("set")
def schedules_set(
    name: ScheduleName,
    cron: Annotated[
        str,
        typer.Argument(
            help="When: 5 fields (minute hour day month weekday), or 6 with a leading seconds field.",
            show_default=False,
        ),
    ],
    queue: QueueName,
    payload_json: Annotated[
        str,
        typer.Argument(metavar="PAYLOAD_JSON", help="Each job's payload, as JSON; - reads it from stdin."),
    ],
    timezone: Annotated[
        str | None, _setting("The IANA time zone the times are in (Europe/Berlin) [default: UTC].")
    ] = None,
    kind: Annotated[str | None, _setting("What the jobs are (send_email), for workers to route by.")] = None,
    priority: Annotated[int | None, _setting("Lower runs first [default: 0].")] = None,
    max_attempts: Annotated[
        int | None, _setting("Tries before a job goes dead [default: the queue's].")
    ] = None,
    key: Annotated[str | None, _setting("Kept with the schedule, for keyed flow control.")] = None,
    catch_up: Annotated[
        CatchUp | None, _setting("For the times it missed: no job, one, or one each [default: once].")
    ] = None,
    paused: Annotated[bool, typer.Option("--paused", help="Create it paused.")] = False,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Create or replace a schedule: at each time CRON names, enqueue PAYLOAD_JSON on QUEUE. On a
    replace, options left out take their defaults, not the old values. Prints its next run."""
    payload = _payload(payload_json)
    with service(url, token) as jobq:
        schedule = jobq.admin.set_schedule(
            name,
            cron,
            queue,
            payload,
            timezone=timezone,
            kind=kind,
            priority=priority,
            max_attempts=max_attempts,
            key=key,
            catch_up=catch_up,
            paused=paused or None,
        )
    _show_schedule(schedule, as_json)


@schedules_cli.command("pause")
def schedules_pause(
    name: ScheduleName, url: Url = DEFAULT_URL, token: Token = None, as_json: AsJson = False
) -> None:
    """Stop enqueuing on a schedule until it is resumed."""
    with service(url, token) as jobq:
        _show_schedule(jobq.admin.pause_schedule(name), as_json)


@schedules_cli.command("resume")
def schedules_resume(
    name: ScheduleName, url: Url = DEFAULT_URL, token: Token = None, as_json: AsJson = False
) -> None:
    """Enqueue on a paused schedule again, from its next time after now (the paused times are not
    caught up). Prints its next run."""
    with service(url, token) as jobq:
        _show_schedule(jobq.admin.resume_schedule(name), as_json)


@schedules_cli.command("trigger")
def schedules_trigger(
    name: ScheduleName, url: Url = DEFAULT_URL, token: Token = None, as_json: AsJson = False
) -> None:
    """Enqueue a schedule's job now, whatever its times. Prints the job's id."""
    with service(url, token) as jobq:
        schedule = jobq.admin.trigger_schedule(name)
    if as_json:
        print_json(schedule)
    else:
        typer.echo(f"enqueued job {schedule.job_id} on {schedule.queue}")


@schedules_cli.command("delete")
def schedules_delete(
    name: ScheduleName, url: Url = DEFAULT_URL, token: Token = None, as_json: AsJson = False
) -> None:
    """Delete a schedule; the jobs it enqueued stay."""
    with service(url, token) as jobq:
        deleted = jobq.admin.delete_schedule(name)
    if as_json:
        print_json(deleted)
    else:
        typer.echo(f"deleted schedule {name}")


# --- the worker ------------------------------------------------------------------------------------


def worker(
    target: Annotated[
        str,
        typer.Argument(
            metavar="MODULE[:NAME]",
            help="What to run: module:function, a handler taking the leased job (plain, run in a thread, "
            "or async); module:registry, a jobq.Tasks registry; or a module, its one registry, else its "
            "functions as tasks named after them (each job runs the task its kind names).",
        ),
    ],
    queue: Annotated[
        list[str] | None,
        typer.Option(
            "--queue",
            "-q",
            help="Queue to work on; repeat it for several [default for tasks: their queues].",
            show_default=False,
        ),
    ] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", "-c", help="Jobs run at once.", min=1)] = 1,
    grace: Annotated[float, typer.Option(help="Seconds running jobs get to finish on SIGTERM.")] = 30.0,
    visibility_timeout: Annotated[
        float | None,
        typer.Option(
            help="Seconds a lease lasts before it is extended [default: the queue's].", show_default=False
        ),
    ] = None,
    wait: Annotated[float, typer.Option(help="Seconds each lease request long-polls (max 60).")] = 20.0,
    status_interval: Annotated[
        float, typer.Option(help="Seconds between status lines in the log (off a terminal).")
    ] = 10.0,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    url: Url = DEFAULT_URL,
    token: Token = None,
) -> None:
    """Run a handler, or tasks, on the jobs of queues: ack when it returns, nack with the error when it
    raises (jobq.Retry and jobq.Fail choose when it runs again, or make it dead now).

    SIGTERM or Ctrl-C stops leasing and lets running jobs finish for --grace seconds; jobs still
    running then are released to run again elsewhere. A second signal releases them at once."""
    from jobq.client import AsyncClient
    from jobq.serving import StatusLine, load_target, serve
    from jobq.tasks import Tasks
    from jobq.tracing import export_from_environment
    from jobq.worker import Worker

    try:
        handler = load_target(target, queue[0] if queue else "default")
    except (ImportError, AttributeError, ValueError, TypeError) as exc:
        typer.echo(f"jobq: cannot load {target}: {exc}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    if not queue and not isinstance(handler, Tasks):
        typer.echo("jobq: name the queue to work on (--queue)", err=True)
        raise typer.Exit(EXIT_USAGE)

    status_line = StatusLine(sys.stderr) if sys.stderr.isatty() else None
    output = status_line or logging.StreamHandler(sys.stderr)
    output.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=log_level.upper(), handlers=[output], force=True)
    logging.getLogger("httpx").setLevel(logging.WARNING)

    async def main() -> None:
        _settle_garbage_collection()
        async with AsyncClient(url, token=token) as client:
            runner = Worker(
                handler,
                queue or None,
                client=client,
                concurrency=concurrency,
                wait=wait,
                visibility_timeout=visibility_timeout,
                grace=grace,
            )
            await serve(runner, status_every=status_interval, status_line=status_line)

    flush_spans = export_from_environment()
    try:
        asyncio.run(main())
    except JobqError as exc:
        _refused(exc, token)
    finally:
        if flush_spans is not None:
            flush_spans()


def _settle_garbage_collection() -> None:
    """As `jobq serve` does: set aside what loading the handlers built (gc.freeze), and let a lease of
    a thousand jobs be read before the collector runs at all, instead of walking the young jobs again
    every 700 allocations. Reference counting still frees everything at once; only cycles wait longer."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


cli.command("worker")(worker)
cli.command("enqueue")(enqueue)
cli.command("job")(job_command)
cli.command("jobs")(jobs_command)
cli.command("stats")(stats)
cli.command("workers")(workers_command)
cli.add_typer(dead_cli, name="dead")
cli.add_typer(queues_cli, name="queues")
cli.add_typer(schedules_cli, name="schedules")


# --- commands of other distributions ---------------------------------------------------------------

# A distribution adds commands to `jobq` with entry points in this group, each naming a function written
# as a Typer command (or a Typer app, for a group of commands), added under the entry point's name. The
# server adds serve, migrate and openapi so, and only one distribution owns the `jobq` script.
COMMANDS_GROUP = "jobq.commands"


def add_commands(app: typer.Typer) -> None:
    """Add to `app` the commands that installed distributions name in COMMANDS_GROUP.

    One that cannot be loaded (say, a distribution installed without its dependencies) is left out,
    with a line on stderr: the commands already there must keep working. A name already taken stays
    with the command that has it."""
    taken = {c.name for c in app.registered_commands} | {g.name for g in app.registered_groups}
    failed: dict[str, list[str]] = {}
    for entry in entry_points(group=COMMANDS_GROUP):
        if entry.name in taken:
            failed.setdefault(f"the name is taken ({entry.value})", []).append(entry.name)
            continue
        try:
            command = entry.load()
        except Exception as exc:  # noqa: BLE001 - whatever a plug-in's import raises
            failed.setdefault(f"{type(exc).__name__}: {exc}", []).append(entry.name)
            continue
        if isinstance(command, typer.Typer):
            app.add_typer(command, name=entry.name)
        else:
            app.command(entry.name)(command)
        taken.add(entry.name)
    for reason, names in failed.items():
        typer.echo(f"jobq: left out {', '.join(names)}: {reason}", err=True)


# Options every command that talks to the service takes; also accepted before the command.
SERVICE_OPTIONS = ("--url", "--token")


def options_after_command(command: Any, args: list[str]) -> list[str]:
    """`args` with the service options given before the command moved to just after it:
    `jobq --url U dead list` is `jobq dead list --url U`, so each command keeps its own options (and an
    option given on the line still wins over $JOBQ_URL)."""
    moved, rest = [], list(args)
    while rest and rest[0].split("=", 1)[0] in SERVICE_OPTIONS:
        option = rest.pop(0)
        moved.append(option)
        if "=" not in option and rest:
            moved.append(rest.pop(0))
    path = 0  # how many of `rest` name the command: a group's name, then its command's
    while path < len(rest) and rest[path] in (commands := getattr(command, "commands", {})):
        command = commands[rest[path]]  # a group has `commands`, a command none
        path += 1
    return rest[:path] + moved + rest[path:]


def main() -> None:
    add_commands(cli)
    command = typer.main.get_command(cli)
    command(args=options_after_command(command, sys.argv[1:]), prog_name="jobq")
