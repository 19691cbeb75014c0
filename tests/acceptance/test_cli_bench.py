"""`jobfair bench`: the repository's benchmarks, run from a clone, with progress; and a
clear refusal where there is no clone (an installed package)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import app

APP = Path(app.__file__).parent


def jobfair_in(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The command as installed in ``root`` (its own copy of the app package)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        cwd=root, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def installed(root: Path) -> Path:
    shutil.copytree(APP, root / "app", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def test_bench_without_a_clone_says_so_and_exits_2(tmp_path: Path):
    ran = jobfair_in(installed(tmp_path), "bench")
    assert ran.returncode == 2
    [line] = ran.stderr.strip().splitlines()
    assert "bench/run.py" in line and "clone" in line and str(tmp_path) in line


def test_bench_passes_what_follows_the_names_to_bench_run():
    ran = subprocess.run(
        [sys.executable, "-m", "app.cli", "bench", "--", "--help"],
        cwd=APP.parent, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("usage: run.py")
    assert "--fairness-activations" in ran.stdout


def test_bench_shows_the_benchmarks_done_and_prints_their_output(tmp_path: Path):
    """Against a bench/run.py that prints as the real one does ("## name (N s)" once a
    benchmark is done, then its table), without the minutes."""
    root = installed(tmp_path)
    (root / "bench").mkdir()
    (root / "bench" / "__init__.py").write_text("")
    (root / "bench" / "run.py").write_text(
        "import sys\n"
        "BENCHES = {'one': None, 'two': None}\n"
        "if __name__ == '__main__':\n"
        "    print('args', sys.argv[1:])\n"
        "    for name in sys.argv[1:2] or BENCHES:\n"
        "        print(f'\\n## {name} (0 s)\\n')\n"
        "        print('| row |')\n"
    )
    ran = jobfair_in(root, "bench")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == [
        "args []", "", "## one (0 s)", "", "| row |", "", "## two (0 s)", "", "| row |",
    ]  # fmt: skip
    assert "2/2" in ran.stderr and "done: two" in ran.stderr
    ran = jobfair_in(root, "bench", "two", "--repeat", "1")
    assert ran.stdout.splitlines()[0] == "args ['two', '--repeat', '1']"
    assert "1/1" in ran.stderr
