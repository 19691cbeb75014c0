"""The image's grace period follows the rule the other forms follow (compose, k8s and
systemd are checked beside their files): the stop timeout deploy/README.md gives is above
the longest long poll the image's settings allow, with 30 s for the graceful stop."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from app.config import Settings
from app.domain import MAX_REQUEST_TIMEOUT_MS

ROOT = Path(__file__).resolve().parents[2]


def image_environment() -> dict[str, str]:
    """The variables the Containerfile's final stage sets with ENV."""
    text = (ROOT / "deploy" / "Containerfile").read_text().replace("\\\n", " ")
    final = text.rsplit("\nFROM ", 1)[1]
    env: dict[str, str] = {}
    for line in re.findall(r"^ENV (.*)$", final, re.MULTILINE):
        env.update(word.split("=", 1) for word in shlex.split(line))
    return env


def test_the_documented_stop_timeout_outlasts_the_image_s_longest_long_poll():
    env = image_environment()
    assert env["JOBFAIR_HOST"] == "0.0.0.0"  # the parse found the final stage's ENV
    cap_ms = int(env.get("JOBFAIR_LONG_POLL_CAP_MS", Settings().long_poll_cap_ms))
    longest_s = min(cap_ms, MAX_REQUEST_TIMEOUT_MS) / 1000
    readme = (ROOT / "deploy" / "README.md").read_text()
    timeouts = {int(s) for s in re.findall(r"--stop-timeout (\d+)", readme)}
    assert timeouts, "deploy/README.md names no --stop-timeout"
    assert min(timeouts) >= longest_s + 30, (timeouts, longest_s)
