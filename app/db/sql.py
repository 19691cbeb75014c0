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

A statement that shares a part with others names it: ``{{wake}}`` puts in the
``-- fragment: wake`` block of the same file, ``{{lanes.wake}}`` another file's, and
``{{PROBED_LANES}}`` (capitals) a bound shared with the Python (app.db.bounds).  A
fragment has no arguments -- its parameters are named as a statement's are, and numbered
in the statement that includes it -- and may include others; a name that resolves to
nothing, or a fragment that includes itself, is refused at load.  So a part is written
once and read as SQL, and docs/sql shows each statement whole.

A block may have a second spelling for Citus (``-- name: claim @citus``, ``-- fragment: j
@citus``): ``load(concept, citus=True)`` takes it wherever it exists, for a statement and
for every fragment put in, and the plain spelling elsewhere.  So a statement that Citus
plans as it is stays one text, and one that needs its shards named
(``{{shards.j}}``: nothing on one PostgreSQL, ``AND j.shard = ANY(:shards)`` on Citus) is
still written once (docs/scaling.md).  A fragment may be empty, and a statement may exist
only for Citus.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from app.db.bounds import constants

_BLOCK = re.compile(r"^-- (name|fragment): (\w+)(?:[ \t]+(@citus))?[ \t]*$", re.MULTILINE)
CITUS = "@citus"
# A quoted string (a bound may be put in it), a quoted identifier or a comment (kept
# whole), or a name to put in.
_INCLUDE = re.compile(
    r"('(?:[^']|'')*')|\"(?:[^\"]|\"\")*\"|--[^\n]*"
    r"|\{\{([A-Za-z_][A-Za-z0-9_]*(?:\.[a-z_][a-z0-9_]*)?)\}\}"
)
_BOUND = re.compile(r"\{\{([A-Z_][A-Z0-9_]*)\}\}")
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


@dataclass(frozen=True, slots=True)
class _Block:
    kind: str  # "name" (a statement) or "fragment"
    name: str
    header: tuple[str, ...]
    body: str


def _blocks(concept: str, source: str) -> dict[str, _Block]:
    """``source``'s blocks, statements and fragments, by name (one namespace)."""
    found: dict[str, _Block] = {}
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
        kind, name = m.group(1), m.group(2) + (m.group(3) or "")
        if not body and kind == "name":
            raise ValueError(f"{concept}.sql: {name} has no statement")
        if name in found:
            raise ValueError(f"{concept}.sql: {name} is named twice")
        found[name] = _Block(kind, name, tuple(header), body)
    return found


def parse(
    concept: str,
    source: str,
    others: dict[str, dict[str, _Block]] | None = None,
    *,
    citus: bool = False,
) -> dict[str, Statement]:
    """The statements of ``source`` (a .sql file's text), by name, with their fragments
    and bounds put in.  ``others``: other files' blocks by concept (read from
    app/db/sql when not given).  ``citus``: each block's Citus spelling where it has one
    (a statement only Citus has included)."""
    blocks = {concept: _blocks(concept, source), **(others or {})}
    bounds = constants()

    def expand(where: str, body: str, within: tuple[str, ...]) -> str:
        def bound(ref: str) -> str:
            if ref not in bounds:
                raise ValueError(f"{where}: no bound {{{{{ref}}}}} (app.db.bounds)")
            return str(bounds[ref])

        def put(m: re.Match[str]) -> str:
            quoted, ref = m.group(1), m.group(2)
            if quoted is not None:
                # A bound in a string ('{{NOTIFY_CHANNEL}}') is put in; nothing else is.
                return _BOUND.sub(lambda b: bound(b.group(1)), quoted)
            if ref is None:
                return m.group(0)  # a quoted name or a comment: as it is
            if ref.isupper():
                return bound(ref)
            owner, _, name = ref.rpartition(".")
            owner = owner or within[-1].split(".")[0]
            if owner not in blocks:
                blocks[owner] = _blocks(owner, _source(owner))
            block = (citus and blocks[owner].get(name + CITUS)) or blocks[owner].get(name)
            if block is None or block.kind != "fragment":
                raise ValueError(f"{where}: no fragment {{{{{ref}}}}} in {owner}.sql")
            full = f"{owner}.{name}"
            if full in within:
                raise ValueError(f"{where}: {full} includes itself")
            return expand(where, block.body, (*within, full))

        return _INCLUDE.sub(put, body)

    found: dict[str, Statement] = {}
    own = blocks[concept]
    names = [b.name for b in own.values() if b.kind == "name"]
    for spelled in names:
        name = spelled.removesuffix(CITUS)
        if name in found or (spelled != name and not citus):
            continue
        block = (citus and own.get(name + CITUS)) or own[spelled]
        where = f"{concept}.{name}"
        body = expand(where, block.body, (where,))
        text, params = _numbered(concept, name, body)
        found[name] = Statement(concept, name, block.header, text, params)
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


def _source(concept: str) -> str:
    return resources.files("app.db").joinpath("sql", f"{concept}.sql").read_text()


class Statements(dict[str, Statement]):
    """A concept's statements by name, and (``citus``) as Citus runs them."""

    def __init__(self, concept: str, plain: dict[str, Statement]) -> None:
        super().__init__(plain)
        self.concept = concept
        self._citus: dict[str, Statement] | None = None

    @property
    def citus(self) -> dict[str, Statement]:
        if self._citus is None:
            self._citus = parse(self.concept, _source(self.concept), citus=True)
        return self._citus

    def on(self, shards: Sequence[int] | None, name: str, **values: Any) -> tuple[Any, ...]:
        """``name`` bound to ``values``: as it is where ``shards`` is None (one
        PostgreSQL), else its Citus spelling, for the rows of ``shards`` (all in one Citus
        shard: the statement runs on the node that holds it)."""
        if shards is None:
            return self[name].bind(**values)
        return self.citus[name].bind(shards=list(shards), **values)


def load(concept: str, *, citus: bool = False) -> Statements:
    """``app/db/sql/<concept>.sql``'s statements, by name (``citus``: as Citus runs them;
    ``.citus`` of the answer has them too)."""
    if citus:
        found = Statements(concept, {})
        found._citus = parse(concept, _source(concept), citus=True)
        found.update(found._citus)
        return found
    return Statements(concept, parse(concept, _source(concept)))


def concepts() -> list[str]:
    """The concepts that have a .sql file, by name."""
    folder = resources.files("app.db").joinpath("sql")
    return sorted(p.name.removesuffix(".sql") for p in folder.iterdir() if p.name.endswith(".sql"))
