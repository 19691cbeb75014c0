"""Settings: one object, every field also a ``JOBFAIR_*`` environment variable."""

from __future__ import annotations

import ipaddress
from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="JOBFAIR_", extra="ignore")

    database_url: str | None = None
    data_dir: Path = Path(".jobfair")
    host: str = "127.0.0.1"
    port: int = 8080
    workers: int = 1

    default_request_timeout_ms: int = 10_000
    lease_sweep_interval_ms: int = 1_000
    promote_interval_ms: int = 200
    retention_sweep_interval_ms: int = 60_000
    aging_interval_ms: int = 60_000
    aging_step: int = 10
    retention_s: int = 604_800
    auth: Literal["off", "required"] | None = None
    db_pool_size: int = 20
    # Connections opened at start and kept open (None: all of db_pool_size).
    db_pool_min_size: int | None = None
    # Waiting longer than this for a pooled connection answers 503 RESOURCE_EXHAUSTED.
    db_acquire_timeout_ms: int = 5_000
    max_waiters: int = 10_000
    # Waiters and streams re-check on this jittered period even without a NOTIFY.
    backup_poll_ms: int = 1_000
    # SSE comment lines (": keep-alive") at least this often.
    keep_alive_s: float = 15.0

    max_batch_jobs: int = 10_000
    max_payload_bytes: int = 1024 * 1024
    max_body_bytes: int = 16 * 1024 * 1024

    @cached_property
    def auth_mode(self) -> str:
        """``off`` on loopback by default, ``required`` anywhere else."""
        if self.auth is not None:
            return self.auth
        return "off" if is_loopback(self.host) else "required"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
