"""deploy/: the Prometheus alerts and the Grafana dashboard ask only for series a live
server exports, and the alerts pass promtool's checks and their own unit tests."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from app.domain import utcnow
from tests.fixtures import Live
from tests.helpers import activate, complete, enqueue

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
DASHBOARD = DEPLOY / "grafana" / "jobfair.json"
NAME = re.compile(r"\bjobfair_[a-z0-9_]+\b")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


async def exported(live: Live) -> set[str]:
    """The sample names /metrics exports, with a server that has seen every kind of event
    (a family without a sample yet counts by its declared type)."""
    c = live.client
    await enqueue(c, "d", "a", 6)
    [doomed] = await enqueue(c, "d", "b", 1)
    await c.post(f"/v2/jobs/{doomed}/cancel")
    jobs = await activate(c, "d", 5)
    await complete(c, jobs[0])
    for job, retries in ((jobs[1], 1), (jobs[2], 0)):
        fence = {"activationCount": job["activationCount"], "retries": retries}
        await c.post(f"/v2/jobs/{job['jobKey']}/fail", json=fence)
    fence = {"activationCount": jobs[3]["activationCount"], "errorCode": "E"}
    await c.post(f"/v2/jobs/{jobs[3]['jobKey']}/error", json=fence)
    await live.services.background.lease.run_once(utcnow() + timedelta(hours=1))
    await activate(c, "empty")
    text = (await c.get("/metrics")).text
    names = set()
    for family in text_string_to_metric_families(text):
        names |= {s.name for s in family.samples}
        names |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
    return names


def alert_expressions() -> dict[str, str]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return {rule["alert"]: rule["expr"] for group in groups for rule in group["rules"]}


def dashboard_expressions() -> dict[str, str]:
    dashboard = json.loads(DASHBOARD.read_text())
    out = {}
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out[f"{panel['title']} {target['refId']}"] = target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            out[f"${variable['name']}"] = variable["definition"]
    return out


async def test_every_series_the_alerts_ask_for_is_exported(live: Live):
    names = await exported(live)
    expressions = alert_expressions()
    assert {"JobfairStarvation", "JobfairShareDrift", "JobfairLeaseExpiries", "Jobfair503s"} <= set(
        expressions
    )
    for alert, expr in expressions.items():
        wanted = set(NAME.findall(expr))
        assert wanted, alert
        assert wanted <= names, (alert, wanted - names)


async def test_every_series_the_dashboard_asks_for_is_exported(live: Live):
    names = await exported(live)
    expressions = dashboard_expressions()
    assert len(expressions) >= 20
    for where, expr in expressions.items():
        wanted = set(NAME.findall(expr))
        assert wanted, where
        assert wanted <= names, (where, wanted - names)


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    return found


def test_promtool_finds_the_alert_rules_valid():
    r = subprocess.run([_promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_alerts_fire_where_their_unit_tests_say():
    r = subprocess.run(
        [_promtool(), "test", "rules", "alerts.test.yml"],
        capture_output=True,
        text=True,
        cwd=ALERTS.parent,
    )
    assert r.returncode == 0, r.stdout + r.stderr
