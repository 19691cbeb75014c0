"""Schemathesis against the app's own OpenAPI document, every operation, all its phases
(examples, coverage, fuzzing, and stateful sequences along the document's links): no
server error, and no answer the document does not allow (status, media type, headers,
body schema, 405s with Allow, schema-valid input accepted and invalid input refused).

``make test`` runs a bounded pass with a fixed seed (under two minutes); ``make fuzz``
a long one with a fresh seed: JOBFAIR_FUZZ_EXAMPLES examples per operation and
JOBFAIR_FUZZ_SEED (unset: random).  The full report is in the assertion message, and
the figures are printed (pytest -s shows them)."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

import pytest

from app.config import Settings
from app.keys import Role
from tests.fixtures import quiet_settings

ST = Path(sys.executable).with_name("st")
CONFIG = Path(__file__).parents[1] / "schemathesis.toml"
# 2 in `make test`: with auth on, schemathesis also sends each case without a key and
# with a bad one, and 5 took 53 s (`make fuzz` runs many more).
EXAMPLES = int(os.environ.get("JOBFAIR_FUZZ_EXAMPLES", "2"))
SEED = os.environ.get("JOBFAIR_FUZZ_SEED", "" if "JOBFAIR_FUZZ_EXAMPLES" in os.environ else "19")


@pytest.fixture
def settings() -> Settings:
    # Long polls answer within the fuzzer's request timeout, whatever requestTimeout it
    # draws (up to an hour): the cap is a setting for this.
    # Auth required: the fuzzer sends an admin key, and its own checks try every
    # operation without one and with a bad one (401 expected).
    return quiet_settings(long_poll_cap_ms=100, default_request_timeout_ms=100, auth="required")


async def test_the_fuzzer_finds_no_server_error_and_nothing_the_document_denies(live, tmp_path):
    row, admin = await live.services.keys.create(Role.ADMIN, None, None, "fuzz", None, "test")
    command = [
        str(ST),
        f"--config-file={CONFIG}",
        "run",
        f"{live.url}/openapi.json",
        f"--max-examples={EXAMPLES}",
        # One worker: CPython 3.11's ast.parse, which hypothesis calls to describe a
        # strategy, is not safe in threads ("AST constructor recursion depth mismatch").
        "--workers=1",
        # A stream with no job to send never ends; schemathesis reads it this long.
        "--request-timeout=1",
        "--no-color",
        *([f"--seed={SEED}"] if SEED else []),
    ]
    proc = await asyncio.create_subprocess_exec(
        *command,
        env={**os.environ, "JOBFAIR_FUZZ_KEY": admin, "JOBFAIR_FUZZ_KEY_ID": row.key_id},
        cwd=tmp_path,  # its .hypothesis folder and reports stay out of the work tree
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    report = out.decode(errors="replace")
    saved = Path(os.environ.get("JOBFAIR_FUZZ_REPORT") or tmp_path / "schemathesis.txt")
    await asyncio.to_thread(saved.write_text, report)
    summary = report[report.rfind("=== SUMMARY ===") :]
    print(summary)
    generated = re.search(r"(\d+) generated", summary)
    assert generated is not None and int(generated.group(1)) > 0, report[-3000:]
    # The failures, each line cut short: a generated body can be a line of megabytes.
    failures = report[report.find("=== FAILURES ===") : report.rfind("=== SUMMARY ===")]
    assert proc.returncode == 0, "\n".join(line[:300] for line in failures.splitlines()) + summary
