"""The docs describe every route, and link only to files of this repository that exist."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OPENAPI = ROOT / "clients" / "openapi.json"
API_MD = ROOT / "docs" / "api.md"
METHODS = ("GET", "PUT", "POST", "PATCH", "DELETE")
# A route is described by a heading that names it in code: ### `POST /v2/jobs`
ROUTE_HEADING = re.compile(r"`(" + "|".join(METHODS) + r") (/[^`\s]*)`")
# Files linked before they land (a name here is only excused while the file is missing;
# drop it once it has landed).
PENDING: set[str] = set()

FENCED = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # https:, mailto:, ...


def _openapi_routes() -> set[tuple[str, str]]:
    paths = json.loads(OPENAPI.read_text())["paths"]
    return {(method.upper(), path) for path, ops in paths.items() for method in ops}


def _described_routes() -> set[tuple[str, str]]:
    headings = [line for line in API_MD.read_text().splitlines() if line.startswith("#")]
    return {(m, p) for line in headings for m, p in ROUTE_HEADING.findall(line)}


def test_every_route_of_the_openapi_document_has_a_section_in_api_md():
    missing = sorted(_openapi_routes() - _described_routes())
    assert not missing, "docs/api.md has no heading for: " + ", ".join(
        f"{m} {p}" for m, p in missing
    )


def test_api_md_describes_no_route_the_server_does_not_have():
    extra = sorted(_described_routes() - _openapi_routes())
    assert not extra, "docs/api.md describes routes absent from clients/openapi.json: " + (
        ", ".join(f"{m} {p}" for m, p in extra)
    )


def _documents() -> list[Path]:
    docs = [ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
    return [d for d in docs if d.exists()] + sorted((ROOT / "docs").rglob("*.md"))


def _links(text: str) -> list[str]:
    """Link targets of a markdown text, code blocks and code spans left out."""
    prose = INLINE_CODE.sub("", FENCED.sub("", text))
    return INLINE_LINK.findall(prose) + REFERENCE_LINK.findall(prose)


def _broken(doc: Path, target: str) -> str | None:
    """Why ``target``, linked from ``doc``, is not a file of this repository; else None."""
    if EXTERNAL.match(target) or target.startswith("#"):
        return None
    path = target.split("#", 1)[0].split("?", 1)[0]
    if path.startswith("/") or path.startswith("~"):
        return "an absolute path"
    resolved = (doc.parent / path).resolve()
    if not resolved.is_relative_to(ROOT):
        return "outside the repository"
    relative = resolved.relative_to(ROOT).as_posix()
    if not resolved.exists() and relative not in PENDING:
        return "no such file"
    return None


def test_the_docs_link_only_to_files_of_the_repository_that_exist():
    problems = []
    for doc in _documents():
        for target in _links(doc.read_text()):
            why = _broken(doc, target)
            if why is not None:
                problems.append(f"{doc.relative_to(ROOT)}: {target} ({why})")
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_the_link_check_catches_what_it_is_for():
    assert _broken(ROOT / "README.md", "../shared/API.md") == "outside the repository"
    doc = ROOT / "docs" / "example.md"  # never written: only its folder matters
    assert _broken(doc, "../../shared/DESIGN.md") == "outside the repository"
    assert _broken(doc, "/work/shared/DESIGN.md") == "an absolute path"
    assert _broken(doc, "adr/999-none.md") == "no such file"
    assert _broken(doc, "api.md#fencing-by-activationcount") is None
    assert _broken(doc, "https://example.com/x") is None
    text = "see [a](api.md), `[b](nowhere.md)`\n\n```\n[c](gone.md)\n```\n[d]: ../README.md\n"
    assert _links(text) == ["api.md", "../README.md"]
