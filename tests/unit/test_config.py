"""Settings out of range are refused at start, naming the setting."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from pydantic import ValidationError

from app.config import Settings


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("port", 70_000),
        ("workers", 0),
        ("default_request_timeout_ms", 0),
        ("lease_sweep_interval_ms", 0),
        ("promote_interval_ms", -5),
        ("aging_interval_ms", 0),
        ("aging_step", 101),
        ("retention_s", -1),
        ("db_pool_size", 0),
        ("db_pool_min_size", -1),
        ("db_acquire_timeout_ms", 0),
        ("db_statement_timeout_ms", 0),
        ("max_waiters", -1),
        ("backup_poll_ms", 0),
        ("keep_alive_s", 0),
        ("max_batch_jobs", 0),
        ("max_payload_bytes", 0),
        ("max_body_bytes", 0),
    ],
)
def test_an_out_of_range_setting_is_refused(name: str, value: object) -> None:
    with pytest.raises(ValidationError, match=name):
        Settings(**{name: value})  # type: ignore[arg-type]


def test_the_defaults_and_the_bounds_themselves_are_accepted() -> None:
    Settings()
    Settings(port=0, aging_step=0, retention_s=0, db_pool_min_size=0, max_waiters=0)


def test_serve_with_a_bad_setting_says_which_and_exits_2() -> None:
    env = {**os.environ, "JOBFAIR_DB_POOL_SIZE": "0"}
    r = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    assert "invalid configuration" in r.stderr and "JOBFAIR_DB_POOL_SIZE" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_bad_setting_is_named_by_its_variable_or_option_and_its_value_only():
    env = {**os.environ, "JOBFAIR_DB_POOL_SIZE": "many", "JOBFAIR_LOG_FORMAT": "xml"}
    r = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--port", "70000"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0] == "invalid configuration:"
    assert any(line.startswith("  JOBFAIR_DB_POOL_SIZE: ") and "'many'" in line for line in lines)
    assert any(line.startswith("  JOBFAIR_LOG_FORMAT: ") for line in lines), r.stderr
    assert any(line.startswith("  --port (JOBFAIR_PORT): ") for line in lines), r.stderr
    assert "db_pool_size" not in r.stderr  # pydantic's field names are not the operator's
