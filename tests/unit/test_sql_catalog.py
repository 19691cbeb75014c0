"""docs/sql holds every named statement as PostgreSQL receives it, and is kept fresh."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

from app.db import catalog

ROOT = Path(__file__).resolve().parents[2]
STATEMENT = re.compile(r"^\s*(SELECT|WITH|INSERT|UPDATE|DELETE)\b", re.IGNORECASE)


@pytest.mark.parametrize("module", catalog.MODULES)
def test_docs_sql_is_fresh(module: str) -> None:
    path = ROOT / "docs" / "sql" / f"{module}.sql"
    assert path.read_text() == catalog.render(module), (
        f"{path.relative_to(ROOT)} is stale: run `python -m app.db.catalog`"
    )


@pytest.mark.parametrize("module", catalog.MODULES)
def test_every_statement_has_a_named_header(module: str) -> None:
    """A public constant holding a whole statement is named (``# -- name: x`` above it,
    with what it does): so it is in docs/sql and a reviewer finds it."""
    mod = importlib.import_module(f"app.db.{module}")
    source = inspect.getsource(mod)
    named = {st.name.upper() for st in catalog.statements(module)}
    statements = {
        name
        for name, value in vars(mod).items()
        if name.isupper()
        and not name.startswith("_")
        and isinstance(value, str)
        and STATEMENT.match(value)
        and re.search(rf"^{name} = ", source, re.MULTILINE)  # its own, not imported
    }
    assert statements - named == set(), "statements without a header"
    for st in catalog.statements(module):
        assert st.header, f"{module}.{st.name}: a header says what the statement does"
