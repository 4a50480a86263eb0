"""JSON as text: how jobq reads request JSON and turns values into JSON text, and keeps stored JSON text
as it is.

PostgreSQL hands jsonb (a job's payload) to asyncpg as JSON text, and takes it the same way. jobq never
decodes a payload on its way out: the text becomes a ``JSONText``, which orjson writes into any JSON it
encodes as it is (an answer, a kept idempotent answer), byte for byte. Going in, a value becomes compact
text once (``encode_json``), and that text is what is stored.

Numbers are stored exactly as sent. jsonb keeps a number as PostgreSQL's numeric, digit for digit
(1e999 is a 1 and 999 zeros; 0.30000000000000004000001 stays so), where a Python float would make
1e999 infinity (stored as null), 1e-999 zero, and round the rest to 17 digits. So a request's JSON is
read by ``read_json``, which reads every number with a fraction or an exponent as a ``Decimal``, and
``encode_json`` writes a Decimal as its digits and exponent ("2.50", "1E+999"), which jsonb reads as
the same value and scale. Both are msgspec's, in C: a float subclass keeping its text, made by a Python
hook and written by another, cost about 1 us more per number. The models' number fields take a Decimal
as the float it stands for (app/http/schemas/common.py ``Number``). A number jsonb cannot hold
(``NumberOutOfRange``: more than 131,072 digits before the decimal point or 16,383 after) is refused when
it is encoded, before anything is sent to the database.

jsonb writes a number out in full, with no exponent: 1e131071, 8 characters sent, is 131,072 written
out, on every read and every lease of its job. So a value's size, held to its limit (the payload's,
the result's), is that of its text with every number as PostgreSQL writes it out (``written_size``):
else a payload of 81 KB would be 1.2 GB to write, more than PostgreSQL can, and every lease of its queue
would fail. Only a number with an exponent can grow so; text without one is not looked through.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal, InvalidOperation
from typing import Any

import msgspec
import orjson

# JSON text kept as text: written as it is, never decoded and encoded again. The class itself, so that
# wrapping each of a lease's thousand payloads costs no extra call.
JSONText = orjson.Fragment

# How jobq writes JSON (answers, and the answers an idempotency key keeps): times as RFC 3339 UTC with Z.
WRITE_OPTIONS = orjson.OPT_UTC_Z


def written(value: Any) -> JSONText:
    """orjson's `default` for answers: a value that writes itself as JSON text (``json_fragment()``), as
    the jobs an enqueue has just inserted do (app/service/inserts.py ``NewJobs``)."""
    write = getattr(value, "json_fragment", None)
    if write is None:
        raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")
    return write()


# msgspec reads JSON as fast as pydantic's parser (jiter), and unlike it takes a hook for numbers with
# a fraction or an exponent; Decimal keeps them exactly.
_READ = msgspec.json.Decoder(float_hook=Decimal)


class HugeNumber:
    """A number past even Decimal's exponents (1e99999999999999999999: beyond 10^(10^18)), kept as its text
    so that storing it is refused in words, as with any number jsonb cannot hold. A number field takes it
    as the float it rounds to (infinity or zero), which it refuses or takes as it would any float."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __float__(self) -> float:
        return float(self.text)


def _decimal(text: str) -> Decimal | HugeNumber:
    try:
        return Decimal(text)
    except InvalidOperation:
        return HugeNumber(text)


def _integer(text: str) -> int | Decimal:
    # Python refuses to turn more than 4,300 digits into an int (sys.get_int_max_str_digits); jsonb holds
    # 131,072. Such an integer is kept as a Decimal, as a number with a fraction is.
    return int(text) if len(text) <= 4000 else Decimal(text)


def _not_json(constant: str) -> None:
    raise json.JSONDecodeError(f"{constant} is not valid JSON", constant, 0)


def read_json(body: bytes | str) -> Any:
    """A request's JSON, every number exact (see the module's docstring). What msgspec refuses goes to
    Python's parser, with the same hooks: it words the refusal of text that is not JSON (the position,
    for app/http/problems.py), and reads what msgspec does not (integers past 4,300 digits, lone surrogate
    escapes, UTF-16), NaN and Infinity aside."""
    try:
        return _READ.decode(body)
    except (ValueError, InvalidOperation):  # msgspec.DecodeError, UnicodeDecodeError; a HugeNumber
        return json.loads(body, parse_float=_decimal, parse_int=_integer, parse_constant=_not_json)


# PostgreSQL's numeric, which jsonb keeps numbers as: digits in groups of four (NBASE 10,000) with an
# int16 weight, hence at most 131,072 digits before the decimal point, and a display scale of at most
# 16,383 digits after it (NUMERIC_DSCALE_MAX). An exponent is refused from INT_MAX / 2 on whatever the
# digits (numeric.c, set_var_from_str).
NUMERIC_MAX_WEIGHT = 32767
NUMERIC_MAX_SCALE = 16383
_NUMERIC_MAX_EXPONENT = 2**31 // 2 - 1
_NUMBER_PARTS = re.compile(r"-?([0-9]+)(?:\.([0-9]+))?(?:[eE]([-+]?[0-9]+))?")


class NumberOutOfRange(ValueError):
    """A number jsonb cannot hold; its message names the number and the limits."""


def fits_jsonb(text: str) -> bool:
    """Whether PostgreSQL's jsonb holds the JSON number `text` (as numeric's input function decides).
    PostgreSQL 15's rule, the stricter: 16 also holds a zero with an exponent of 1073741823 or more,
    which this refuses, so a number is kept or refused alike whichever server jobq runs on."""
    parts = _NUMBER_PARTS.fullmatch(text)
    if parts is None:
        return False
    whole, fraction, exponent = parts[1], parts[2] or "", parts[3] or "0"
    digits = exponent.lstrip("+-").lstrip("0")
    if len(digits) > len(str(_NUMERIC_MAX_EXPONENT)) or abs(int(exponent)) >= _NUMERIC_MAX_EXPONENT:
        return False
    power = int(exponent)
    if max(0, len(fraction) - power) > NUMERIC_MAX_SCALE:
        return False
    significant = (whole + fraction).lstrip("0")
    if not significant:
        return True  # zero, whatever its exponent
    leading = len(whole) - 1 - (len(whole) + len(fraction) - len(significant)) + power  # its power of 10
    return leading // 4 <= NUMERIC_MAX_WEIGHT


def written_length(number: Decimal) -> int:
    """How many characters PostgreSQL writes a number jsonb holds out in: jsonb's numeric has no
    exponent form, so 1e999 is written as a 1 and 999 zeros, and 1e-999 as "0." and 999 digits. Its
    sign (never for a zero), the digits before the point (at least "0"), and the point and as many digits
    after it as the number was sent with (its scale), computed from its exponent alone."""
    exponent = number.as_tuple().exponent
    assert isinstance(exponent, int)  # read_json makes no NaN or Infinity
    zero = not number
    before = 1 if zero or number.adjusted() < 0 else number.adjusted() + 1
    return (number.is_signed() and not zero) + before + (1 - exponent if exponent < 0 else 0)


def written_out(size: int, limit: int, setting: str) -> str:
    """Why a value whose numbers write out past its limit (`setting`) is refused, in the same words
    everywhere."""
    return (
        f"is {size} bytes with its numbers written out in full, as PostgreSQL returns them"
        f" (1e999 is a 1 and 999 zeros); the limit is {limit} bytes ({setting}): send such numbers as"
        " strings"
    )


def written_size(data: bytes, value: Any) -> int:
    """The size of `data`, ``encode_json(value)``, with every number as long as PostgreSQL writes it out
    (``written_length``): the size a value is held to its limit by. Only a number encoded with an
    exponent ("1E+999", "1E-7") writes out longer, so text without an "E" is its own size (a memchr)."""
    if _E not in data or (b"E+" not in data and b"E-" not in data):
        return len(data)
    size = len(data)
    values = [value]
    while values:
        item = values.pop()
        if isinstance(item, dict):
            values.extend(item.values())
        elif isinstance(item, list):
            values.extend(item)
        elif type(item) is Decimal:
            size += written_length(item) - len(str(item))
    return size


# Numbers with an exponent in JSON text as sent: a digit, then "e" or "E". Looked for with the digits
# made "0", "E" made "e" and a sign made "-", first with the other letters, quotes and underscores taken
# out (a shorter text to search: about 1 ns a byte in all; what that brings together, as "2nde", is only
# looked at again), then, where one is found, with nothing taken out, as written.
_AS_EXPONENTS = bytes.maketrans(b"123456789E+", b"000000000e-")
_NOT_IN_NUMBERS = b'abcdfghijklmnopqrstuvwxyzABCDFGHIJKLMNOPQRSTUVWXYZ"_'


def exponent_growth(text: bytes) -> int:
    """At most how many bytes longer than JSON text as sent PostgreSQL writes its numbers out: 0 for
    text with no number with an exponent, found in one pass. A number with an exponent of k digits
    writes out at most 10^k + 1 bytes longer than sent ("1e9" as "1000000000"; "1e-9" as "0.000000001"),
    so only the lengths of the exponents are counted; a string that looks so ("3e4f") counts as one."""
    if b"0e" not in text.translate(_AS_EXPONENTS, _NOT_IN_NUMBERS):
        return 0
    marked = text.translate(_AS_EXPONENTS)
    growth = 0
    for k in range(1, 10):  # exponents of at least k digits
        digits = b"0" * k
        found = marked.count(b"0e" + digits) + marked.count(b"0e-" + digits)
        if not found:
            return growth
        growth += found * (10**k - 10 ** (k - 1) + (2 if k == 1 else 0))
    return growth + 10**18  # ten digits or more: past any limit


def _exact(value: Decimal | HugeNumber) -> str:
    """A number read by ``read_json`` as its JSON text, if jsonb holds it; NumberOutOfRange if not."""
    if type(value) is Decimal:
        text = str(value)  # digits and exponent as read: "2.50", "1E+999"; never NaN or Infinity here
        # Without an exponent, only a text of over 16,383 characters can be out of range.
        if ("E" not in text and len(text) <= NUMERIC_MAX_SCALE) or fits_jsonb(text):
            return text
    else:
        text = value.text  # past Decimal's exponents, and so past PostgreSQL's
    shown = text if len(text) <= 40 else f"{text[:20]}...{text[-12:]}"
    raise NumberOutOfRange(
        f"holds the number {shown}, which PostgreSQL cannot store exactly (at most 131,072 digits"
        " before the decimal point and 16,383 after)"
    )


# Decimals written as numbers, by their digits and exponent (str(Decimal)), in C; integers of any size.
_WRITE = msgspec.json.Encoder(decimal_format="number")
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_DIGITS = b"0" * (NUMERIC_MAX_SCALE + 1)
_E = ord("E")


def encode_json(value: Any) -> bytes:
    """A JSON value as compact UTF-8 text for PostgreSQL, numbers read by ``read_json`` exactly as they
    were sent (msgspec). NumberOutOfRange for a number jsonb cannot hold; UnicodeEncodeError for a lone
    surrogate, which no UTF-8 text can hold."""
    try:
        data = _WRITE.encode(value)
    except TypeError:
        _check_numbers(value)  # a HugeNumber, refused in words
        raise
    # A number jsonb cannot hold is written with an exponent ("E+", "E-") or with over 16,383 digits in a
    # row; only a text with either (or a string that looks so) is looked through number by number. An
    # "E" first: a byte is found by memchr, 4 times faster than a two-byte string.
    if (_E in data and (b"E+" in data or b"E-" in data)) or (
        len(data) > NUMERIC_MAX_SCALE and _LONG_DIGITS in data.translate(_DIGITS_AS_ZERO)
    ):
        _check_numbers(value)
    return data


def _check_numbers(value: Any) -> None:
    if isinstance(value, dict):
        for item in value.values():
            _check_numbers(item)
    elif isinstance(value, list):
        for item in value:
            _check_numbers(item)
    elif type(value) is Decimal or type(value) is HugeNumber:
        _exact(value)


# Payloads kept as the JSON text they came in (``msgspec.Raw``: app/http/fastpath/bodies.py reads them so),
# which PostgreSQL parses into jsonb in any case: held to the payload limit as the values ``read_json``
# reads are, and read only when their size may come near it.


def payload_text(payload: msgspec.Raw, limit: int, look: bool = True) -> tuple[bytes, int]:
    """The text to store of a payload kept as text: as sent, or compact when that is over `limit`; and its
    size as held to `limit` (``written_size``), read and counted only when its numbers may write out past
    the limit (``exponent_growth``; not looked for if not `look`)."""
    text = bytes(payload)
    if len(text) <= limit and not (look and len(text) + exponent_growth(text) > limit):
        return text, len(text)
    value = read_json(text)
    compact = encode_json(value)
    return (text if len(text) <= limit else compact), written_size(compact, value)


def any_may_write_out_past(payloads: list[msgspec.Raw], limit: int) -> bool:
    """Whether any of the payloads kept as text may be over `limit` once their numbers are written out,
    looked for in all of them at once: one pass over their text, where a look at each payload would
    cost a call and a copy more per job."""
    text = payloads[0] if len(payloads) == 1 else b" ".join(payloads)
    growth = exponent_growth(bytes(text))
    return growth > 0 and max(map(len, payloads)) + growth > limit
