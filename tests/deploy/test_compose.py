"""deploy/compose.yaml: a valid Compose file (the compose_spec parser refuses unknown keys,
conditions and durations) whose services run real `jobfair` commands with real JOBFAIR_*
settings, in the order that keeps replicas from racing on the schema, behind the
haproxy.cfg that tests/deploy/test_topology.py runs."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from compose_spec import PyCompose

from app.cli.main import cli
from app.config import Settings
from app.domain import MAX_REQUEST_TIMEOUT_MS

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
COMPOSE = DEPLOY / "compose.yaml"
HAPROXY = DEPLOY / "haproxy" / "haproxy.cfg"
REPLICAS = ("jobfair-1", "jobfair-2")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    raw = yaml.safe_load(COMPOSE.read_text())  # YAML merge keys resolved here
    parsed = PyCompose.from_json(json.dumps(raw))  # ValueError on anything off-spec
    parsed.validate()
    return parsed.to_dict()


def settings_of(service: dict[str, Any]) -> Settings:
    env = service.get("environment", {})
    unknown = {k for k in env if k.startswith("JOBFAIR_")} - {
        f"JOBFAIR_{name.upper()}" for name in Settings.model_fields
    }
    assert not unknown, unknown
    return Settings(**{k.removeprefix("JOBFAIR_").lower(): v for k, v in env.items()})


def duration_s(value: str) -> float:
    parts = re.findall(r"(\d+)(h|m|s|ms|us)", value)
    assert "".join(n + u for n, u in parts) == value, value
    return sum(int(n) * {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6}[u] for n, u in parts)


def haproxy_default(variable: str) -> str:
    """The default haproxy.cfg gives ``variable`` (compose passes it none)."""
    [value] = re.findall(r'"\$\{' + variable + r"-([^}]*)\}\"", HAPROXY.read_text())
    return value


def test_every_jobfair_service_runs_a_real_command_with_real_settings(compose):
    commands = typer.main.get_command(cli).commands  # type: ignore[attr-defined]
    for name in ("migrate", "cli", *REPLICAS):
        service = compose["services"][name]
        assert service["entrypoint"] == ["jobfair"], name
        assert service["command"][0] in commands, (name, service["command"])
        settings_of(service)
        assert service["environment"]["JOBFAIR_DATABASE_URL"].endswith("@postgres:5432/jobfair")
        assert service["read_only"] and "/tmp" in service["tmpfs"]
    assert compose["services"]["cli"]["profiles"] == ["tools"]  # not started by `up`


def test_migration_runs_once_after_postgres_is_healthy_and_before_any_replica(compose):
    services = compose["services"]
    assert services["migrate"]["command"] == ["migrate"]
    assert services["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert services["migrate"]["restart"] == "no"
    assert "pg_isready" in str(services["postgres"]["healthcheck"]["test"])
    for name in (*REPLICAS, "cli"):
        needs = services[name]["depends_on"]
        assert needs == {"migrate": {"condition": "service_completed_successfully"}}, name


def test_the_replicas_are_what_haproxy_balances_on_the_port_they_serve(compose):
    services = compose["services"]
    for i, name in enumerate(REPLICAS, 1):
        replica = services[name]
        settings = settings_of(replica)
        assert replica["command"] == ["serve"]
        assert settings.auth_mode == "required"  # JOBFAIR_HOST is off loopback
        assert haproxy_default(f"LB_SERVER_{i}") == f"{name}:{settings.port}"
        assert replica["expose"] == [settings.port] and "ports" not in replica
        assert re.search(rf"^\s*server {name} ", HAPROXY.read_text(), re.M)
    lb = services["haproxy"]
    assert f"./{HAPROXY.relative_to(DEPLOY)}:/usr/local/etc/haproxy/haproxy.cfg:ro" in [
        v if isinstance(v, str) else f"{v['source']}:{v['target']}:ro" for v in lb["volumes"]
    ]
    bind_port = haproxy_default("LB_BIND").rsplit(":", 1)[1]
    stats_port = haproxy_default("LB_STATS_BIND").rsplit(":", 1)[1]
    published = {str(p) for p in lb["ports"]}
    assert f"{bind_port}:{bind_port}" in published
    assert f"127.0.0.1:{stats_port}:{stats_port}" in published


def test_a_replica_is_given_longer_to_stop_than_its_longest_long_poll(compose):
    for name in REPLICAS:
        replica = compose["services"][name]
        longest_s = min(settings_of(replica).long_poll_cap_ms, MAX_REQUEST_TIMEOUT_MS) / 1000
        assert duration_s(replica["stop_grace_period"]) > longest_s


def test_postgres_keeps_its_data_and_has_connections_for_every_pool(compose):
    services = compose["services"]
    pg = services["postgres"]
    assert "pgdata" in compose["volumes"]
    mounts = [v if isinstance(v, str) else f"{v['source']}:{v['target']}" for v in pg["volumes"]]
    assert "pgdata:/var/lib/postgresql/data" in mounts
    [max_connections] = re.findall(r"max_connections=(\d+)", " ".join(pg["command"]))
    # Per server process: its pool, a LISTEN connection and a leader's; migrate and cli.
    wanted = sum(
        settings_of(services[n]).workers * (settings_of(services[n]).db_pool_size + 2)
        for n in REPLICAS
    )
    assert wanted + 2 <= int(max_connections), (wanted, max_connections)
    assert pg["environment"]["POSTGRES_DB"] == "jobfair"
    assert "${POSTGRES_PASSWORD:?" in pg["environment"]["POSTGRES_PASSWORD"]  # no default
