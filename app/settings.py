"""Configuration, read from the environment (prefix ``JOBQ_``) once, when the app is built.

Every setting says its default and unit. Tests build their own ``Settings(...)`` and pass it to
``create_app``; nothing reads the environment at import time.
"""

from __future__ import annotations

import ipaddress
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import quote, urlsplit

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from app.core.access import Access, parse_access


class AwsCredential(Access):
    """An SQS access key: its secret, and `role` or `roles` and `queues` as for tokens
    (app/core/access.py)."""

    secret: str


class Settings(BaseSettings):
    # Errors never repeat the values given: tokens, secrets and passwords are among them.
    model_config = SettingsConfigDict(
        env_prefix="JOBQ_", extra="ignore", hide_input_in_errors=True, populate_by_name=True
    )

    # PostgreSQL to use, e.g. postgresql://user:pass@127.0.0.1:5432/app. Falls back to the conventional
    # DATABASE_URL. Unset (the default): jobq starts an embedded PostgreSQL under `data_dir`.
    database_url: str | None = Field(
        default=None, validation_alias=AliasChoices("JOBQ_DATABASE_URL", "DATABASE_URL")
    )
    # How JOBQ_DATABASE_URL's connections behave (default "session": PostgreSQL itself, or a pooler in
    # session mode). "transaction": a pooler in transaction mode (PgBouncer's pool_mode = transaction,
    # pgcat, Supavisor, RDS Proxy), where consecutive transactions of one client may run on different
    # server sessions. Then jobq keeps no session state on those connections: no prepared statements
    # kept (asyncpg's statement cache is off), no startup parameters but application_name (the statement
    # timeout is kept by the client, which cancels a statement that overruns it), and what needs a
    # session of its own (LISTEN, migrations, the maintenance VACUUM) goes to JOBQ_LISTEN_URL, which this
    # mode requires.
    database_pool_mode: Literal["session", "transaction"] = "session"
    # PostgreSQL itself, for what needs a session of its own: the LISTEN connection that wakes long-polls
    # (one per process), migrations and the maintenance VACUUM. Default: JOBQ_DATABASE_URL. Set it when
    # JOBQ_DATABASE_URL goes through a pooler in transaction mode. While it is unreachable, long-polls
    # fall back on the safety poll (JOBQ_WAKEUP_SAFETY_INTERVAL) and `jobq_listener_up` is 0.
    listen_url: str | None = None
    # A read replica (a hot standby of JOBQ_DATABASE_URL's server) for reads that may lag a little: the
    # job, dead-job, queue and worker lists, the queues' statistics, the charts and the metrics' gauges,
    # so operators' traffic never competes with claims. What must be exact (leases, acks, GET /jobs/{id}
    # and its wait, a queue's settings) always reads the primary. Default: none (everything on the
    # primary). Pooled as JOBQ_DATABASE_URL is (JOBQ_POOL_*, JOBQ_DATABASE_POOL_MODE).
    read_database_url: str | None = None
    # Where the embedded PostgreSQL keeps its files (default ./.jobq, relative to the working directory).
    data_dir: Path = Path(".jobq")

    # The address and port `jobq serve` listens on (default 127.0.0.1:8000, this machine only; beyond
    # loopback it needs tokens, see JOBQ_ALLOW_INSECURE).
    host: str = "127.0.0.1"
    port: int = 8000

    # Bearer tokens, as JSON (default: none, and then no authentication): {"<token>": "<role>"}, or
    # {"<token>": {"roles": ["producer", "worker"], "queues": ["celery-*"]}} ("role" for one; "queues",
    # shell-style patterns, leaves the token limited to those queues; left out: every queue). Roles:
    # producer, worker, viewer, admin (app/core/access.py). JOBQ_TOKENS_FILE adds lines
    # "<roles> <token> [<queues>]", roles and patterns comma-separated: "producer,worker t0k3n celery-*".
    tokens: dict[str, Access] = {}
    tokens_file: Path | None = None
    # Credentials for the SQS API (app/sqs), as JSON: {"<access key id>": {"secret": "<secret access
    # key>", "role": "<role>" or "roles": [...], "queues": [...]}}, roles and queues as for tokens
    # (default: none). Once any is configured, every SQS request must carry an AWS Signature Version 4
    # made with one of them (tokens or not).
    aws_credentials: dict[str, AwsCredential] = {}
    # The key that signs the dashboard's session cookies (app/ui/session.py), at least 16 characters.
    # Default: none, and then a key derived from the tokens above: the same on every replica with the
    # same tokens and across restarts, so sessions work on any replica and outlive a restart, but any
    # change to the tokens ends every session. Set it to keep sessions across changes to the tokens (a
    # removed token's sessions end either way).
    session_secret: SecretStr | None = None
    # Seconds a dashboard session lasts after signing in, before the token is asked for again (default
    # 28,800: 8 hours).
    session_max_age: float = Field(default=8 * 3600, gt=0)

    @field_validator("tokens", mode="before")
    @classmethod
    def _tokens(cls, value: Any) -> Any:
        """Each token's entry, checked with an error that names its position, never the token."""
        return parse_access(value, setting="JOBQ_TOKENS", secret_keys=True)

    @field_validator("session_secret")
    @classmethod
    def _session_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 16:
            raise ValueError(
                "JOBQ_SESSION_SECRET needs at least 16 characters: a random string, the same on every replica"
            )
        return value

    @field_validator("aws_regions")
    @classmethod
    def _aws_regions(cls, value: list[str]) -> list[str]:
        for region in value:
            # At most 47 characters: a queue of a region is named `<region>:<name>` in jobq, and an SQS
            # name takes up to 80 of a queue name's 128.
            if not re.fullmatch(r"[a-z0-9]+(?:-[a-z0-9]+)*", region) or len(region) > 47:
                raise ValueError(
                    f"JOBQ_AWS_REGIONS: {region!r} is not a region: up to 47 lowercase letters, digits and"
                    ' hyphens, as in ["us-east-1", "eu-west-1"]'
                )
        if len(set(value)) != len(value):
            raise ValueError("JOBQ_AWS_REGIONS lists a region twice")
        return value

    @field_validator("aws_credentials", mode="before")
    @classmethod
    def _aws_credentials(cls, value: Any) -> Any:
        return parse_access(value, setting="JOBQ_AWS_CREDENTIALS", model=AwsCredential, secret_keys=False)

    # The SQS API's regions, as a JSON list (default ["us-east-1"], what SDKs, kombu and the examples default
    # to): each has queues of its own, as on AWS, and the first is the default one, whose queues are jobq's
    # queues of the same name; a queue of another is jobq's `<region>:<name>` (app/sqs/regions.py). A
    # service with keys refuses a signature for a region not listed, so a request signed for one
    # deployment cannot be replayed against another that shares its keys; one without keys reads such a
    # region as the first.
    aws_regions: list[str] = Field(default=["us-east-1"], min_length=1)
    # `jobq serve` refuses to listen on a non-loopback address without tokens unless this is set
    # (or --insecure is given). Default off.
    allow_insecure: bool = False
    # Host names this service answers to, checked against every request's Host header (port ignored;
    # another name is refused with 400): a JSON list or comma-separated, `*` for any, `.example.com` for
    # example.com and every subdomain of it. Default: the loopback names (localhost, 127.0.0.1, ::1)
    # when `host` is a loopback address, so that a web page whose name its owner then points at
    # 127.0.0.1 (DNS rebinding) cannot use a local jobq through a visitor's browser; `*` otherwise, where
    # tokens are required. /healthz and /readyz answer any host. See app/http/middleware/origin.py.
    allowed_hosts: Annotated[list[str] | None, NoDecode] = None
    # Origins (`https://ops.example.com`: scheme, host and port if not the default) whose pages may send
    # state-changing requests from another origin; a JSON list or comma-separated (default none). Other
    # cross-origin requests from browsers are refused with 403. See app/http/middleware/origin.py.
    trusted_origins: Annotated[list[str], NoDecode] = []

    # Push delivery (app/service/push.py): the URLs a queue's `push.url` may name, as prefixes, a JSON
    # list or comma-separated (`https://jobs.example.com/, https://fn.example.net/hooks/`); default none,
    # and PATCH /queues/{queue} with `push` is refused saying so. A prefix is a whole scheme and host (a
    # port and path if given): `https://a.example.com` admits neither `https://a.example.com.evil.net`
    # nor `https://a.example.community`.
    push_allowed_urls: Annotated[list[str], NoDecode] = []
    # Seconds a stopping replica waits for its push deliveries in flight to be answered before it gives
    # the rest back, their attempts not counted (default 10).
    push_stop_grace: float = Field(default=10.0, ge=0)

    # Largest request body in bytes, checked while it is read (default 16 MiB; larger is 413).
    max_body_bytes: int = 16 * 1024 * 1024
    # Deepest nesting of arrays and objects in a request body (default 64 levels; deeper is 422).
    max_json_depth: int = 64

    # Run the Alembic chain when the service starts (default on). Concurrent replicas are serialised by an
    # advisory lock, so each may do it.
    migrate_on_start: bool = True
    # Seconds a migration statement may wait for a lock (PostgreSQL's lock_timeout; default 2 s, 0 waits
    # for ever). Service statements queue behind a migration's waiting lock request, so this is also how
    # long traffic can stall behind a migration held up by someone's open transaction.
    migration_lock_timeout: float = Field(default=2.0, ge=0)
    # Attempts per migration step when its locks did not come in time (or a deadlock ended it), with
    # backoff between them (0.5 s doubling, at most 15 s); then `jobq migrate` fails naming the session
    # in the way, the step undone (default 10: about two minutes with the default lock timeout).
    migration_attempts: int = Field(default=10, ge=1)

    # Connections per service process (asyncpg pool). Waiting long-polls hold none.
    pool_min_size: int = 2
    pool_max_size: int = 10
    # Seconds to wait for a free pooled connection or a new one before answering 503 (default 5 s).
    pool_acquire_timeout: float = 5.0
    # Seconds any single statement may run (default 30 s).
    statement_timeout: float = 30.0

    # Share statements between concurrent calls (default on): single enqueues, acks and nacks arriving
    # while a statement of their kind is in flight go together in the next one, and so do leases on the
    # same queue. Nothing waits when the service is idle. See app/service/coalesce.py.
    coalesce: bool = True
    # Shared statements of one kind in flight at once (default 2): more lets big calls run side by side,
    # fewer makes bigger batches.
    coalesce_concurrency: int = 2

    # Largest JSON payload of one job, in bytes once encoded (default 256 KiB; larger is 413), and once its
    # numbers are written out as PostgreSQL returns them (1e999 as 1,000 digits; larger is 422).
    max_payload_bytes: int = 256 * 1024
    # Largest SQS message, its body and attributes as SQS counts them, beside each queue's own
    # MaximumMessageSize (whichever is smaller); default 1 MiB, SQS's largest. SQS messages are held to
    # this, not to max_payload_bytes, so a 1 MiB message works as on Amazon SQS.
    sqs_max_message_bytes: int = Field(default=1024 * 1024, ge=1024)
    # Largest `result` an ack may keep with its job, and largest `progress` an extend may, each in bytes
    # once encoded as JSON (default 64 KiB). Larger is 413 and changes nothing: the job stays running
    # under its lease, so the worker can ack again without the result. Numbers count written out, as
    # for payloads (larger is 422).
    max_result_bytes: int = Field(default=64 * 1024, ge=0)
    # Largest `steps` of one job (API part 8: the results its handler recorded with POST /jobs/{id}/steps),
    # in bytes as JSON text, which every lease of the job hands out (default 1 MiB). A step that would pass
    # it is 413 and is not recorded.
    max_steps_bytes: int = Field(default=1024 * 1024, ge=1024)
    # Seconds an event (POST /events) is kept, so that a job awaiting its name later still finds it
    # (default 7 days).
    event_retention: float = Field(default=7 * 24 * 3600, gt=0)
    # Longest `error` text kept by nack, in characters; longer texts are cut, never refused (default 8192).
    max_error_chars: int = 8192

    # Long-polls are woken through LISTEN/NOTIFY as jobs become ready; beside that, one waiter per queue
    # looks anyway every `wakeup_safety_interval` seconds (default 5), a safety net that costs nothing
    # when no one waits.
    wakeup_safety_interval: float = 5.0
    # Long-polls (POST /lease with `wait`, SQS ReceiveMessage with WaitTimeSeconds) waiting at once in
    # one service process (default 10,000). Each holds a socket (a file descriptor), a task and some 30 KB;
    # the cap keeps a flood of them from exhausting the process's file descriptors or memory, and is
    # well above what the workers of one replica hold (one each). Past it a long-poll is answered
    # `503 unavailable` with Retry-After at once; short leases (`wait` 0) are not counted and still work.
    max_waiters: int = Field(default=10_000, ge=1)

    # Schedules (app/service/schedules.py). One replica at a time fires them, under a lease of
    # `scheduler_lease` seconds (default 5) that it renews while alive and gives up when it stops; when
    # its holder dies, another replica takes it once it has expired. A slot the scheduler reaches more than
    # `schedule_grace` seconds late (default 30) was missed, and the schedule's catch_up decides.
    scheduler_lease: float = Field(default=5.0, gt=0)
    schedule_grace: float = Field(default=30.0, ge=0)
    # A TOML file of schedules declared at start, [schedules.<name>] tables with the fields of
    # PUT /schedules/{name}; each replica applies it as PUT would (schedules it does not name are left
    # alone). Default: none.
    schedules_file: Path | None = None

    # How often each process expires leases past their deadline, returning their jobs to `pending` (seconds,
    # default 1). Safe to run in every replica at once: lease expiry claims rows with SKIP LOCKED and
    # re-checks their status. JOBQ_SWEEP_INTERVAL, its name before 0.2, is read too.
    expire_interval: float = Field(
        default=1.0, validation_alias=AliasChoices("JOBQ_EXPIRE_INTERVAL", "JOBQ_SWEEP_INTERVAL")
    )
    # How often completed and cancelled jobs past their queue's retention are deleted (seconds, default
    # 60), and how many rows one delete statement removes at most (default 1000), so pruning never holds
    # long locks.
    prune_interval: float = 60.0
    prune_batch: int = 1000
    # How long the answer of an enqueue sent with an `Idempotency-Key` header is kept, so that the same
    # request sent again gets it again and inserts nothing (seconds, default 300: far longer than any
    # client's retries). Expired keys go with the retention pruning above, in batches of prune_batch.
    idempotency_ttl: float = Field(default=300.0, gt=0)
    # How often one process checks whether the jobs table needs a VACUUM: its dead rows more than a fifth of
    # its live ones (seconds, default 10; 0 leaves it to autovacuum). See app/service/loops/vacuum.py.
    vacuum_interval: float = 10.0

    # How often each process reads the metrics' database gauges (queue depth per state, lag, paused,
    # lock waits) into the snapshot that GET /metrics reports (seconds, default 5); scrapes never query.
    metrics_interval: float = 5.0
    # One JSON line per request on the `jobq.access` logger (default on); `jobq serve` then turns
    # uvicorn's own access log off. Payloads are never logged.
    access_log: bool = True

    @field_validator("database_url", "listen_url", "read_database_url")
    @classmethod
    def _postgresql_url(cls, value: str | None) -> str | None:
        """A PostgreSQL URL, or the start stops at once saying so (without the value: it may hold a
        password) rather than failing later somewhere in a driver."""
        if value is not None and value.partition("://")[0] not in ("postgresql", "postgres"):
            raise ValueError(
                "not a PostgreSQL URL: write it as postgresql://user:password@host:5432/database"
            )
        return value

    @field_validator("allowed_hosts", "trusted_origins", "push_allowed_urls", mode="before")
    @classmethod
    def _list(cls, value: Any) -> Any:
        """A list from the environment as JSON (`["a", "b"]`) or, as people write host lists, `a, b`."""
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [part.strip() for part in text.split(",") if part.strip()]
        return value

    @field_validator("trusted_origins")
    @classmethod
    def _origins(cls, origins: list[str]) -> list[str]:
        """Each as browsers send an Origin header: `scheme://host[:port]`, lowercase, nothing after."""
        spelled = []
        for origin in origins:
            parts = urlsplit(origin.strip().lower())
            if not parts.scheme or not parts.netloc or parts.path.strip("/") or parts.query or parts.fragment:
                raise ValueError(f"not an origin (scheme://host[:port]): {origin!r}")
            spelled.append(f"{parts.scheme}://{parts.netloc}")
        return spelled

    @field_validator("push_allowed_urls")
    @classmethod
    def _push_urls(cls, prefixes: list[str]) -> list[str]:
        """Each an http or https URL with a host; a prefix without a path gets its `/`, so that it ends
        at the host's end (see push_allowed_urls)."""
        spelled = []
        for prefix in prefixes:
            parts = urlsplit(prefix.strip())
            if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
                raise ValueError(f"JOBQ_PUSH_ALLOWED_URLS: not an http(s) URL prefix: {prefix!r}")
            spelled.append(prefix.strip() + ("" if parts.path else "/"))
        return spelled

    @model_validator(mode="after")
    def _session_for_listen(self) -> Settings:
        if self.database_pool_mode == "transaction" and not self.listen_url:
            raise ValueError(
                "JOBQ_DATABASE_POOL_MODE=transaction needs JOBQ_LISTEN_URL: a URL of PostgreSQL itself (not "
                "the pooler) for LISTEN, migrations and maintenance, which need a session of their own"
            )
        return self

    def session_url(self, dsn: str) -> str:
        """Where a session of jobq's own goes (LISTEN, migrations, maintenance): JOBQ_LISTEN_URL, else
        `dsn` (JOBQ_DATABASE_URL, or the embedded server's)."""
        return self.listen_url or dsn

    @property
    def pooled_transactions(self) -> bool:
        """Whether JOBQ_DATABASE_URL goes through a pooler in transaction mode."""
        return self.database_pool_mode == "transaction"


def sqlalchemy_url(dsn: str) -> str:
    """The asyncpg DSN spelled for SQLAlchemy (Alembic), which names its driver in the scheme and takes
    the hosts of a multi-host URL (`postgresql://u@h1:5432,h2:5432/db?target_session_attrs=read-write`,
    as libpq and asyncpg write it) as `host` parameters instead."""
    scheme, sep, rest = dsn.partition("://")
    if not sep:
        raise ValueError(f"not a database URL: {dsn!r}")
    authority, _, tail = rest.partition("/")
    user, at, hosts = authority.rpartition("@")
    if "," not in hosts:
        return f"postgresql+asyncpg://{rest}"
    path, _, query = tail.partition("?")
    params = [f"host={quote(host, safe='')}" for host in hosts.split(",")] + ([query] if query else [])
    return f"postgresql+asyncpg://{user}{at}/{path}?{'&'.join(params)}"


def is_loopback(host: str) -> bool:
    """Whether an address to listen on (or a host name) is this machine's loopback only."""
    host = host.strip().lower().removeprefix("[").removesuffix("]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name that may resolve anywhere
