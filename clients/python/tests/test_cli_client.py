"""The `jobq` commands that talk to a service (jobq/cli.py): enqueue, stats, dead, queues, against a
real service and database; tables for people, --json for scripts, exit status and stderr on failure."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import jobq as jobq_package
from jobq import Client
from jobq import cli as cli_module
from tests.command_line import invoke
from tests.service_process import free_port

pytestmark = pytest.mark.anyio


def jobq(*args: str, url: str | None = None, stdin: str | None = None, env: dict | None = None):
    options = ["--url", url] if url else []
    return invoke([*args, *options], input=stdin, env=env)


async def test_enqueue(service, db):
    url = service.url
    done = jobq("enqueue", "emails", '{"to": "ada"}', "--priority", "3", "--max-attempts", "2", url=url)
    assert done.exit_code == 0, done.output
    assert done.stdout == "enqueued job 1 on emails\n"

    done = jobq("enqueue", "emails", '"first"', "--dedup-key", "k", "--json", url=url)
    first = json.loads(done.stdout)
    assert (first["id"], first["payload"], first["dedup_key"], first["duplicate"]) == (2, "first", "k", False)
    done = jobq("enqueue", "emails", '"second"', "--dedup-key", "k", url=url)
    assert done.stdout == "job 2 already holds dedup key 'k' (pending); nothing enqueued\n"

    done = jobq("enqueue", "emails", "-", "--delay", "3600", url=url, stdin='{"from": "stdin"}')
    assert re.fullmatch(r"enqueued job \d+ on emails, runs at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\n", done.stdout)
    done = jobq("enqueue", "other", "null", env={"JOBQ_URL": url})  # JOBQ_URL instead of --url
    assert re.fullmatch(r"enqueued job \d+ on other\n", done.stdout)

    bad = jobq("enqueue", "emails", "{not json", url=url)
    assert bad.exit_code == 2 and "not JSON" in bad.stderr
    refused = jobq("enqueue", "no spaces allowed", "1", url=url)
    assert refused.exit_code == 1 and refused.stdout == ""
    assert refused.stderr.startswith("jobq: body.queue: String should match pattern")
    assert refused.stderr.endswith("(validation_error)\n")

    rows = await db.fetch(
        "SELECT queue, payload, priority, max_attempts, run_at > now() AS later"
        " FROM jobq.all_jobs ORDER BY id"
    )
    assert [(r["queue"], json.loads(r["payload"]), r["priority"], r["later"]) for r in rows] == [
        ("emails", {"to": "ada"}, 3, False),
        ("emails", "first", 0, False),
        ("emails", {"from": "stdin"}, 0, True),
        ("other", None, 0, False),
    ]
    assert rows[0]["max_attempts"] == 2


async def test_enqueue_with_kind(service, db):
    done = jobq("enqueue", "emails", "1", "--kind", "send_email", "--json", url=service.url)
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["kind"] == "send_email"
    done = jobq("enqueue", "emails", "2", "--json", url=service.url)
    assert json.loads(done.stdout)["kind"] is None
    refused = jobq("enqueue", "emails", "3", "--kind", "no spaces", url=service.url)
    assert refused.exit_code == 1 and refused.stderr.startswith("jobq: body.kind: ")
    rows = await db.fetch("SELECT payload, kind FROM jobq.all_jobs ORDER BY id")
    assert [(json.loads(r["payload"]), r["kind"]) for r in rows] == [(1, "send_email"), (2, None)]


async def test_job(service, db):
    with Client(service.url) as client:
        done = client.enqueue("emails", {"to": "ada"}, kind="send_email")
        leased = client.enqueue("emails", [1, "ü"], priority=-1)
        (held,) = client.worker.lease("emails")
        assert held.id == leased.id
        client.worker.extend(held, 30, progress={"step": 1})
        client.worker.ack(held, {"sent": True, "note": "ünïcode"})
    shown = jobq("job", str(leased.id), url=service.url)
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert lines[0] == f"job {leased.id} on emails: completed"
    assert lines[1].split() == ["attempts", "1", "of", "5"]
    text = shown.stdout
    # jsonb keeps keys in its own order (shorter first, then bytewise).
    result = 'result:\n{\n  "note": "ünïcode",\n  "sent": true\n}\n'
    assert text.index('payload:\n[\n  1,\n  "ü"\n]\n') < text.index(result)
    assert text.endswith('progress:\n{\n  "step": 1\n}\n')

    pending = jobq("job", str(done.id), url=service.url)
    assert pending.stdout.startswith(f"job {done.id} on emails (send_email): pending\n")
    assert pending.stdout.endswith("result:\n-\nprogress:\n-\n")

    as_json = json.loads(jobq("job", str(leased.id), "--json", url=service.url).stdout)
    assert (as_json["status"], as_json["result"], as_json["progress"]) == (
        "completed", {"sent": True, "note": "ünïcode"}, {"step": 1},
    )  # fmt: skip
    missing = jobq("job", "999999", url=service.url)
    assert missing.exit_code == 1 and missing.stderr.endswith("(not_found)\n")
    assert jobq("job", "abc", url=service.url).exit_code == 2


def answering(url: str, jobs: int) -> threading.Thread:
    """A worker in a thread for `jobs` jobs of queue `calc`: doubles a number payload as its result;
    any other payload is nacked as dead."""

    def work() -> None:
        with Client(url) as client:
            for _ in range(jobs):
                (job,) = client.worker.lease("calc", wait=10)
                if isinstance(job.payload, int):
                    client.worker.ack(job, job.payload * 2)
                else:
                    client.worker.nack(job, f"not a number: {job.payload!r}", dead=True)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread


def test_enqueue_and_job_wait_for_the_end_and_exit_with_how_it_ended(service):
    url = service.url
    worker = answering(url, 2)
    done = jobq("enqueue", "calc", "21", "--wait", "10", "--json", url=url)
    assert done.exit_code == 0, done.output
    job = json.loads(done.stdout)
    assert (job["status"], job["result"]) == ("completed", 42)

    failed = jobq("enqueue", "calc", '"x"', "--wait", "10", url=url)
    assert failed.exit_code == 1, failed.output
    assert failed.stdout.startswith(f"job {job['id'] + 1} on calc: dead\n")
    assert "not a number" in failed.stdout
    worker.join(5)

    pending = Client(url).enqueue("calc", 1)
    late = jobq("job", str(pending.id), "--wait", "0.5", url=url)
    assert late.exit_code == 124 and late.stdout.startswith(f"job {pending.id} on calc: pending\n")
    answering(url, 1)
    assert jobq("job", str(pending.id), "--wait", "10", url=url).exit_code == 0


async def test_stats(service, db):
    url = service.url
    assert jobq("stats", url=url).stdout == "no queues yet\n"
    with Client(url) as client:
        client.enqueue_many([{"queue": "emails", "payload": i} for i in range(3)])
        client.enqueue("emails", "later", delay=600)
        client.worker.ack(client.worker.lease("emails")[0])
        client.enqueue("reports", 1)
        client.worker.lease("reports")

    table = jobq("stats", url=url).stdout.splitlines()
    assert table[0].split() == [
        "QUEUE",
        "PENDING",
        "SCHEDULED",
        "RUNNING",
        "DEAD",
        "COMPLETED",
        "LAG",
        "PAUSED",
    ]
    assert table[1].split()[:6] == ["emails", "2", "1", "0", "0", "1"] and table[1].split()[-1] == "no"
    assert table[2].split()[:6] == ["reports", "0", "0", "1", "0", "0"]

    one = jobq("stats", "emails", url=url).stdout
    assert "settings: visibility_timeout 30s, max_attempts 5, backoff 30s doubling up to 3600s" in one
    as_json = json.loads(jobq("stats", "--json", url=url).stdout)
    assert [(q["queue"], q["pending"], q["running"]) for q in as_json] == [
        ("emails", 2, 0),
        ("reports", 0, 1),
    ]
    assert json.loads(jobq("stats", "reports", "--json", url=url).stdout)["settings"]["max_attempts"] == 5

    missing = jobq("stats", "nope", url=url)
    assert missing.exit_code == 1
    assert missing.stderr == "jobq: queue 'nope' does not exist (no jobs, no settings) (not_found)\n"
    assert missing.stdout == ""


async def test_dead_list_retry_purge(service, db):
    url = service.url
    with Client(url) as client:
        client.admin.configure_queue("q", max_attempts=1)
        ids = [j.id for j in client.enqueue_many([{"queue": "q", "payload": i} for i in range(4)])]
        for job in client.worker.lease("q", max_jobs=4):
            client.worker.nack(job, f"Error: broke on {job.payload}\nTraceback: ...")
        alive = client.enqueue("q", "alive").id

    listed = jobq("dead", "list", "--queue", "q", "--limit", "3", url=url).stdout.splitlines()
    assert listed[0].split() == ["ID", "QUEUE", "ATTEMPTS", "DIED", "LAST", "ERROR"]
    assert [line.split()[0] for line in listed[1:4]] == ["4", "3", "2"]
    assert listed[1].endswith("Error: broke on 3")  # the first line of the error
    assert listed[-1] == "more: jobq dead list --before-id 2"
    page = json.loads(jobq("dead", "list", "--json", "--before-id", "2", url=url).stdout)
    assert [j["id"] for j in page["jobs"]] == [1] and page["next_before_id"] is None

    assert jobq("dead", "retry", str(ids[0]), url=url).stdout == "retried 1\n"
    assert (
        jobq("dead", "purge", str(ids[1]), str(ids[2]), url=url).stdout
        == f"purged {ids[1]}\npurged {ids[2]}\n"
    )
    assert json.loads(jobq("dead", "retry", "--queue", "q", "--json", url=url).stdout) == {
        "retried": 1,
        "skipped": [],
    }
    assert jobq("dead", "list", url=url).stdout == "no dead jobs\n"

    nothing = jobq("dead", "retry", url=url)
    assert nothing.exit_code == 2 and "give job ids, --queue, or both" in nothing.stderr
    not_dead = jobq("dead", "retry", str(alive), "999999", url=url)
    assert not_dead.exit_code == 1, not_dead.stdout
    assert not_dead.stdout == "retried 0\n"
    assert not_dead.stderr == "2 of 2 job ids given name no dead job (not dead, or no such job)\n"
    no_queue = jobq("dead", "list", "--queue", "nosuch", url=url)
    assert no_queue.exit_code == 1 and "queue 'nosuch' does not exist" in no_queue.stderr
    no_queue = jobq("dead", "retry", "--queue", "nosuch", url=url)
    assert no_queue.exit_code == 1 and "queue 'nosuch' does not exist" in no_queue.stderr
    assert jobq("dead", "retry", "--queue", "q", url=url).stdout == "retried 0\n"  # a queue with none
    live = jobq("dead", "purge", str(alive), url=url)
    assert live.exit_code == 1 and live.stderr.endswith("(conflict)\n")

    rows = await db.fetch("SELECT id, status, attempts FROM jobq.all_jobs ORDER BY id")
    assert [(r["id"], r["status"], r["attempts"]) for r in rows] == [
        (ids[0], "pending", 0),
        (ids[3], "pending", 0),
        (alive, "pending", 0),
    ]


async def test_jobs_lists_filters_and_searches(service):
    url = service.url
    with Client(url) as client:
        client.admin.configure_queue("mail", max_attempts=1)
        first = client.enqueue("mail", {"to": "ada@example.com"}, kind="send").id
        failed = client.enqueue("mail", {"to": "bob@example.com"}, kind="send", priority=-1).id
        (job,) = client.worker.lease("mail", max_jobs=1)
        assert job.id == failed
        client.worker.nack(job, "SMTP refused\nTraceback: ...")
        other = client.enqueue("reports", "r").id
        # The client's own call: filters, search and pages.
        assert [j.id for j in client.admin.jobs().jobs] == [other, failed, first]
        assert [j.id for j in client.admin.jobs("mail", status="dead").jobs] == [failed]
        assert [j.id for j in client.admin.jobs(search="ADA@").jobs] == [first]
        page = client.admin.jobs(kind="send", limit=1)
        assert [j.id for j in page.jobs] == [failed] and page.next_before_id == failed
        assert [j.id for j in client.admin.jobs(kind="send", before_id=failed).jobs] == [first]

    listed = jobq("jobs", "--queue", "mail", url=url).stdout.splitlines()
    assert listed[0].split() == ["ID", "QUEUE", "KIND", "STATUS", "ATTEMPTS", "UPDATED", "LAST", "ERROR"]
    assert [line.split()[:4] for line in listed[1:]] == [
        [str(failed), "mail", "send", "dead"],
        [str(first), "mail", "send", "pending"],
    ]
    assert listed[1].endswith("SMTP refused")
    assert jobq("jobs", "--status", "dead", "--search", "smtp", url=url).stdout.splitlines()[1].split()[
        0
    ] == str(failed)
    page = json.loads(jobq("jobs", "--kind", "send", "--limit", "1", "--json", url=url).stdout)
    assert [j["id"] for j in page["jobs"]] == [failed] and page["next_before_id"] == failed
    more = jobq("jobs", "--kind", "send", "--limit", "1", url=url).stdout
    assert more.endswith(f"more: add --before-id {failed}\n")
    assert jobq("jobs", "--search", "nothing like it", url=url).stdout == "no jobs\n"
    bad = jobq("jobs", "--status", "finished", url=url)
    assert bad.exit_code == 2 and "finished" in bad.stderr
    missing = jobq("jobs", "--queue", "nope", url=url)
    assert missing.exit_code == 1 and "'nope' does not exist" in missing.stderr


async def test_queues_pause_resume_configure(service, db):
    url = service.url
    paused = jobq("queues", "pause", "emails", url=url)
    assert paused.exit_code == 0 and paused.stdout.splitlines()[1].split()[-1] == "yes"
    assert await db.fetchval("SELECT paused FROM jobq.queues WHERE name = 'emails'") is True
    assert json.loads(jobq("queues", "resume", "emails", "--json", url=url).stdout)["paused"] is False
    assert await db.fetchval("SELECT paused FROM jobq.queues WHERE name = 'emails'") is False

    done = jobq("queues", "configure", "emails", "--max-attempts", "3", "--backoff-base", "0.5", url=url)
    assert done.stdout == (
        "visibility_timeout 30, max_attempts 3, backoff_base 0.5, backoff_cap 3600, retention 86400\n"
    )
    row = await db.fetchrow("SELECT max_attempts, backoff_base FROM jobq.queues WHERE name = 'emails'")
    assert tuple(row) == (3, 0.5)


async def test_tokens(start_service, db):
    service = start_service(tokens={"p": "producer", "a": "admin"})
    assert jobq("enqueue", "q", "1", "--token", "p", url=service.url).exit_code == 0
    forbidden = jobq("stats", "--token", "p", url=service.url)
    assert forbidden.exit_code == 1 and forbidden.stderr.endswith("(forbidden)\n")
    missing = jobq("stats", url=service.url)
    assert missing.exit_code == 1
    assert (
        missing.stderr == "jobq: this service needs a token: pass --token or set JOBQ_TOKEN (unauthorized)\n"
    )
    wrong = jobq("stats", "--token", "nope", url=service.url)
    assert wrong.exit_code == 1
    assert wrong.stderr == (
        "jobq: the token given (--token or JOBQ_TOKEN) is not valid for this service (unauthorized)\n"
    )
    done = jobq("stats", "--json", url=service.url, env={"JOBQ_TOKEN": "a"})
    assert json.loads(done.stdout)[0]["pending"] == 1
    assert await db.fetchval("SELECT count(*) FROM jobq.all_jobs") == 1


async def test_workers(start_service, db):
    service = start_service(metrics_interval=0.1)
    assert jobq("workers", url=service.url).stdout == "no worker has leased in the last hour\n"
    jobq("enqueue", "emails", "1", url=service.url)
    with Client(service.url) as client:
        (held,) = client.worker.lease("emails", worker_id="host-a:9")
        seen = {w.worker_id: w for w in client.admin.workers()}
        assert seen["host-a:9"].held == 1 and seen["host-a:9"].queues == ["emails"]
    for _ in range(300):  # the replica writes what it saw every metrics interval (0.1 s here)
        listed = json.loads(jobq("workers", "--json", url=service.url).stdout)
        if listed and listed[0]["last_seen"] is not None:
            break
        time.sleep(0.05)
    assert [(w["worker_id"], w["leased"], w["held"]) for w in listed] == [("host-a:9", 1, 1)]
    lines = jobq("workers", url=service.url).stdout.splitlines()
    assert lines[0].split() == ["WORKER", "QUEUES", "LAST", "SEEN", "LEASED", "HELD"]
    assert lines[1].startswith("host-a:9  emails") and lines[1].endswith("1     1")


def test_unreachable_service_exits_3(monkeypatch):
    # The command's own tries (4), with sleeps between them of hundredths of a second, not of seconds.
    monkeypatch.setattr(cli_module, "CLI_RETRY", {**cli_module.CLI_RETRY, "backoff": 0.01, "cap": 0.01})
    done = jobq("stats", url=f"http://127.0.0.1:{free_port()}")
    assert done.exit_code == 3
    assert done.stderr.startswith("jobq: GET /queues: ClientConnectorError") and done.stderr.endswith(
        "(unreachable)\n"
    )


COMMANDS = [
    ["worker"],
    ["enqueue"],
    ["job"],
    ["jobs"],
    ["stats"],
    ["workers"],
    ["dead"],
    ["dead", "list"],
    ["dead", "retry"],
    ["dead", "purge"],
    ["queues"],
    ["queues", "pause"],
    ["queues", "resume"],
    ["queues", "configure"],
    ["queues", "keys"],
    ["queues", "set-key"],
    ["schedules"],
    ["schedules", "list"],
    ["schedules", "set"],
    ["schedules", "pause"],
    ["schedules", "resume"],
    ["schedules", "trigger"],
    ["schedules", "delete"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help(command):
    done = jobq(*command, "--help")
    assert done.exit_code == 0 and "usage: jobq " + " ".join(command) in done.stdout
    if command in (["dead"], ["queues"], ["schedules"]):
        assert "commands:" in done.stdout
    else:
        assert "--url" in done.stdout and "JOBQ_URL" in done.stdout


def test_help_lists_the_commands_with_a_line_each():
    wide = {"COLUMNS": "200"}  # each command's help on its line, whatever the terminal
    done = jobq("--help", env=wide)
    assert done.exit_code == 0 and done.stdout.startswith("usage: jobq ")
    lines = [line.strip() for line in done.stdout.splitlines()]
    for name, line in [
        ("worker", "Run a handler, or tasks, on the jobs of queues"),
        ("enqueue", "Enqueue one job."),
        ("job", "A job, whatever its state"),
        ("jobs", "Jobs of any status, newest first, filtered and searched."),
        ("stats", "Counts per queue"),
        ("workers", "Workers that leased in the last hour"),
        ("dead", "Dead jobs: list, retry, purge."),
        ("queues", "Queues: pause, resume, configure, and their keys' limits."),
        ("schedules", "Schedules: jobs enqueued at the times a cron expression"),
    ]:
        assert any(row.startswith(f"{name} ") and line in row for row in lines), (name, done.stdout)
    assert "Exit status: 0 done" in done.stdout
    # `jobq` alone prints the same help, and exits as for bad usage.
    bare = jobq(env=wide)
    assert bare.exit_code == 2 and bare.stdout == done.stdout


def test_version():
    done = jobq("--version")
    assert (done.exit_code, done.stdout, done.stderr) == (0, f"jobq {jobq_package.__version__}\n", "")


@pytest.mark.parametrize(
    "args, usage, error",
    [
        (["stats", "--bogus"], "jobq stats", "unrecognized arguments: --bogus"),
        (["--bogus", "dead", "list"], "jobq dead list", "unrecognized arguments: --bogus"),
        (["enqueue", "emails"], "jobq enqueue", "the following arguments are required: PAYLOAD_JSON"),
        (["job", "abc"], "jobq job", "argument ID: invalid int value: 'abc'"),
        (
            ["worker", "m:f", "-c", "0"],
            "jobq worker",
            "argument -c/--concurrency: 0 is not in the range x>=1",
        ),
        (
            ["queues", "configure", "q", "--rate", "1"],
            "jobq queues configure",
            "argument --rate: give LIMIT/",
        ),
        (
            ["schedules", "set", "n", "* * * * *", "q", "1", "--catch-up", "never"],
            "jobq schedules set",
            "never",
        ),
        (["nope"], "jobq", "argument COMMAND: invalid choice: 'nope'"),
    ],
)
def test_a_usage_error_exits_2_naming_what_is_wrong(args, usage, error):
    done = jobq(*args, env={"COLUMNS": "200"})  # the usage on one line
    assert done.exit_code == 2 and done.stdout == ""
    assert done.stderr.startswith(f"usage: {usage} ") and error in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1].startswith(f"{usage}: error: ")


def test_a_group_without_its_command_prints_its_help():
    done = jobq("dead")
    assert done.exit_code == 2 and done.stdout.startswith("usage: jobq dead ") and "purge" in done.stdout


PLUGIN = """
import argparse


class Hello:
    help = "Say hello."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--name", default="world")

    def run(self, args: argparse.Namespace) -> int:
        print(f"hello {args.name}")
        return 0 if args.name != "nobody" else 5


class Raises(Hello):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        raise RuntimeError("no arguments today")


def typer_style(name: str = "world") -> None:
    \"\"\"A command as jobq took them before: a function of its options.\"\"\"


hello = Hello()
raises = Raises()
greetings = argparse.Namespace(help="Greetings.", commands={"hello": Hello(), "hi": Hello()})
"""


def _installed_plugin(site: Path) -> None:
    """A distribution in `site` whose entry points add a command and a group of commands, name one that
    cannot be imported, one that is not a command, one whose arguments cannot be added, and claim a name
    the client has."""
    (site / "hello_plugin.py").write_text(PLUGIN)
    info = site / "jobq_hello-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: jobq-hello\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[jobq.commands]\n"
        "hello = hello_plugin:hello\n"
        "greetings = hello_plugin:greetings\n"
        "broken = no_such_module:command\n"
        "old-style = hello_plugin:typer_style\n"
        "bad-arguments = hello_plugin:raises\n"
        "stats = hello_plugin:hello\n"
    )


def jobq_processes(*commands: list[str], env: dict[str, str]) -> list[subprocess.CompletedProcess]:
    """`python -m jobq` with each list of arguments, all at once: each takes most of a second to import the
    client, and none depends on another."""
    started = [
        subprocess.Popen(
            [sys.executable, "-m", "jobq", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args in commands
    ]
    try:
        outputs = [process.communicate(timeout=60) for process in started]
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait()
    return [
        subprocess.CompletedProcess(process.args, process.returncode, out, err)
        for process, (out, err) in zip(started, outputs, strict=True)
    ]


def test_other_distributions_add_commands_and_a_broken_one_breaks_nothing(tmp_path):
    _installed_plugin(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}

    listed, hello, nobody, group, usage, before, stats = jobq_processes(
        ["--help"],
        ["hello", "--name", "ada"],
        ["hello", "--name", "nobody"],
        ["greetings", "hi"],
        ["hello", "--nam", "ada"],
        ["--url", "http://127.0.0.1:1", "hello"],
        ["stats", "--help"],
        env=env,
    )
    assert listed.returncode == 0, listed.stderr
    for command in ("worker", "enqueue", "stats", "dead", "queues", "hello", "greetings"):
        assert f" {command} " in listed.stdout
    assert re.search(r"^ +hello +Say hello\.$", listed.stdout, re.M), listed.stdout
    for left_out in ("broken", "old-style", "bad-arguments"):
        assert f" {left_out} " not in listed.stdout
    assert sorted(listed.stderr.splitlines()) == [
        "jobq: left out bad-arguments: RuntimeError: no arguments today",
        "jobq: left out broken: ModuleNotFoundError: No module named 'no_such_module'",
        "jobq: left out old-style: not a jobq command (it needs help, add_arguments and run: see jobq.cli)",
        "jobq: left out stats: the name is taken (hello_plugin:hello)",
    ]

    assert (hello.returncode, hello.stdout) == (0, "hello ada\n")
    assert (nobody.returncode, nobody.stdout) == (5, "hello nobody\n")  # the exit status run returns
    assert (group.returncode, group.stdout) == (0, "hello world\n")
    # argparse's own checks, as for the client's commands: no abbreviations, service options only for a
    # command that talks to the service.
    assert usage.returncode == 2 and "jobq hello: error: unrecognized arguments: --nam ada" in usage.stderr
    assert (
        before.returncode == 2 and "jobq hello: error: --url is for the commands that talk" in before.stderr
    )
    # A command of the client needs no plug-in: it loads none, and says nothing of those left out.
    assert stats.returncode == 0 and "--url" in stats.stdout and stats.stderr == ""  # still the client's


async def test_service_options_before_the_command_win_over_the_environment(start_service):
    service = start_service(tokens={"a": "admin"})
    # Were the environment read first, each command below would go nowhere, or with the wrong token.
    env = {"JOBQ_URL": f"http://127.0.0.1:{free_port()}", "JOBQ_TOKEN": "wrong"}

    done = invoke(["--url", service.url, "--token", "a", "stats", "--json"], env=env)
    assert (done.exit_code, json.loads(done.stdout)) == (0, []), done.stderr
    done = invoke([f"--url={service.url}", "--token=a", "queues", "pause", "q"], env=env)
    assert done.exit_code == 0, done.stderr
    # The command's own options win over those before it.
    done = invoke(["--token", "wrong", "stats", "--token", "a", "--url", service.url], env=env)
    assert done.exit_code == 0, done.stderr
    # What is not on the line comes from the environment, where an empty variable is none.
    wrong = invoke(["--url", service.url, "stats"], env=env)
    assert wrong.exit_code == 1 and "the token given (--token or JOBQ_TOKEN) is not valid" in wrong.stderr
    unset = invoke(["stats"], env={"JOBQ_URL": service.url, "JOBQ_TOKEN": ""})
    assert unset.exit_code == 1 and "this service needs a token" in unset.stderr
    done = invoke(["--token", "a", "stats", "--json"], env={"JOBQ_URL": service.url, "JOBQ_TOKEN": None})
    assert [q["queue"] for q in json.loads(done.stdout)] == ["q"]


async def test_service_options_may_come_before_the_command(start_service, db):
    service = start_service(tokens={"a": "admin"})
    await db.execute("INSERT INTO jobq.queues (name, paused) VALUES ('q', false), ('r', true)")
    env = {k: v for k, v in os.environ.items() if k not in ("JOBQ_URL", "JOBQ_TOKEN")}

    # One queue paused and the other resumed, so that no command waits for another.
    paused, resumed, stats, refused = jobq_processes(
        ["--url", service.url, "--token", "a", "queues", "pause", "q"],
        [f"--url={service.url}", "queues", "resume", "--token", "a", "r"],
        ["--token", "a", "--url", service.url, "stats", "--json"],
        # A command's own --url wins over the one before it.
        ["--url", service.url, "stats", "--url", f"http://127.0.0.1:{free_port()}"],
        env=env,
    )
    assert paused.returncode == 0, paused.stderr
    assert resumed.returncode == 0, resumed.stderr
    rows = await db.fetch("SELECT name, paused FROM jobq.queues ORDER BY name")
    assert [tuple(row) for row in rows] == [("q", True), ("r", False)]
    assert stats.returncode == 0 and [q["queue"] for q in json.loads(stats.stdout)] == ["q", "r"]
    assert refused.returncode == 3
