"""The clients as their users install them (issue 45 §3): the TypeScript client packed by
``npm pack`` and installed by its package name in an empty project, offline; the Java
client built by Maven, offline, where the machine's local Maven repository holds the
plugins clients/java/pom.xml names (else skipped, saying so: Maven Central is not
reachable here, and ``make test`` builds it with javac, clients/java/build.sh)."""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

CLIENTS = Path(__file__).resolve().parents[2] / "clients"


def run(*command: str, cwd: Path, timeout: float = 300) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_the_typescript_client_packs_and_installs_by_its_name(tmp_path):
    client = CLIENTS / "typescript"
    assert (client / "dist" / "index.js").exists(), "run `make test`, which builds the client"
    package = json.loads((client / "package.json").read_text())
    assert package["name"] == "jobfair-client"
    assert f"npm install {package['name']}" in (client / "README.md").read_text()
    out = run("npm", "pack", "--json", "--pack-destination", str(tmp_path), cwd=client)
    [packed] = json.loads(out)
    tarball = tmp_path / packed["filename"]
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
    # What a user needs, and nothing of the tests or the build's tools.
    assert {"package/dist/index.js", "package/dist/index.d.ts", "package/README.md"} <= names
    assert not any(n.startswith(("package/test/", "package/node_modules/")) for n in names)
    project = tmp_path / "app"
    project.mkdir()
    (project / "package.json").write_text('{"name": "app", "private": true, "type": "module"}')
    run("npm", "install", "--offline", "--no-audit", "--no-fund", str(tarball), cwd=project)
    script = (
        "import { Jobfair, Worker, InvalidArgument } from 'jobfair-client';"
        "const jf = new Jobfair('http://127.0.0.1:1');"
        "console.log(typeof Worker, typeof InvalidArgument, jf.idempotentCreates)"
    )
    assert run("node", "--input-type=module", "-e", script, cwd=project).split() == [
        "function",
        "function",
        "true",
    ]


def test_the_java_client_builds_with_maven_offline(tmp_path):
    if shutil.which("mvn") is None:
        pytest.skip("Maven is not installed")
    work = tmp_path / "java"
    shutil.copytree(CLIENTS / "java", work, ignore=shutil.ignore_patterns("build", "target"))
    done = subprocess.run(
        ["mvn", "-o", "-q", "package", "-DskipTests"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0 and "offline mode" in done.stdout:
        pytest.skip("the local Maven repository lacks a plugin pom.xml names (offline here)")
    assert done.returncode == 0, done.stdout[-3000:]
    with zipfile.ZipFile(work / "target" / "jobfair-client-0.1.0.jar") as jar:
        names = set(jar.namelist())
    assert "dev/jobfair/client/Jobfair.class" in names
    assert "dev/jobfair/client/Config$Tenant.class" in names
    # The unit tests that need no server run under Maven's surefire too.
    run("mvn", "-o", "-q", "test", "-Dtest=JsonTest", cwd=work)
