"""What a free-form JSON value (``variables``, ``customHeaders``, Camunda's ``result``)
may hold, so that it is stored as sent or refused: never a 500, never changed.

PostgreSQL's jsonb cannot store NUL (U+0000) in a string or a key; orjson, which writes
the value for PostgreSQL and reads it back for every answer, holds integers in 64 bits
(-2**63 to 2**64-1) and has no NaN or Infinity (it writes them as null).  The body's JSON
parser (pydantic's) reads ``NaN``, ``Infinity`` and numbers beyond a double's range as
floats, and integers of any size exactly, so each can be found after parsing and named by
its path.  Lone surrogates and invalid UTF-8 never get this far: the parser refuses them.

The typed fields of a body are bounded by their own types (``schemas``); this is the check
for the values no schema describes.

Two things the parser's reading hides are found on the body's text (``as_sent``), read
once more by jiter with its duplicate-key check and its lossless floats: an object with a
key twice (the parser keeps the last value, a proxy in front may read the first), and a
number a double cannot keep as sent -- ``1e-400`` would be stored as ``0.0``, ``-0.0`` as
``0`` (PostgreSQL's numeric has no negative zero), ``0.1000000000000000055511151231257827``
as ``0.1``.  Both are refused anywhere in a body, typed fields too: a number is taken only
if the value stored, or used, is the value sent.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

import jiter
from pydantic_core import PydanticCustomError

INT_MIN = -(1 << 63)
INT_MAX = (1 << 64) - 1  # orjson writes unsigned 64-bit integers too
ERROR_TYPE = "unfaithful_value"
NO_NUL = r"^[^\x00]*$"  # the pattern of every free string (schemas)
NUL_MESSAGE = "NUL (U+0000) cannot be stored in a string"

Path = tuple[str | int, ...]


def check(value: dict[str, Any]) -> dict[str, Any]:
    """``value`` itself, or a validation error naming the first value that cannot be
    stored faithfully (a pydantic ``AfterValidator``)."""
    if _clean(value):
        return value
    found = first_problem(value)
    assert found is not None, "_clean and first_problem disagree"
    path, message = found
    raise PydanticCustomError(ERROR_TYPE, "{message}", {"path": list(path), "message": message})


def _clean(value: Any) -> bool:
    """Whether nothing in ``value`` needs reporting: the fast, pathless walk every body
    with free-form values takes."""
    stack = [value]
    pop, push, extend = stack.pop, stack.append, stack.extend
    while stack:
        v = pop()
        t = type(v)
        if t is str:
            if "\x00" in v:
                return False
        elif t is dict:
            for k, item in v.items():
                if "\x00" in k:
                    return False
                push(item)
        elif t is list:
            extend(v)
        elif t is int:
            if not INT_MIN <= v <= INT_MAX:
                return False
        elif t is float:
            if v - v != 0.0:  # NaN and ±inf, without a call
                return False
    return True


def first_problem(value: Any) -> tuple[Path, str] | None:
    """The path (keys and list indexes) of the first offending value, in document
    order, and what is wrong with it; None when there is none."""
    stack: list[tuple[Any, Path]] = [(value, ())]
    while stack:
        v, path = stack.pop()
        t = type(v)
        if t is str:
            if "\x00" in v:
                return path, NUL_MESSAGE
        elif t is dict:
            for k in v:
                if "\x00" in k:
                    return path, f"the key {k!r} contains NUL (U+0000), which cannot be stored"
            stack.extend((item, (*path, k)) for k, item in reversed(v.items()))
        elif t is list:
            stack.extend((item, (*path, i)) for i, item in reversed(list(enumerate(v))))
        elif t is int:
            if not INT_MIN <= v <= INT_MAX:
                return path, "an integer beyond 64 bits (-2^63 to 2^64-1) cannot be stored"
        elif t is float:
            if v - v != 0.0:
                return path, (
                    "numbers must be finite: NaN, Infinity and numbers beyond a double's "
                    "range (about 1.8e308) are refused rather than stored as null"
                )
    return None


# A digit followed by a fraction or an exponent: the body may hold a number that is not an
# integer (or a string that looks so: the walk then finds nothing).
_FLOATISH = re.compile(rb"[0-9][.eE]")


class NotAsSent(ValueError):
    """The body holds something that would not be kept as sent: what, and where."""


def as_sent(raw: bytes) -> None:
    """Raise ``NotAsSent`` naming the first key given twice in an object of ``raw``, or
    the path of its first number that a double does not keep as sent.  ``raw`` has
    already been parsed and validated (it is JSON).  Linear in the body: the walk keeps
    no paths (a path is found only for a number found wrong), and most numbers are
    settled by their length alone."""
    try:
        value = jiter.from_json(
            raw, catch_duplicate_keys=True, float_mode="lossless-float", cache_mode="none"
        )
    except ValueError as exc:
        text = str(exc)
        if text.startswith("Detected duplicate key "):
            # 'Detected duplicate key "k" at line L column C': the key may say " at " too.
            key, _, where = text.removeprefix("Detected duplicate key ").rpartition(" at line ")
            raise NotAsSent(
                f"the key {_shown(key)} is given twice in one object (at line {where}); "
                "send each key once"
            ) from None
        raise NotAsSent(f"body is not valid JSON: {text}") from None
    if _FLOATISH.search(raw) is None or _all_exact(value):
        return
    found = _first_inexact(value)
    assert found is not None, "_all_exact and _first_inexact disagree"
    path, text = found
    where = ".".join(str(p) for p in path)
    raise NotAsSent(f"{where + ': ' if where else ''}the number {_shown(text)} {_why(text)}")


def _shown(text: str, most: int = 60) -> str:
    """``text`` as a problem's detail quotes it: at most ``most`` characters."""
    return text if len(text) <= most else text[: most - 1] + "…"


def _why(text: str) -> str:
    """What would become of a number that cannot be kept as sent."""
    f = float(text)
    if f == 0.0 and text.startswith("-") and _is_zero(text.encode()):
        return (
            "cannot be kept: JSON numbers are stored and compared as decimals, which have "
            "no negative zero (send 0)"
        )
    return (
        f"cannot be kept as sent: as a double it is {f!r} (a double keeps 15 to 17 "
        "significant digits, and no number closer to 0 than 5e-324)"
    )


# Sign, integer digits, fraction digits, exponent of a JSON number.
_NUMBER = re.compile(rb"(-?)([0-9]+)(?:\.([0-9]+))?(?:[eE]([-+]?[0-9]+))?")


def _is_zero(text: bytes) -> bool:
    """Whether the JSON number ``text`` is zero, whatever its exponent."""
    m = _NUMBER.fullmatch(text)
    return m is not None and not (m[2] + (m[3] or b"")).strip(b"0")


def _exact(number: jiter.LosslessFloat) -> bool:
    """Whether the double nearest ``number`` has exactly its decimal value (and sign)."""
    text = bytes(number)
    # No exponent and at most 15 digits: a normal double, and any such decimal survives
    # the trip through one (DBL_DIG).  Most numbers sent stop here.
    if len(text) <= 16 and b"e" not in text and b"E" not in text:
        digits = len(text) - (b"." in text) - text.startswith(b"-")
        if digits <= 15:
            return not (text.startswith(b"-") and _is_zero(text))  # -0.0: no such numeric
    f = float(number)
    if f - f != 0.0:
        return False  # beyond a double's range: refused where it is checked
    if f == 0.0:
        # Zero only if the number is zero (1e-400 underflows), and not negative (numeric
        # has no negative zero); an exponent too long for Decimal is no obstacle.
        return _is_zero(text) and not text.startswith(b"-")
    if repr(f).encode() == text:
        return True
    m = _NUMBER.fullmatch(text)
    if m is None or (m[4] is not None and len(m[4].lstrip(b"+-")) > 6):
        return False  # a nonzero double from such an exponent is not its value
    try:
        return Decimal(text.decode()) == Decimal(repr(f))
    except InvalidOperation:
        return False


def _all_exact(value: Any) -> bool:
    """Whether every number in ``value`` (jiter's, lossless) is kept exactly by its
    double: the pathless walk every body with a fraction or exponent in it takes."""
    stack = [value]
    pop, extend = stack.pop, stack.extend
    lossless = jiter.LosslessFloat
    while stack:
        v = pop()
        t = type(v)
        if t is dict:
            extend(v.values())
        elif t is list:
            extend(v)
        elif t is lossless and not _exact(v):
            return False
    return True


def _first_inexact(value: Any) -> tuple[Path, str] | None:
    """The path of the first number in ``value`` (jiter's, lossless) that a double does
    not keep exactly, and its text, in document order (only once one was found)."""
    stack: list[tuple[Any, Path]] = [(value, ())]
    while stack:
        v, path = stack.pop()
        t = type(v)
        if t is dict:
            stack.extend((item, (*path, k)) for k, item in reversed(v.items()))
        elif t is list:
            stack.extend((item, (*path, i)) for i, item in reversed(list(enumerate(v))))
        elif t is jiter.LosslessFloat and not _exact(v):
            return path, bytes(v).decode()
    return None


def message(error: Any) -> str:
    """A pydantic error's message, said plainly for the NUL a string's pattern refuses."""
    if error["type"] == "string_pattern_mismatch" and error.get("ctx", {}).get("pattern") == NO_NUL:
        return NUL_MESSAGE
    return str(error["msg"]).removeprefix("Value error, ")


def located(loc: Sequence[str | int], ctx: dict[str, Any]) -> list[str | int]:
    """A field's location with the path inside it that ``check`` found."""
    return [*loc, *ctx.get("path", ())]
