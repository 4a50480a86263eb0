"""JSON as text: how jobq turns values into JSON text, and keeps stored JSON text as it is.

PostgreSQL hands jsonb (a job's payload) to asyncpg as JSON text, and takes it the same way. jobq never
decodes a payload on its way out: the text becomes a ``JSONText``, which orjson writes into any JSON it
encodes as it is (an answer, a kept idempotent answer), byte for byte. Going in, a value becomes compact
text once (``encode_json``), and that text is what is stored.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

# JSON text kept as text: written as it is, never decoded and encoded again. The class itself, so that
# wrapping each of a lease's thousand payloads costs no extra call.
JSONText = orjson.Fragment

# How jobq writes JSON (answers, and the answers an idempotency key keeps): times as RFC 3339 UTC with Z.
WRITE_OPTIONS = orjson.OPT_UTC_Z


def written(value: Any) -> JSONText:
    """orjson's `default` for answers: a value that writes itself as JSON text (``json_fragment()``), as
    the jobs an enqueue has just inserted do (app/jobs/inserts.py ``NewJobs``)."""
    write = getattr(value, "json_fragment", None)
    if write is None:
        raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")
    return write()


def encode_json(value: Any) -> bytes:
    """A JSON value as compact UTF-8 text for PostgreSQL (orjson; Python's encoder for integers beyond
    64 bits, which orjson refuses and jsonb keeps exactly)."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
