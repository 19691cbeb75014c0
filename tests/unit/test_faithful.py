"""The check of free-form values: its fast walk and its path-finding walk agree, and the
path names a value that really is the problem."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic_core import PydanticCustomError

from app.api import faithful

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=5),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.text(alphabet=st.characters(codec="utf-8"), max_size=3), inner, max_size=4
        )
    ),
    max_leaves=20,
)


def _at(value: Any, path: tuple[str | int, ...]) -> Any:
    for step in path:
        value = value[step]
    return value


def _bad(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return not faithful.INT_MIN <= value <= faithful.INT_MAX
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any("\x00" in k for k in value)
    return False


@given(st.dictionaries(st.text(max_size=3), values, max_size=4))
def test_the_fast_walk_and_the_path_agree_and_the_path_is_right(value):
    found = faithful.first_problem(value)
    assert faithful._clean(value) == (found is None)
    if found is not None:
        path, _ = found
        assert _bad(_at(value, path))


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"a": [1, {"b": "x\x00"}]}, ["a", 1, "b"]),
        ({"a": {"k\x00": 1}}, ["a"]),
        ({"a": 1 << 64}, ["a"]),
        ({"a": -(1 << 63) - 1}, ["a"]),
        ({"ok": 1, "a": [float("nan")]}, ["a", 0]),
        ({"first": float("inf"), "second": "\x00"}, ["first"]),
    ],
)
def test_the_error_names_the_first_offending_value(value, path):
    with pytest.raises(PydanticCustomError) as caught:
        faithful.check(value)
    assert caught.value.type == faithful.ERROR_TYPE
    assert caught.value.context["path"] == path


def test_what_64_bits_and_a_double_hold_passes():
    value = {"a": [(1 << 64) - 1, -(1 << 63), 1.5e308, -0.0, "é\u2028😀", None, True]}
    assert faithful.check(value) is value


# JSON number texts: a sign, digits, a fraction, an exponent (within what the reference
# below can take exactly), and the shapes that matter: zeros, 15 to 20 digits, subnormals.
number_texts = st.builds(
    lambda sign, whole, frac, exp: f"{sign}{whole}{'.' + frac if frac else ''}{exp}",
    st.sampled_from(["", "-"]),
    st.from_regex(r"0|[1-9][0-9]{0,19}", fullmatch=True),
    st.one_of(st.just(""), st.from_regex(r"[0-9]{1,20}", fullmatch=True)),
    st.one_of(
        st.just(""),
        st.integers(-400, 400).map(lambda e: f"e{e}"),
        st.sampled_from(["e-324", "e-323", "e-308", "e308", "E+2", "e0"]),
    ),
)


@given(number_texts)
def test_a_number_is_taken_exactly_when_its_stored_double_has_its_value(text):
    """The reference, in exact rationals: orjson writes a double as its shortest repr,
    and PostgreSQL stores that decimal; the number sent is kept iff that is its value,
    it is finite, and it is not a negative zero (numeric has none)."""
    f = float(text)
    kept = (
        math.isfinite(f)
        and Fraction(text) == Fraction(repr(f))
        and not (Fraction(text) == 0 and text.startswith("-"))
    )
    raw = f'{{"n": [{text}]}}'.encode()
    if "." not in text and "e" not in text.lower():
        return  # an integer: jiter reads it as one, and the float rule does not apply
    try:
        faithful.as_sent(raw)
        taken = True
    except faithful.NotAsSent as exc:
        taken = False
        assert str(exc).startswith("n.0: the number"), exc
    assert taken == kept, (text, f)
