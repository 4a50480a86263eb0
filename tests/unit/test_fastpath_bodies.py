"""The fast readers (app/http/fastpath/bodies.py) against the pydantic models they stand in for: a body the
fast reader accepts, the model accepts too and reads the same way, field for field. (A body the fast reader
refuses goes on to the model; tests/http/test_fastpath_hot.py checks those answers.)"""

import json

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from app.core.jsontext import payload_text, read_json
from app.core.limits import MAX_JOB_ID, MAX_LEASE_TOKEN
from app.http.fastpath import bodies as fast_bodies
from app.http.schemas import AckBatchRequest, AckRequest, EnqueueBatchRequest, EnqueueRequest, ReleaseRequest

JOB = fast_bodies.reader(EnqueueRequest)
BATCH = fast_bodies.reader(EnqueueBatchRequest)
FIELDS = ("queue", "priority", "run_at", "delay", "max_attempts", "dedup_key", "kind", "key")
FIELDS += ("traceparent", "tracestate")

# Each field's edges: inside and outside every limit, in and out of type, and JSON's awkward spellings.
EDGES = {
    "queue": ["q", "a" * 128, "a" * 129, "", "q\n", "\nq", "é", "a b", "a:b.c-d_e", 5, None],
    "payload": [1, None, "x", {"a": [1, 2]}, 2**70, 1.5, -0.0, "é", "\U0001f600", [], {}, True, 1e300],
    "priority": [0, 7, -(2**31), 2**31 - 1, 2**31, -(2**31) - 1, 2.0, 2.5, "2", True, None],
    "delay": [0, 1, 1.5, -1, -0.0, 315360000, 315360001, 315360000.5, "1", True, None],
    "max_attempts": [1, 1000, 0, 1001, 2.0, "3", False, None],
    "dedup_key": ["", "a", "a" * 512, "a" * 513, "\U0001f600" * 512, "\U0001f600" * 513, 5, None],
    "kind": ["send_email", "", "a" * 128, "a" * 129, "bad kind", "k\n", "k\u00e9", 5, None],
    "key": ["", "k", "a" * 256, "a" * 257, "\U0001f600" * 256, "\U0001f600" * 257, 5, None],
    "run_at": ["2030-01-01T00:00:00Z", "2030-01-01", 5, None],
    "traceparent": ["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", None],
    "tracestate": ["a=b", None],
    "surprise": [1, None],
}


def model_reading(model, body: bytes):
    try:
        return model.model_validate(read_json(body))  # as app/http/fastpath/hot.py reads a body for the model
    except (ValueError, ValidationError):
        return None


def assert_read_alike(fast, model) -> None:
    assert model is not None, "the fast reader accepted a body the model refuses"
    for name in FIELDS:
        assert (getattr(fast, name), type(getattr(fast, name))) == (
            getattr(model, name),
            type(getattr(model, name)),
        ), name
    assert read_json(bytes(fast.payload)) == model.payload


def check(job: dict | bytes) -> bool:
    """Both readers on one job, alone and as a batch of one; whether the fast reader took it."""
    body = job if isinstance(job, bytes) else json.dumps(job, ensure_ascii=False).encode()
    fast = fast_bodies.read(JOB, body)
    if fast is not None:
        assert_read_alike(fast, model_reading(EnqueueRequest, body))
    batch = b'{"jobs": [' + body + b"]}"
    fast_batch = fast_bodies.read(BATCH, batch)
    assert (fast_batch is None) == (fast is None)
    if fast_batch is not None:
        (model,) = model_reading(EnqueueBatchRequest, batch).jobs
        assert_read_alike(fast_batch.jobs[0], model)
    return fast is not None


@pytest.mark.parametrize(("field", "value"), [(f, v) for f, values in EDGES.items() for v in values])
def test_each_edge_is_read_as_the_model_reads_it_or_left_to_the_model(field, value):
    check({"queue": "q", "payload": 1} | {field: value})


def test_the_ordinary_bodies_are_read_fast():
    """The point of the reader: the shapes producers send in bulk do not go the model's way."""
    ordinary = [
        {"queue": "emails", "payload": {"to": "ada@example.com", "n": 1}},
        {"queue": "q", "payload": None, "priority": -5, "delay": 1.5, "max_attempts": 3},
        {"queue": "q", "payload": [1, "é"], "dedup_key": "d", "kind": "send_email", "key": "customer-42"},
        {"queue": "q", "payload": 1, "run_at": None, "traceparent": None, "tracestate": None},
        b'{ "queue" : "q" ,\n "payload" : { "a" : [ 1 , 2 ] } }',
    ]
    assert all(check(job) for job in ordinary)
    jobs = [{"queue": "q", "payload": i} for i in range(1000)]
    read = fast_bodies.read(BATCH, orjson.dumps({"jobs": jobs}))
    assert [bytes(job.payload) for job in read.jobs] == [str(i).encode() for i in range(1000)]


@pytest.mark.parametrize(
    "body",
    [
        b'{"queue": "q", "payload": "a\\u0000b"}',  # jsonb cannot hold these: the model words the refusal
        b'{"queue": "q", "payload": "\\ud800"}',
        b'{"queue": "q", "payload": "\\uDFFF"}',
        b'{"queue": "q", "payload": "\xff"}',  # not UTF-8
        b'{"queue": "q", "payload": [1,]}',
        b'{"queue": "q", "payload": 01}',
        b'{"queue": "q", "payload": NaN}',
        b'{"queue": "q", "payload": 1, "run_at": "2030-01-01T00:00:00Z"}',
        b'{"queue": "q", "payload": 1, "priority": 2.0}',
        b'{"queue": "q"}',
        b'{"queue": "q", "payload": 1} trailing',
        b"[]",
    ],
)
def test_what_the_model_is_left_to_read(body):
    assert fast_bodies.read(JOB, body) is None


def test_a_repeated_field_is_read_as_the_model_reads_it():
    assert check(b'{"queue": "a", "queue": "b", "payload": 1, "payload": 2}')


@pytest.mark.parametrize("count", [0, 1, 1000, 1001])
def test_the_batch_limits_are_the_models(count):
    body = orjson.dumps({"jobs": [{"queue": "q", "payload": 1}] * count})
    fast = fast_bodies.read(BATCH, body) is not None
    assert fast == (model_reading(EnqueueBatchRequest, body) is not None) == (1 <= count <= 1000)
    assert fast_bodies.read(BATCH, b'{"jobs": [{"queue": "q", "payload": 1}], "surprise": 1}') is None


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(sorted(EDGES)), st.integers(0, 20), max_size=6))
def test_any_mix_of_edges_is_read_as_the_model_reads_it(picks):
    check({field: EDGES[field][i % len(EDGES[field])] for field, i in picks.items()})


def test_a_payload_over_the_limit_is_measured_as_compact_json():
    """The limit counts the payload's compact encoding, as it did before the fast reader: spaces a
    client put in do not make a payload too large."""
    spaced = fast_bodies.read(JOB, b'{"queue": "q", "payload": [1,     2,     3]}').payload
    assert payload_text(spaced, 100) == (b"[1,     2,     3]", 17)
    assert payload_text(spaced, 10) == (b"[1,2,3]", 7)


def test_a_payload_is_measured_with_its_numbers_written_out_where_that_may_pass_the_limit():
    """jsonb writes 1e131071 out as 131,072 digits: two of them are 262,147 bytes compact, written out.
    A payload whose exponents cannot take it past the limit is kept as sent and not read again, spaces
    counted, as is one whose "exponents" are in strings."""
    two = fast_bodies.read(JOB, b'{"queue": "q", "payload": [1e131071, 1e131071]}').payload
    assert payload_text(two, 262147) == (b"[1e131071, 1e131071]", 262147)
    assert payload_text(two, 262146) == (b"[1e131071, 1e131071]", 262147)
    small = fast_bodies.read(JOB, b'{"queue": "q", "payload": [1e3,  1e-7, "3e4f", 2E+2]}').payload
    assert payload_text(small, 1000) == (b'[1e3,  1e-7, "3e4f", 2E+2]', 26)
    assert payload_text(small, 25)[1] == len('[1000,0.0000001,"3e4f",200]')


# Acks and releases: a job id and its lease token (and, for an ack, no result).
LEASE_EDGES = {
    "id": [1, MAX_JOB_ID, MAX_JOB_ID + 1, 0, -1, 2**70, 1.0, 1.5, "1", True, None],
    "lease_token": ["t", "a" * MAX_LEASE_TOKEN, "a" * (MAX_LEASE_TOKEN + 1), "", "\U0001f600" * 200, 5, None],
    "result": [None, 1, {"a": 1}],
    "surprise": [1],
}


def check_lease_item(item: dict) -> bool:
    """Both readers on one ack (alone and as a batch of one) and one release; whether the fast reader took
    the ack."""
    body = json.dumps(item, ensure_ascii=False).encode()
    took = []
    for model, wrap in ((AckRequest, None), (AckBatchRequest, "items"), (ReleaseRequest, "items")):
        text = body if wrap is None else b'{"%s": [%s]}' % (wrap.encode(), body)
        fast = fast_bodies.read(fast_bodies.reader(model), text)
        took.append(fast is not None)
        if fast is not None:
            read = model_reading(model, text)
            assert read is not None, "the fast reader accepted a body the model refuses"
            pairs = [(fast, read)] if wrap is None else [(fast.items[0], read.items[0])]
            for mine, theirs in pairs:
                for name in ("id", "lease_token", "result"):
                    if hasattr(theirs, name):
                        assert (getattr(mine, name), type(getattr(mine, name))) == (
                            getattr(theirs, name),
                            type(getattr(theirs, name)),
                        ), name
    assert took[0] == took[1]
    return took[0]


@pytest.mark.parametrize(("field", "value"), [(f, v) for f, values in LEASE_EDGES.items() for v in values])
def test_each_edge_of_an_ack_is_read_as_the_model_reads_it_or_left_to_the_model(field, value):
    check_lease_item({"id": 7, "lease_token": "t"} | {field: value})


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(LEASE_EDGES)), st.integers(0, 20), max_size=4))
def test_any_mix_of_ack_edges_is_read_as_the_model_reads_it(picks):
    check_lease_item({field: LEASE_EDGES[field][i % len(LEASE_EDGES[field])] for field, i in picks.items()})


def test_the_ordinary_acks_and_releases_are_read_fast():
    items = [{"id": 10**6 + i, "lease_token": f"0b7e4a5c-1a2b-4c3d-8e9f-{i:012d}.q"} for i in range(1000)]
    assert check_lease_item(items[0]) and check_lease_item(items[1] | {"result": None})
    for model in (AckBatchRequest, ReleaseRequest):
        read = fast_bodies.read(fast_bodies.reader(model), orjson.dumps({"items": items}))
        assert [(item.id, item.lease_token) for item in read.items] == [
            (item["id"], item["lease_token"]) for item in items
        ]
    with_result = orjson.dumps({"items": [items[0] | {"result": 1}]})
    assert fast_bodies.read(fast_bodies.reader(AckBatchRequest), with_result) is None
