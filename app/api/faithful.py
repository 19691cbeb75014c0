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
from decimal import Decimal
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
    already been parsed and validated (it is JSON)."""
    try:
        value = jiter.from_json(
            raw, catch_duplicate_keys=True, float_mode="lossless-float", cache_mode="none"
        )
    except ValueError as exc:
        text = str(exc)
        if text.startswith("Detected duplicate key"):
            key, _, where = text.removeprefix("Detected duplicate key ").partition(" at ")
            raise NotAsSent(
                f"the key {key} is given twice in one object ({where}); send each key once"
            ) from None
        raise NotAsSent(f"body is not valid JSON: {text}") from None
    if _FLOATISH.search(raw) is None:
        return
    found = _first_inexact(value)
    if found is not None:
        path, text = found
        where = ".".join(str(p) for p in path)
        raise NotAsSent(f"{where + ': ' if where else ''}the number {text} {_why(text)}")


def _why(text: str) -> str:
    """What would become of a number that cannot be kept as sent."""
    f = float(text)
    if f == 0.0 and text.startswith("-"):
        return (
            "cannot be stored: JSON numbers are stored as PostgreSQL numerics, which have "
            "no negative zero (send 0)"
        )
    return (
        f"cannot be kept as sent: as a double it is {f!r} (a double keeps 15 to 17 "
        "significant digits, and no number closer to 0 than 5e-324)"
    )


def _exact(number: jiter.LosslessFloat) -> bool:
    text = bytes(number)
    f = float(number)
    if f - f != 0.0:
        return False  # beyond a double's range: refused where it is checked
    if f == 0.0:
        # 0.0 from 1e-400 (underflow), or -0.0, which numeric stores as 0.
        return not text.startswith(b"-") and Decimal(text.decode()) == 0
    return repr(f).encode() == text or Decimal(text.decode()) == Decimal(repr(f))


def _first_inexact(value: Any) -> tuple[Path, str] | None:
    """The path of the first number in ``value`` (jiter's, lossless) that a double does
    not keep exactly, and its text, in document order."""
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
