"""The package is typed: mypy --strict finds nothing (py.typed ships with it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "jobfair_client"


def test_mypy_strict_is_clean():
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(PACKAGE)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert (PACKAGE / "py.typed").exists()
