"""docs/sql holds every named statement as PostgreSQL receives it, and is kept fresh; and
the storage modules keep no statement of their own in Python."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import app.db
from app.db import catalog, sql

ROOT = Path(__file__).resolve().parents[2]
STATEMENT = re.compile(r"^\s*(SELECT|WITH|INSERT|UPDATE|DELETE)\b", re.IGNORECASE)
# Statements that stay in Python, and why: alembic's env takes the migration lock through
# SQLAlchemy's synchronous driver, before any app.db.sql statement could be loaded.
IN_PYTHON = {"app.db.locks.MIGRATION_LOCK"}


@pytest.mark.parametrize("concept", sql.concepts())
def test_docs_sql_is_fresh(concept: str) -> None:
    path = ROOT / "docs" / "sql" / f"{concept}.sql"
    assert path.read_text() == catalog.render(concept), (
        f"{path.relative_to(ROOT)} is stale: run `python -m app.db.catalog`"
    )


@pytest.mark.parametrize("concept", sql.concepts())
def test_every_statement_has_a_header(concept: str) -> None:
    for st in sql.load(concept).values():
        assert st.header, f"{concept}.{st.name}: a header says what the statement does"


def test_no_storage_module_keeps_a_statement_in_python() -> None:
    """A statement is a named block of a .sql file (app.db.sql), not a string constant: a
    module-level string that reads as a statement fails here (a dynamic one is built by
    a function, and says why)."""
    found = set()
    for info in pkgutil.iter_modules(app.db.__path__):
        mod = importlib.import_module(f"app.db.{info.name}")
        for name, value in vars(mod).items():
            if isinstance(value, str) and STATEMENT.match(value) and name.isupper():
                if getattr(mod, "__name__", "") == f"app.db.{info.name}":
                    found.add(f"app.db.{info.name}.{name}")
    assert found - IN_PYTHON == set()
    assert IN_PYTHON <= found  # the exception is still there: else drop it


def test_the_check_above_sees_a_statement_left_in_python(monkeypatch) -> None:
    from app.db import lanes

    monkeypatch.setattr(lanes, "HOLD_LANES", "UPDATE lanes SET held = true", raising=False)
    with pytest.raises(AssertionError):
        test_no_storage_module_keeps_a_statement_in_python()
