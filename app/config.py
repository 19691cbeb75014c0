"""Settings: one object, every field also a ``JOBFAIR_*`` environment variable."""

from __future__ import annotations

import ipaddress
from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.logs import LogFormat, LogLevel

# Out of range is refused at start, naming the setting, rather than failing later.
Positive = Annotated[int, Field(ge=1)]
NonNegative = Annotated[int, Field(ge=0)]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="JOBFAIR_", extra="ignore")

    database_url: str | None = None
    # The LISTEN connection and the leader lock need a session of their own for as long
    # as they live; the pool needs one only per transaction.  Behind PgBouncer in
    # transaction mode, the pool's URL names PgBouncer and this one PostgreSQL itself (or
    # a session-mode pool); None: the database URL (docs/scaling.md).
    database_session_url: str | None = None
    data_dir: Path = Path(".jobfair")
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8080
    workers: Positive = 1
    # HTTPS when both are given (PEM: the certificate chain and its private key).
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    # `jobfair serve` migrates the database first; false leaves that to `jobfair migrate`
    # (a job of its own: the container image's default) and waits for the schema it needs.
    migrate_on_start: bool = True

    default_request_timeout_ms: Positive = 10_000
    # A long poll is held at most this long, whatever its requestTimeout (at most 1 h):
    # below a proxy's idle timeout, say.  It then answers {"jobs": []}, as at its end.
    long_poll_cap_ms: Positive = 3_600_000
    lease_sweep_interval_ms: Positive = 1_000
    promote_interval_ms: Positive = 200
    retention_sweep_interval_ms: Positive = 60_000
    aging_interval_ms: Positive = 60_000
    aging_step: Annotated[int, Field(ge=0, le=100)] = 10
    retention_s: NonNegative = 604_800
    # Every transition of a job written to its attempt history (GET /v2/jobs/{key}/history)
    # in the statement that makes it; off saves the database those writes (ADR 023).
    job_history: bool = True
    # API keys (app.keys, app.api.security).  None: off on loopback, required elsewhere.
    auth: Literal["off", "required"] | None = None
    # A server re-reads a key it has verified at most this long after (revocation and
    # expiry take effect within it on every process).
    key_refresh_ms: Annotated[int, Field(ge=1, le=1000)] = 500
    # Lifetime of the OAuth access tokens of POST /oauth/token.
    access_token_ttl_s: Annotated[int, Field(ge=10, le=86_400)] = 600
    # /metrics labels this many tenants by name, the most active, and folds the others
    # into tenant="<other>"; the leader re-ranks them this often (docs/metrics.md).
    metrics_top_tenants: NonNegative = 50
    metrics_top_tenants_interval_ms: Positive = 30_000
    # /metrics and /v2/stats show this many fairness keys per lane by name, the most
    # active in the share window, and fold the others into "<other>" (docs/metrics.md).
    metrics_top_keys: NonNegative = 10
    # A job created without a fairnessKey takes the value its customHeaders give under
    # this name (a Camunda producer sets task headers, not new fields); "": never.
    fairness_key_header: Annotated[str, Field(max_length=1000)] = "fairnessKey"
    # /metrics without a key; /docs and /openapi.json without one.
    metrics_open: bool = False
    docs_open: bool = True
    # Per key and server process: requests per second (0: no limit) with this burst, and
    # long polls plus streams held at once (else 429 with Retry-After).
    key_rate_limit: Annotated[float, Field(ge=0)] = 0
    key_rate_burst: Positive = 100
    max_waiters_per_key: Positive = 1000
    db_pool_size: Positive = 20
    # On a Citus coordinator, the Citus shards `jobfair migrate` distributes the job
    # tables into (None: 2 per worker node; app.db.citus.SHARDS_PER_WORKER, ADR 035).
    citus_shard_count: Annotated[int, Field(ge=1, le=2048)] | None = None
    # Connections opened at start and kept open (None: all of db_pool_size).
    db_pool_min_size: NonNegative | None = None
    # Waiting longer than this for a pooled connection answers 503 RESOURCE_EXHAUSTED.
    db_acquire_timeout_ms: Positive = 5_000
    # A pooled statement unanswered this long fails (503) and its connection is closed:
    # the bound on how long a primary lost without a word (a machine gone, a network
    # cut: its connections stay open, nothing answers) holds a call up (docs/scaling.md).
    db_statement_timeout_ms: Positive = 60_000
    # At start (migration, a server process's pool) an unreachable database is waited
    # for, up to this long, then the start fails (0: fail at once).  A replacement process
    # of --workers N waits the same way.  Too many connections is not waited for: it is
    # a pool larger than the server allows, and would fail the same way in a minute.
    db_startup_wait_s: NonNegative = 60
    max_waiters: NonNegative = 10_000
    # Requests worked on at once per process (long polls and streams waiting for jobs,
    # the probes and /metrics not counted); the next is 503 with Retry-After (0: no
    # bound; app.admission).
    max_in_flight: NonNegative = 64
    # Waiters and streams re-check on this jittered period even without a NOTIFY.
    backup_poll_ms: Positive = 1_000
    # SSE comment lines (": keep-alive") at least this often.
    keep_alive_s: Annotated[float, Field(gt=0)] = 15.0

    # A request's line and headers must arrive within this of its first byte, and its
    # body within request_body_timeout_ms of the headers' end (else 408; app.infra.http).
    request_header_timeout_ms: Positive = 10_000
    request_body_timeout_ms: Positive = 60_000
    # Request line plus header names and values (else 431).
    max_header_bytes: Positive = 32 * 1024
    max_headers: Positive = 100

    # Logs (app.logs, docs/logging.md): text for people or one JSON object per line; the
    # level of every logger; an access-log line per request (jobfair.access, at INFO).
    # Traces (app.telemetry, docs/tracing.md): on with this, or with an
    # OTEL_EXPORTER_OTLP_*ENDPOINT set; the standard OTEL_* variables configure the rest.
    otel_enabled: bool = False
    otel_service_name: str = "jobfair"
    # Metrics over OTLP too (app.metrics.otlp): on with this, or with
    # OTEL_EXPORTER_OTLP_METRICS_ENDPOINT set; GET /metrics is there either way.
    otel_metrics_enabled: bool = False
    log_format: LogFormat = "text"
    log_level: LogLevel = "info"
    access_log: bool = False

    max_batch_jobs: Positive = 10_000
    max_payload_bytes: Positive = 1024 * 1024
    max_body_bytes: Positive = 16 * 1024 * 1024

    @field_validator("log_level", "log_format", mode="before")
    @classmethod
    def _lower_case(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

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
