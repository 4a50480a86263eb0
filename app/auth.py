"""Bearer tokens and the three roles of the contract.

Tokens are configured without code changes (``JOBQ_TOKENS`` as JSON, or ``JOBQ_TOKENS_FILE``), each with
a role. Only their SHA-256 digests are kept in memory; a presented token is hashed and looked up, and the
match confirmed with ``hmac.compare_digest``, so the comparison does not depend on how much of a secret
a guess got right. Tokens are never logged. With no tokens configured, every call is allowed (and
``jobq serve`` refuses to listen beyond loopback; see app/cli.py).

Who may call what:
- producer: enqueue, read jobs;
- worker: lease, ack, nack, extend, read jobs;
- admin: everything (cancel, dead letters, queues, the dashboard, metrics).
``/healthz`` and ``/readyz`` need no token, so load balancers can probe them.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from pathlib import Path

from fastapi import Depends, Request
from fastapi.security import HTTPBearer

from app.errors import Forbidden, Unauthorized

# Declares the scheme in the OpenAPI document; the check itself is below.
bearer = HTTPBearer(
    auto_error=False, description="A token configured with a role: producer, worker or admin."
)


class Role(enum.StrEnum):
    PRODUCER = "producer"
    WORKER = "worker"
    ADMIN = "admin"


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class Tokens:
    def __init__(self, roles: dict[str, Role]) -> None:
        self._roles = {_digest(token): Role(role) for token, role in roles.items()}

    def __bool__(self) -> bool:
        return bool(self._roles)

    def role_of(self, token: str) -> Role | None:
        digest = _digest(token)
        for known, role in self._roles.items():
            if hmac.compare_digest(known, digest):
                return role
        return None

    @classmethod
    def load(cls, tokens: dict[str, Role], tokens_file: Path | None) -> Tokens:
        """The configured tokens: JOBQ_TOKENS, plus the lines "role token" of JOBQ_TOKENS_FILE."""
        roles = dict(tokens)
        if tokens_file is not None:
            for number, line in enumerate(Path(tokens_file).read_text().splitlines(), 1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                parts = line.split()
                if len(parts) != 2 or parts[0] not in Role.__members__.values():
                    raise ValueError(f"{tokens_file}:{number}: expected 'producer|worker|admin <token>'")
                roles[parts[1]] = Role(parts[0])
        return cls(roles)


class Admits:
    """Which roles may call a route: those named, and admins always."""

    def __init__(self, *roles: Role) -> None:
        self.roles = frozenset(roles) | {Role.ADMIN}
        self._names = ", ".join(sorted(self.roles))

    def check(self, tokens: Tokens, authorization: str) -> None:
        """Raise Unauthorized or Forbidden unless the Authorization header admits its caller."""
        if not tokens:
            return
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("send Authorization: Bearer <token>")
        role = tokens.role_of(token.strip())
        if role is None:
            raise Unauthorized("the bearer token is not valid")
        if role not in self.roles:
            raise Forbidden(f"a {role} token may not do this; it takes: {self._names}")


def allow(*roles: Role):
    """A dependency admitting callers holding one of `roles` (admins always). The check carries its
    ``Admits`` as `admits`, for routes answered without FastAPI's dependencies (app/hot.py)."""
    admits = Admits(*roles)

    async def check(request: Request, _: object = Depends(bearer)) -> None:
        admits.check(request.app.state.tokens, request.headers.get("authorization", ""))

    check.admits = admits  # type: ignore[attr-defined]
    return Depends(check)


Producer = allow(Role.PRODUCER)
Worker = allow(Role.WORKER)
Reader = allow(Role.PRODUCER, Role.WORKER)
Admin = allow()
