"""Statements read as SQL: each concept's statements live in ``app/db/sql/<concept>.sql``,
loaded once at import.

A file is a series of named blocks::

    -- name: park_lanes
    -- What it does.  Index: what it relies on.  Locks: what it takes.
    UPDATE lanes SET active = false WHERE job_type = :job_type AND ...

Parameters are named (``:job_type``) and mapped here to asyncpg's ``$1, $2, ...`` in the
order they first appear; a call passes them by name (``Statement.args``), so a statement
never gets its arguments by position, and none can be left out or passed twice.  A
``::type`` cast and anything inside a quoted string or a comment is not a parameter;
``$n`` in a file is refused.  ``tests/integration/test_sql_files.py`` parses and plans
every statement on a migrated database; ``python -m app.db.catalog`` writes them, as
PostgreSQL receives them, under docs/sql.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

_BLOCK = re.compile(r"^-- name: (\w+)[ \t]*$", re.MULTILINE)
# A quoted string, a quoted identifier or a comment (skipped whole), a cast, a parameter.
_TOKEN = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|::|:([a-z_][a-z0-9_]*)")
_SKIPPED = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*")
_POSITIONAL = re.compile(r"\$\d")


@dataclass(frozen=True, slots=True)
class Statement:
    concept: str
    name: str
    header: tuple[str, ...]  # the comment lines under the name, without "-- "
    text: str  # as PostgreSQL receives it: the parameters as $1, $2, ...
    params: tuple[str, ...]  # the parameters' names, $1 first

    def args(self, **values: Any) -> list[Any]:
        """The statement's arguments in ``$n`` order, from ``values`` by name: every
        parameter given, and nothing else."""
        missing = [p for p in self.params if p not in values]
        extra = sorted(set(values) - set(self.params))
        if missing or extra:
            raise TypeError(
                f"{self.concept}.{self.name}: missing {missing}, unknown {extra}"
                if extra
                else f"{self.concept}.{self.name}: missing {missing}"
            )
        return [values[p] for p in self.params]

    def bind(self, **values: Any) -> tuple[Any, ...]:
        """The text and its arguments, as a driver call takes them:
        ``await db.fetch(*SQL["name"].bind(job_type=t, ...))``."""
        return (self.text, *self.args(**values))


def parse(concept: str, source: str) -> dict[str, Statement]:
    """The named blocks of ``source`` (a .sql file's text), by name."""
    found: dict[str, Statement] = {}
    marks = list(_BLOCK.finditer(source))
    if source[: marks[0].start() if marks else len(source)].strip():
        raise ValueError(f"{concept}.sql: text before the first '-- name:'")
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(source)
        lines = source[m.end() : end].strip("\n").splitlines()
        header = []
        while lines and lines[0].startswith("--"):
            header.append(lines.pop(0)[2:].removeprefix(" "))
        body = "\n".join(lines).strip()
        name = m.group(1)
        if not body:
            raise ValueError(f"{concept}.sql: {name} has no statement")
        if name in found:
            raise ValueError(f"{concept}.sql: {name} is named twice")
        text, params = _numbered(concept, name, body)
        found[name] = Statement(concept, name, tuple(header), text, params)
    return found


def _numbered(concept: str, name: str, body: str) -> tuple[str, tuple[str, ...]]:
    """``body`` with its named parameters as $1, $2, ... (in order of first use), and
    their names."""
    if _POSITIONAL.search(_SKIPPED.sub("", body)):
        raise ValueError(f"{concept}.{name}: name its parameters (:name), not $n")
    params: list[str] = []

    def number(m: re.Match[str]) -> str:
        param = m.group(1)
        if param is None:
            return m.group(0)  # a string, a quoted name, a comment or a cast: as it is
        if param not in params:
            params.append(param)
        return f"${params.index(param) + 1}"

    return _TOKEN.sub(number, body), tuple(params)


def load(concept: str) -> dict[str, Statement]:
    """``app/db/sql/<concept>.sql``'s statements, by name."""
    source = resources.files("app.db").joinpath("sql", f"{concept}.sql").read_text()
    return parse(concept, source)


def concepts() -> list[str]:
    """The concepts that have a .sql file, by name."""
    folder = resources.files("app.db").joinpath("sql")
    return sorted(p.name.removesuffix(".sql") for p in folder.iterdir() if p.name.endswith(".sql"))
