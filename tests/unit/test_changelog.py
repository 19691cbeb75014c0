"""CHANGELOG.md's table of schema revisions says of each migration what the migration
itself declares: the oldest server it serves, and whether it contracts (raises that)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _declared() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for path in sorted((ROOT / "alembic" / "versions").glob("[0-9][0-9][0-9][0-9]_*.py")):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        out[module.revision] = getattr(module, "oldest_server", None)
    return out


def _table() -> dict[str, tuple[str, str]]:
    text = (ROOT / "CHANGELOG.md").read_text()
    rows = re.findall(r"^\| (\d{4}) \| [^|]+ \| ([^|]+) \| ([^|]+) \|$", text, re.M)
    return {rev: (oldest.strip(), contracts.strip()) for rev, oldest, contracts in rows}


def test_every_migration_is_in_the_changelog_as_it_declares_itself():
    declared, table = _declared(), _table()
    assert sorted(table) == sorted(declared), "a migration missing from CHANGELOG.md"
    before = None
    for rev in sorted(declared):
        oldest = declared[rev]
        shown, contracts = table[rev]
        assert shown == (oldest or "-"), rev
        if oldest is not None:
            raised = before is None or oldest > before
            assert contracts == ("yes" if raised else "no"), rev
            before = oldest
