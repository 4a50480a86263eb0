"""Lease tokens. As the API hands one out, it is the lease's UUID (jobs.lease_token), a dot and the job's
queue: "1b4e28ba-2fa1-41d2-883f-0016d3cca427.emails". Clients keep it opaque. The queue in it lets
every statement that ends or extends a lease find the job by queue and id, as a jobs table
distributed by queue needs (README: Scaling out). Tokens of the bare UUID, as jobq issued them
before, are still taken: their job's queue is looked up (app/service/workers.py)."""

from __future__ import annotations

import re
import uuid

_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_UUID_CHARS = 36


def token_text(token: uuid.UUID | str, queue: str) -> str:
    """The lease token as the API spells it."""
    return f"{token}.{queue}"


def parse_token(text: str) -> tuple[uuid.UUID | str | None, str | None]:
    """A lease token's UUID and queue (None for a bare UUID). The UUID is None when the text holds none:
    it cannot be any job's current token. A UUID as jobq wrote it goes to asyncpg as it is (its UUID
    codec parses it in C); other spellings are parsed here."""
    if len(text) > _UUID_CHARS + 1 and text[_UUID_CHARS] == "." and _CANONICAL_UUID.match(text):
        return text[:_UUID_CHARS], text[_UUID_CHARS + 1 :]
    if _CANONICAL_UUID.fullmatch(text):
        return text, None
    try:
        return uuid.UUID(text), None
    except ValueError:
        return None, None
