"""deploy/systemd: the units pass ``systemd-analyze verify`` and its offline security
review, and run what the app has: its commands, its JOBFAIR_* settings, a stop timeout
above the graceful shutdown and the longest long poll, and a start timeout above the wait
for the database."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from app.cli.main import GRACEFUL_SHUTDOWN_S, cli
from app.config import Settings
from app.domain import MAX_REQUEST_TIMEOUT_MS
from app.infra.supervisor import STOP_GRACE_S

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"
INSTALLED = "/opt/jobfair/bin/jobfair"


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys keep their case
    parser.read_string((UNITS / name).read_text())
    return parser


def seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+)s", value)
    assert match, value
    return float(match.group(1))


def settings_variables() -> set[str]:
    return {f"JOBFAIR_{name.upper()}" for name in Settings.model_fields}


@pytest.fixture
def installed_like(tmp_path: Path) -> Path:
    """The units with the install's jobfair replaced by this environment's, which exists
    (verify checks that every command is an executable)."""
    jobfair = Path(sys.executable).parent / "jobfair"
    assert jobfair.exists()
    for path in UNITS.glob("*.service"):
        (tmp_path / path.name).write_text(path.read_text().replace(INSTALLED, str(jobfair)))
    return tmp_path


@pytest.fixture
def analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        pytest.skip("systemd-analyze is not installed (Debian's systemd package)")
    return found


def test_the_units_verify_without_a_warning(analyze: str, installed_like: Path):
    units = sorted(str(p) for p in installed_like.glob("*.service"))
    ran = subprocess.run(
        [analyze, "verify", "--man=no", *units], capture_output=True, text=True, timeout=60
    )
    assert (ran.returncode, ran.stdout + ran.stderr) == (0, "")


def test_the_server_unit_is_rated_ok_by_the_offline_security_review(
    analyze: str, installed_like: Path
):
    ran = subprocess.run(
        [analyze, "security", "--offline=yes", "--threshold=20",
         str(installed_like / "jobfair.service")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-3000:]  # exposure at most 2.0 of 10


def test_the_units_run_the_cli_s_serve_and_migrate_as_an_unprivileged_user():
    commands = typer.main.get_command(cli).commands  # type: ignore[attr-defined]
    for name, command in (("jobfair.service", "serve"), ("jobfair-migrate.service", "migrate")):
        service = unit(name)["Service"]
        assert service["ExecStart"] == f"{INSTALLED} {command}" and command in commands
        assert service["User"] == "jobfair" and service["NoNewPrivileges"] == "yes"
        assert service["EnvironmentFile"] == "/etc/jobfair/jobfair.env"
    assert unit("jobfair.service")["Unit"]["Requires"] == "jobfair-migrate.service"


def test_the_stop_timeout_exceeds_the_graceful_shutdown_and_start_the_database_wait():
    service = unit("jobfair.service")["Service"]
    assert service["KillSignal"] == "SIGTERM" and service["Restart"] == "on-failure"
    assert seconds(service["TimeoutStopSec"]) > GRACEFUL_SHUTDOWN_S + STOP_GRACE_S
    # and above the longest long poll the example's settings allow, as in compose and k8s
    example = dict(
        re.findall(r"^(JOBFAIR_\w+)=(.*)$", (UNITS / "jobfair.env.example").read_text(), re.M)
    )
    cap_ms = int(example.get("JOBFAIR_LONG_POLL_CAP_MS", Settings().long_poll_cap_ms))
    longest_s = min(cap_ms, MAX_REQUEST_TIMEOUT_MS) / 1000
    assert seconds(service["TimeoutStopSec"]) >= longest_s + 30
    wait_s = Settings().db_startup_wait_s
    assert seconds(service["TimeoutStartSec"]) > wait_s
    assert seconds(unit("jobfair-migrate.service")["Service"]["TimeoutStartSec"]) > wait_s


def test_every_variable_the_units_and_the_example_set_is_a_setting():
    example = (UNITS / "jobfair.env.example").read_text()
    named = set(re.findall(r"^#?(JOBFAIR_\w+)=", example, re.MULTILINE))
    named |= {
        line.split("=", 1)[0] for line in unit("jobfair.service")["Service"]["Environment"].split()
    }
    assert "JOBFAIR_DATABASE_URL" in named
    assert named <= settings_variables(), named - settings_variables()
