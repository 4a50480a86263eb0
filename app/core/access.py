"""Bearer tokens, the four roles, and the queues a token may use: the rules, with nothing of HTTP (the
route dependencies that apply them are app/http/auth.py).

Tokens are configured without code changes (``JOBQ_TOKENS`` as JSON, or ``JOBQ_TOKENS_FILE``), each with
one role or several and, optionally, the queue-name patterns it is limited to. Only their SHA-256
digests are kept in memory; a presented token is hashed and its digest looked up in a dict. What the
lookup's timing could reveal is about the digest, not the secret, so a guess learns nothing of how much
of a token it got right. Tokens are never logged, nor shown in configuration errors (those name the
entry's position instead). With no tokens configured, every call is allowed (and ``jobq serve``
refuses to listen beyond loopback; see app/cli.py).

Who may call what (the decision for each route is a table in tests/http/test_scopes.py):
- producer: enqueue, read jobs;
- worker: lease, ack, nack, extend, release, read jobs and a queue (its settings: how long a lease lasts);
- viewer: read only: jobs, dead jobs, queues, the dashboard without its buttons, metrics;
- admin: everything (cancel, dead letters, queue settings, pause and resume, the dashboard's buttons).
Every role reads the API's documentation (``/docs``, ``/redoc``, ``/openapi.json``). ``/healthz`` and
``/readyz`` need no token, so load balancers can probe them. A token with several roles may do what
each of them may.

Queues. A token (or an SQS key, app/sqs/auth.py) may be limited to queue-name patterns, shell-style:
``*`` is any run of characters, ``?`` one character, every other character itself (queue names have no
other special character). Where the check happens:
- A call that names a queue (enqueue, each job of a batch, lease, the ``/queues/{queue}`` paths, dead
  jobs listed or retried by queue) is ``403 forbidden`` for a queue outside the patterns, naming them.
  On the hot routes (app/http/fastpath/hot.py) this is the same endpoint code, on the body already parsed.
- ack, nack, extend and release name only a job and a lease token, and a lease token is handed out
  only by a lease of an admitted queue: the token fences them, so they need no check of their own
  (and the hot path no extra query).
- Reading, cancelling, purging or retrying a job by id checks the job's queue in the statement itself
  (``queue LIKE ANY(:scope)``): a job outside the patterns is answered as a job that is not there (404,
  or not counted), so a scoped token learns nothing of other queues' jobs.
- Listings (``GET /queues``, ``GET /dead`` without a queue, the dashboard) show the admitted queues
  only. ``/metrics`` covers every queue, so it needs a token that is not limited to queues.
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError, model_validator

from app.core.errors import Forbidden, Unauthorized
from app.core.limits import MAX_QUEUE_NAME, QUEUE_NAME_CHARS


class Role(enum.StrEnum):
    PRODUCER = "producer"
    WORKER = "worker"
    VIEWER = "viewer"
    ADMIN = "admin"


ROLE_NAMES = ", ".join(Role)

# A queue-name pattern: the wildcards and the queue-name characters (app/db/tables.py).
QUEUE_PATTERN = re.compile(rf"[*?{QUEUE_NAME_CHARS}]{{1,{MAX_QUEUE_NAME}}}")
QUEUE_PATTERN_RULE = (
    "use the queue-name characters A-Z a-z 0-9 _ . : - and the wildcards * (any run of characters) "
    "and ? (one character), 1-128 of them"
)


def _regex(pattern: str) -> str:
    return "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)


def like(pattern: str) -> str:
    """The pattern for SQL LIKE: `_` is a wildcard there (one character), so it is escaped first; `%`
    cannot occur in a queue name. Then * and ? become % and _."""
    return pattern.replace("_", "\\_").replace("*", "%").replace("?", "_")


class Grant:
    """What one token or SQS key may do: its roles, and the queue patterns it is limited to (None:
    every queue).

    Whether a queue is admitted is remembered per grant, so the hot path pays a dict lookup, and a
    pattern match the first time a queue is named. Clients choose the names, so the memory is bounded:
    past MAX_CACHED names it starts over."""

    MAX_CACHED = 4096
    __slots__ = ("roles", "queues", "like", "_pattern", "_cached")

    def __init__(self, roles: Iterable[Role], queues: Iterable[str] | None = None) -> None:
        self.roles = frozenset(Role(role) for role in roles)
        self.queues = None if queues is None else tuple(queues)
        # The patterns as SQL statements take them (`:scope`, app/db/sql/fragments.py): NULL for every queue.
        self.like = None if self.queues is None else [like(p) for p in self.queues]
        self._pattern = (
            None
            if self.queues is None
            else re.compile("|".join(f"(?:{_regex(p)})" for p in self.queues), re.DOTALL)
        )
        self._cached: dict[str, bool] = {}

    def has(self, role: Role) -> bool:
        return role in self.roles or Role.ADMIN in self.roles

    def admits(self, queue: str) -> bool:
        if self._pattern is None:
            return True
        admitted = self._cached.get(queue)
        if admitted is None:
            if len(self._cached) >= self.MAX_CACHED:
                self._cached.clear()
            admitted = self._cached[queue] = self._pattern.fullmatch(queue) is not None
        return admitted

    def admit(self, queue: str, where: str = "queue") -> None:
        """Raise Forbidden unless `queue` is among the grant's queues (`where` names it in the request)."""
        if not self.admits(queue):
            assert self.queues is not None
            raise Forbidden(
                f"{where} {queue!r} is not among the queues this token may use: {', '.join(self.queues)}",
                allowed_queues=list(self.queues),
            )

    def unscoped(self, what: str) -> None:
        """Raise Forbidden if the grant is limited to some queues: for what covers every queue."""
        if self.queues is not None:
            raise Forbidden(
                f"{what} covers every queue, and this token is limited to: {', '.join(self.queues)}; "
                "use a token that is not limited to queues",
                allowed_queues=list(self.queues),
            )


OPEN = Grant(Role)  # no tokens configured: every role, every queue


def check_pattern(pattern: str) -> str:
    if not isinstance(pattern, str) or not QUEUE_PATTERN.fullmatch(pattern):
        raise ValueError(f"queue pattern {pattern!r} is not valid: {QUEUE_PATTERN_RULE}")
    return pattern


class Access(BaseModel):
    """How a token or an SQS key is configured: `role` (one) or `roles` (several), and `queues`, the
    patterns it is limited to (left out: every queue). A plain string is a role alone: "admin"."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Role | None = None
    roles: tuple[Role, ...] | None = None
    queues: tuple[str, ...] | None = None
    _grant: Grant | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _role_alone(cls, value: Any) -> Any:
        return {"role": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _complete(self) -> Access:
        if self.role is not None and self.roles is not None:
            raise ValueError("give either `role` or `roles`, not both")
        if self.role is None and self.roles is None:
            raise ValueError(f"give a role: `role` (one of {ROLE_NAMES}) or `roles` (a list)")
        if self.roles is not None and not self.roles:
            raise ValueError("`roles` needs at least one role")
        if self.queues is not None:
            if not self.queues:
                raise ValueError("`queues` needs at least one pattern (leave it out for every queue)")
            for pattern in self.queues:
                check_pattern(pattern)
        return self

    @property
    def grant(self) -> Grant:
        if self._grant is None:
            self._grant = Grant(self.roles or (self.role,), self.queues)  # type: ignore[arg-type]
        return self._grant


def describe(exc: ValidationError, model: type[BaseModel] = BaseModel) -> str:
    """A configuration error of `model` in a line, without the values given (they may hold secrets)."""
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(part) for part in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "enum":
            message = f"{error['input']!r} is not a role; the roles are {ROLE_NAMES}"
        elif error["type"] == "extra_forbidden":
            message = f"unknown field; the fields are {', '.join(model.model_fields)}"
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts)


def parse_access(entries: Any, *, setting: str, model: type[Access] = Access, secret_keys: bool) -> Any:
    """The entries of JOBQ_TOKENS (`secret_keys`: an entry is named by its position, never by its
    token) or JOBQ_AWS_CREDENTIALS (named by access key id), each validated as `model`, with errors
    that say which entry and what is wrong in it."""
    if not isinstance(entries, Mapping):
        return entries  # the field's own type refuses it
    parsed = {}
    for number, (key, value) in enumerate(entries.items(), 1):
        name = f"entry {number} (the token is not shown)" if secret_keys else f"key {key}"
        if not isinstance(key, str) or not key.strip():
            raise ValueError(f"{setting}, {name}: the key is empty")
        try:
            parsed[key] = value if isinstance(value, model) else model.model_validate(value)
        except ValidationError as exc:
            raise ValueError(f"{setting}, {name}: {describe(exc, model)}") from None
    return parsed


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class Tokens:
    def __init__(self, grants: Mapping[str, Grant]) -> None:
        self._grants = {_digest(token): grant for token, grant in grants.items()}

    def __bool__(self) -> bool:
        return bool(self._grants)

    def grant_of(self, token: str) -> Grant | None:
        return self._grants.get(_digest(token))

    def digests(self) -> Mapping[bytes, Grant]:
        """Each token's SHA-256 digest with its Grant (what dashboard sessions are keyed by)."""
        return self._grants

    @classmethod
    def load(cls, tokens: Mapping[str, Access | Role | str], tokens_file: Path | None) -> Tokens:
        """The configured tokens: JOBQ_TOKENS, plus the lines of JOBQ_TOKENS_FILE:
        ``<roles> <token> [<queues>]``, roles and queue patterns comma-separated, e.g.
        ``producer,worker mytoken celery-*,emails`` (``#`` starts a comment line)."""
        grants = {
            token: (spec if isinstance(spec, Access) else Access.model_validate(spec)).grant
            for token, spec in tokens.items()
        }
        if tokens_file is not None:
            for number, line in enumerate(Path(tokens_file).read_text().splitlines(), 1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                parts = line.split()
                if len(parts) not in (2, 3):
                    raise ValueError(
                        f"{tokens_file}:{number}: expected '<roles> <token> [<queues>]', roles of "
                        f"{ROLE_NAMES} and queue patterns each comma-separated"
                    )
                queues = parts[2].split(",") if len(parts) == 3 else None
                try:
                    access = Access(roles=parts[0].split(","), queues=queues)  # type: ignore[arg-type]
                except ValidationError as exc:
                    raise ValueError(f"{tokens_file}:{number}: {describe(exc, Access)}") from None
                grants[parts[1]] = access.grant
        return cls(grants)


class Admits:
    """Which roles may call a route: those named, and admins always."""

    def __init__(self, *roles: Role) -> None:
        self.roles = frozenset(roles) | {Role.ADMIN}
        self._names = ", ".join(role for role in Role if role in self.roles)

    def check(self, tokens: Tokens, authorization: str) -> Grant:
        """The caller's Grant; Unauthorized or Forbidden unless the Authorization header admits it."""
        if not tokens:
            return OPEN
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("send Authorization: Bearer <token>")
        grant = tokens.grant_of(token.strip())
        if grant is None:
            raise Unauthorized("the bearer token is not valid")
        if self.roles.isdisjoint(grant.roles):
            raise self._forbidden(grant)
        return grant

    def admit(self, grant: Grant) -> Grant:
        """`grant` (of a token found another way: a dashboard session), if it holds one of the roles;
        else Forbidden."""
        if self.roles.isdisjoint(grant.roles):
            raise self._forbidden(grant)
        return grant

    def _forbidden(self, grant: Grant) -> Forbidden:
        held = ", ".join(role for role in Role if role in grant.roles)
        return Forbidden(f"a token of role {held} may not do this; it takes: {self._names}")
