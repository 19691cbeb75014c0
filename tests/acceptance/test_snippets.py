"""The docs' runnable snippets run as written, against a live Jobfair.

A fenced ``sh`` block right after a ``<!-- runnable -->`` line is runnable: the blocks of
one document run in one bash (``set -eu -o pipefail``), in order, from the top of the
repository, as a reader following it in one terminal would, with only the address
changed (``localhost:8080`` / ``127.0.0.1:8080``, what ``make serve`` listens on, become the
live server's).  Each document must exit 0 and print no problem+json.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import pytest

from tests.fixtures import Live

ROOT = Path(__file__).resolve().parents[2]
RUNNABLE = re.compile(r"^<!-- runnable -->\n```sh\n(.*?)^```", re.MULTILINE | re.DOTALL)
ADDRESS = re.compile(r"\b(?:localhost|127\.0\.0\.1):8080\b")
PROBLEM = re.compile(r'"type":\s*"urn:jobfair:')


def documents() -> list[Path]:
    found = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    found += [p for p in (ROOT / "clients").rglob("*.md") if "node_modules" not in p.parts]
    return sorted(p for p in found if RUNNABLE.search(p.read_text()))


def snippets(doc: Path) -> list[str]:
    return RUNNABLE.findall(doc.read_text())


def test_the_documents_a_newcomer_reads_first_have_runnable_snippets():
    names = {p.relative_to(ROOT).as_posix() for p in documents()}
    assert {"README.md", "clients/examples/README.md", "clients/curl.md"} <= names
    # The walk-through uses the job key it was answered, not one written in the README.
    [walk_through, *_] = snippets(ROOT / "README.md")
    assert "2251799813685249/" not in walk_through and "jq" in walk_through


async def run_document(doc: Path, url: str) -> str:
    script = "\n".join(ADDRESS.sub(url.removeprefix("http://"), s) for s in snippets(doc))
    # As from a fresh shell: the client is found through .venv, not the tests' PYTHONPATH.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        "set -eu -o pipefail\n" + script,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=180)
    text = out.decode()
    assert proc.returncode == 0, f"{doc.relative_to(ROOT)}:\n{script}\n---\n{text[-3000:]}"
    assert not PROBLEM.search(text), f"{doc.relative_to(ROOT)} got a problem:\n{text[-3000:]}"
    return text


@pytest.mark.parametrize("doc", documents(), ids=lambda p: p.relative_to(ROOT).as_posix())
async def test_the_runnable_snippets_of_a_document_run_as_written(live: Live, doc: Path):
    if "/.venv/bin/" in "".join(snippets(doc)) and not (ROOT / ".venv" / "bin").exists():
        pytest.skip(".venv is made by `make`, which the document says to run first")
    text = await run_document(doc, live.url)
    if doc.name == "README.md" and doc.parent == ROOT:
        assert '"COMPLETED"' in text  # the walk-through's job, completed
    if doc.parent.name == "examples":
        assert "TRICKLE_DONE_BY=" in text
