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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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


def message(error: Any) -> str:
    """A pydantic error's message, said plainly for the NUL a string's pattern refuses."""
    if error["type"] == "string_pattern_mismatch" and error.get("ctx", {}).get("pattern") == NO_NUL:
        return NUL_MESSAGE
    return str(error["msg"]).removeprefix("Value error, ")


def located(loc: Sequence[str | int], ctx: dict[str, Any]) -> list[str | int]:
    """A field's location with the path inside it that ``check`` found."""
    return [*loc, *ctx.get("path", ())]
