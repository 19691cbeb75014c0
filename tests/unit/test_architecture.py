"""The structure docs/architecture.md describes, enforced: the import contracts in
pyproject.toml (import-linter), checked on the tree and shown to catch a violation; and
no module of app/ over 600 lines."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")
MOST_LINES = 600


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT), "--no-cache", str(root / "pyproject.toml")],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _contracts() -> dict[str, dict]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {c["id"]: c for c in config["contracts"]}


def test_the_import_contracts_hold():
    out = _lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


@pytest.mark.parametrize(
    ("module", "line"),
    [
        ("app/scheduler/units.py", "from app.db import Database"),
        ("app/api/jobs.py", "from app.db import job_rows"),
        ("app/metrics/events.py", "from app.domain import utcnow"),
        ("app/db/job_rows.py", "from app.activation import Activation"),
        ("app/activation/rounds.py", "from app.db import claims"),
    ],
)
def test_a_violation_breaks_a_contract(tmp_path, module, line):
    """Each rule bites: the tree copied, one import that breaks it added."""
    shutil.copytree(ROOT / "app", tmp_path / "app", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    target = tmp_path / module
    text = target.read_text()
    head, sep, rest = text.partition("from __future__ import annotations\n")
    target.write_text(head + sep + line + "  # noqa\n" + rest)
    out = _lint(tmp_path)
    assert out.returncode != 0, out.stdout
    assert "BROKEN" in out.stdout


def test_the_forbidden_lists_name_every_module_of_app():
    """A module added to app/ is covered by the scheduler's and the events' contracts."""
    app = ROOT / "app"
    top = {
        f"app.{p.stem if p.is_file() else p.name}"
        for p in app.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()
    }
    contracts = _contracts()
    assert top - {"app.scheduler"} <= set(contracts["scheduler"]["forbidden_modules"])
    events = set(contracts["events"]["forbidden_modules"])
    assert top - {"app.metrics"} <= events
    assert {"app.metrics.scrape", "app.metrics.loops"} <= events


def test_no_module_of_app_is_over_600_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / "app").rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MOST_LINES
    }
    assert not long, f"over {MOST_LINES} lines: {long}"
