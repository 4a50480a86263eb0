"""The errors of jobq's operations, and the database errors the service tells apart.

The service layer (app/service/) raises these; it knows nothing of HTTP, and neither does this module: no
web framework is imported here. app/http/problems.py turns them into RFC 9457 problem details for the HTTP
API, and app/sqs/router.py into SQS errors.

Each error carries its `code` as a class attribute: it is part of what the error means in jobq's contract
(a lost lease is ``lease_lost`` however it is reached), so it is defined once, with the error. What the
code is in HTTP, its status, is the HTTP layer's to say: app/http/problems.py ``STATUSES``, one table that
problems, the fast path, the SQS API and the dashboard all read. What the layers below need to know of an
error, whether it refuses the request or the service failed it, is its class (``Refusal``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg


class JobqError(Exception):
    code: str = "internal"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra


class Refusal(JobqError):
    """The request refused for what it asks or who asks it (its input, its token, the state of the job it
    names): nothing of it was done. Any other error is the service failing the request, or unable to
    serve it now; app/service/coalesce.py retries a shared statement's items one by one after a refusal
    only."""


class Unauthorized(Refusal):
    code = "unauthorized"


class Forbidden(Refusal):
    code = "forbidden"


class NotFound(Refusal):
    code = "not_found"


class LeaseLost(Refusal):
    """The lease token is not the job's current one: the lease expired and moved on, or was ended."""

    code = "lease_lost"


class Conflict(Refusal):
    """The job's status does not allow this (cancel a running job, purge a live one)."""

    code = "conflict"


class PayloadTooLarge(Refusal):
    code = "payload_too_large"


class Invalid(Refusal):
    """A request that is well-formed JSON but asks for something impossible (e.g. both run_at and delay)."""

    code = "validation_error"


class Unavailable(JobqError):
    """Not now, try again: answered with `Retry-After: <retry_after>` (seconds)."""

    code = "unavailable"

    def __init__(self, detail: str, *, retry_after: int = 1, **extra: Any) -> None:
        super().__init__(detail, **extra)
        self.retry_after = retry_after


# The server takes no writes (SQLSTATE 25006), on a connection made when it did, or made without
# target_session_attrs=read-write: a standby, or a new primary its failover manager keeps read-only for a
# moment after promoting it (pg_auto_failover, until the old primary is surely gone). The statement was
# refused before it did anything.
READ_ONLY = asyncpg.exceptions.ReadOnlySQLTransactionError

# Errors meaning "the database cannot be reached or is going away": answered 503, and the pool
# reconnects on a later request by itself.
DATABASE_UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,
    asyncio.TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.ConnectionDoesNotExistError,
    asyncpg.InterfaceError,
    asyncpg.OperatorInterventionError,  # shutdown, cannot connect now, statement timeout
    asyncpg.InsufficientResourcesError,  # too many connections, disk full
    # asyncpg's protocol left mid-operation, as when the server died under a statement (seen in a
    # failover: "cannot switch to state 12; another operation (2) is in progress").
    asyncpg.exceptions.InternalClientError,
    READ_ONLY,
)
# Of those, the ones after which the connection itself is not to be used again (app/db/pool.py closes it). A
# connection to a server that refuses writes is closed too: a new one goes to the host that takes them
# (the first that answers read-write, with several hosts in the URL).
CONNECTION_TROUBLE: tuple[type[BaseException], ...] = (
    OSError,
    asyncio.TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
    READ_ONLY,
)

# Set on such an error (as an attribute of that name) when it came before anything was sent to the
# database (app/db/pool.py: no connection could be had). The 503 then carries `"nothing_done": true`, so a
# client knows it may send again even a call that is not idempotent: any other 503 may follow a commit
# (the connection lost after the statement ran, a timeout), and then only idempotent calls go again.
NOTHING_DONE = "jobq_nothing_done"

# PostgreSQL rolled the request's transaction back to break a deadlock or a serialization conflict (a
# migration's lock against a service statement, say): nothing of it was committed, and the same request
# sent again can succeed, so 503 with `nothing_done`, never a 500.
TRANSACTION_ROLLED_BACK: tuple[type[BaseException], ...] = (asyncpg.TransactionRollbackError,)

# Values PostgreSQL refuses (a NUL character, an out-of-range number): the client's input, so 422.
DATABASE_REJECTED_INPUT: tuple[type[BaseException], ...] = (
    asyncpg.DataError,
    UnicodeEncodeError,
    OverflowError,
)
