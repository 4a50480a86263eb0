"""Fast readers of the bodies sent in bulk (msgspec): enqueues (`POST /jobs`, `/jobs/batch`), and the
acks and releases a worker sends for every job (`POST /ack`, `/ack/batch`, `/release`).

pydantic builds a model per job and parses every payload into Python objects, which the service only
encodes back into JSON text for PostgreSQL. For a batch of 1,000 small jobs that was 6.4 ms of the
service's 14 ms of CPU per request, as long as the database's insert itself. msgspec reads the same body
in about 0.6 ms and keeps each payload as the JSON text it came in (``msgspec.Raw``), which PostgreSQL
parses into jsonb in any case. An ack batch of 1,000 items is read in 0.17 ms instead of 2.8.

One definition of a valid body stays, the model's (app/http/schemas/). A reader here may refuse more than
the model, never less, and what it accepts it reads as the model does; a body it refuses goes on to the
model, which accepts it or words the refusal (tests/unit/test_fastpath_bodies.py holds the two to this, field
by field, at every edge). So the rarer shapes are simply left to the model:
- `run_at`, `traceparent` and `tracestate` must be absent or null here. Their rules (RFC 3339 in the
  model's reading, W3C's forbidden values) would need copies of the model's validators;
- a whole number written with a fraction (`"priority": 2.0`), which the model takes as 2;
- an ack's `result`: acks with one are read by the model (it is checked and stored as a payload is);
- a payload whose text has `\\u0000` or a `\\uD800`-`\\uDFFF` escape, which jsonb cannot hold: the model's
  way refuses it in words of its own.

What the reader keeps of a payload is its text as sent, whitespace and all: PostgreSQL stores the same
jsonb value either way, and the enqueue's answer echoes that text. Numbers are kept exactly as written,
as jsonb keeps them, and as the model's way keeps them too (app/core/jsontext.py ``read_json``); one past
jsonb's range is left for PostgreSQL to refuse (app/service/inserts.py ``refuse_unstorable_numbers``), not
looked for in every body. A payload's size is the size of its text, and of its compact encoding only
past the limit (app/core/jsontext.py ``payload_text``), so the limit means what it always meant; its
numbers are counted written out, as the model's way counts them, only where one with an exponent may
make it matter.
"""

from __future__ import annotations

import re
from typing import Annotated

import msgspec

from app.core.limits import MAX_JOB_ID, MAX_KEY, MAX_KIND, MAX_LEASE_TOKEN, MAX_QUEUE_NAME, QUEUE_NAME_CHARS
from app.http.schemas import (
    MAX_BATCH,
    MAX_DEDUP_KEY,
    MAX_DELAY,
    MAX_MAX_ATTEMPTS,
    MAX_PRIORITY,
    MIN_PRIORITY,
    AckBatchRequest,
    AckRequest,
    EnqueueBatchRequest,
    EnqueueRequest,
    ReleaseRequest,
)

# Names are checked once per distinct name (``_named_well``) rather than by a pattern per job, which
# msgspec runs as re.search per value: the most of its time on a batch. The whole-string match refuses
# "q\n", as the model's (Rust) regex does; "$" would let it through.
_NAME = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_QUEUE_NAME)]
_KIND = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_KIND)]
_NAMED = re.compile(rf"[{QUEUE_NAME_CHARS}]+")
_PRIORITY = Annotated[int, msgspec.Meta(ge=MIN_PRIORITY, le=MAX_PRIORITY)]
_DELAY = Annotated[float, msgspec.Meta(ge=0, le=MAX_DELAY)]
_MAX_ATTEMPTS = Annotated[int, msgspec.Meta(ge=1, le=MAX_MAX_ATTEMPTS)]
_DEDUP_KEY = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_DEDUP_KEY)]
_KEY = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_KEY)]
_JOB_ID = Annotated[int, msgspec.Meta(ge=1, le=MAX_JOB_ID)]
_LEASE_TOKEN = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_LEASE_TOKEN)]
_ITEMS = msgspec.Meta(min_length=1, max_length=MAX_BATCH)

# What jsonb cannot hold, as JSON text escapes it; a false alarm (an escaped backslash before "u0000")
# only sends the body the model's way.
_UNSTORABLE_ESCAPE = re.compile(rb"\\u(?:0000|[dD][89a-fA-F])")


class FastJob(msgspec.Struct, forbid_unknown_fields=True):
    """A job to enqueue (app/service/arguments.py ``NewJobLike``), as ``EnqueueRequest`` reads it."""

    queue: _NAME
    payload: msgspec.Raw
    priority: _PRIORITY = 0
    run_at: None = None
    delay: _DELAY | None = None
    max_attempts: _MAX_ATTEMPTS | None = None
    dedup_key: _DEDUP_KEY | None = None
    kind: _KIND | None = None
    key: _KEY | None = None
    traceparent: None = None  # set only by app/http/routers/producers.py from a valid traceparent header
    tracestate: None = None
    depends_on: None = None  # jobs with parents are read by the model, and debounced ones
    run_if: None = None
    debounce: None = None

    def model_copy(self, update: dict[str, object]) -> FastJob:
        """A copy with `update`'s fields, as pydantic's ``model_copy(update=...)`` makes one."""
        return msgspec.structs.replace(self, **update)


class FastBatch(msgspec.Struct, forbid_unknown_fields=True):
    """``EnqueueBatchRequest``."""

    jobs: Annotated[list[FastJob], _ITEMS]


class FastLease(msgspec.Struct, forbid_unknown_fields=True):
    """``JobLeaseItem``: a job and its lease token, an item of /release."""

    id: _JOB_ID
    lease_token: _LEASE_TOKEN


class FastAck(msgspec.Struct, forbid_unknown_fields=True):
    """``AckRequest`` without a result (app/service/arguments.py ``AckLike``)."""

    id: _JOB_ID
    lease_token: _LEASE_TOKEN
    result: None = None


class FastAckBatch(msgspec.Struct, forbid_unknown_fields=True):
    """``AckBatchRequest``."""

    items: Annotated[list[FastAck], _ITEMS]


class FastRelease(msgspec.Struct, forbid_unknown_fields=True):
    """``ReleaseRequest``."""

    items: Annotated[list[FastLease], _ITEMS]


_DECODERS: dict[type, msgspec.json.Decoder] = {
    EnqueueRequest: msgspec.json.Decoder(FastJob),
    EnqueueBatchRequest: msgspec.json.Decoder(FastBatch),
    AckRequest: msgspec.json.Decoder(FastAck),
    AckBatchRequest: msgspec.json.Decoder(FastAckBatch),
    ReleaseRequest: msgspec.json.Decoder(FastRelease),
}


def reader(model: type) -> msgspec.json.Decoder | None:
    """The fast reader of a body model, if it has one."""
    return _DECODERS.get(model)


def read(decoder: msgspec.json.Decoder, body: bytes) -> msgspec.Struct | None:
    """The body, read; None where the model is to read it (see the module's docstring)."""
    if b"\\u" in body and _UNSTORABLE_ESCAPE.search(body):
        return None
    try:
        body.decode()  # msgspec skips over a Raw value's strings without checking their UTF-8
    except UnicodeDecodeError:
        return None
    try:
        read = decoder.decode(body)
    except msgspec.DecodeError:
        return None
    if isinstance(read, FastBatch):
        return read if _named_well(read.jobs) else None
    return read if not isinstance(read, FastJob) or _named_well([read]) else None


def _named_well(jobs: list[FastJob]) -> bool:
    """Whether every queue and kind is made of the characters names may have."""
    names = {job.queue for job in jobs} | {job.kind for job in jobs if job.kind is not None}
    return all(_NAMED.fullmatch(name) for name in names)
