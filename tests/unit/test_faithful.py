"""The check of free-form values: its fast walk and its path-finding walk agree, and the
path names a value that really is the problem."""

from __future__ import annotations

import math
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
