"""The `jobfair` commands that talk to a server over HTTP (stats, tenants, job types,
jobs, workers), run as a user runs them, against a live server: what they print is what
the API answers, and what goes wrong is one line."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys
from dataclasses import dataclass
from typing import Any

import pytest
import typer
from typer.core import TyperOption
from typer.testing import CliRunner

from app import migrations
from app.cli.main import cli
from app.config import Settings
from app.keys import Role
from app.main import create_app
from tests.fixtures import Live, free_port, quiet_settings, serving
from tests.helpers import activate, complete, enqueue


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def jobfair_sync(*args: str, env: dict[str, str] | None = None, input: str | None = None) -> Ran:
    # Wide, as a piped command's tables are: a row is one line.
    result = CliRunner().invoke(cli, list(args), env={"COLUMNS": "250", **(env or {})}, input=input)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Ran(result.exit_code, result.stdout, result.stderr)


async def jobfair(url: str, *args: str, input: str | None = None, **env: str) -> Ran:
    """The command in a thread (the server answers it from this test's event loop)."""
    return await asyncio.to_thread(
        jobfair_sync, *args, env={"JOBFAIR_URL": url, **env}, input=input
    )


def rows(text: str) -> dict[str, list[str]]:
    """A table's rows by their first cell (cells are single tokens)."""
    out = {}
    for line in text.splitlines():
        cells = line.split()
        if cells and not set(cells[0]) <= set("─"):
            out[cells[0]] = cells[1:]
    return out


def titled(text: str, titles: list[str]) -> dict[str, str]:
    """The tables of ``text`` by their titles."""
    found: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        # A title, maybe with its notes: "(paused)", "no activation of this type for ...".
        title = re.fullmatch(r"(\S+)(  \(paused\))?(  no activation .*)?", line.strip())
        if title and title[1] in titles:
            current = found[title[1]] = []
        else:
            current.append(line)
    return {title: "\n".join(lines) for title, lines in found.items()}


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


async def route_or_skip(live: Live, method: str, path: str, **kwargs: object) -> None:
    """Skip when the server has no such route (404 with Starlette's own "Not Found", or
    405): issue 24's job-browser routes are built on another branch."""
    r = await live.client.request(method, path, **kwargs)  # type: ignore[arg-type]
    missing = r.status_code == 405 or (
        r.status_code == 404 and r.json().get("detail") == "Not Found"
    )
    if missing:
        pytest.skip(f"this server has no {method} {path} yet (issue 24, section 3)")


# -- stats ------------------------------------------------------------------------------


async def test_the_stats_table_shows_the_numbers_of_v2_stats(live: Live):
    c = live.client
    await c.put("/v2/tenants/big", json={"weight": 3, "maxActiveJobs": 5})
    await enqueue(c, "s", "big", 30)
    await enqueue(c, "s", "small", 12)
    await c.post("/v2/jobs", json={"type": "s", "tenantId": "small", "delay": 60_000})
    await enqueue(c, "other", "small", 2)
    await live.services.stats.sample()
    await activate(c, "s", 9)  # big reaches its cap of 5
    ran = await jobfair(live.url, "stats")
    assert ran.returncode == 0, ran.stderr
    expected = (await c.get("/v2/stats")).json()
    assert [t["type"] for t in expected["jobTypes"]] == ["other", "s"]
    tables = titled(ran.stdout, ["other", "s"])
    for t in expected["jobTypes"]:
        shown = rows(tables[t["type"]])
        for x in t["tenants"]:
            weight, ready, delayed, active, oldest, minute, realised, entitled, now, *notes = shown[
                x["tenantId"]
            ]
            assert (int(weight), int(ready), int(delayed), int(active), int(minute)) == (
                x["weight"],
                x["ready"],
                x["delayed"],
                x["active"],
                x["activatedLastMinute"],
            )
            assert realised == f"{x['realizedShare'] * 100:.1f}%"
            assert entitled == f"{x['entitledShare'] * 100:.1f}%"
            assert now == f"{x['configuredShare'] * 100:.1f}%"
            assert re.fullmatch(r"-|\d+ms|\d+\.\ds", oldest), oldest
            capped = " ".join(notes).startswith("held now: tenant's cap")
            assert capped == (x["cappedBy"] == "tenant")
        total = shown["(all)"]
        assert [int(v) for v in total[:3]] == [t["ready"], t["delayed"], t["active"]]
    big = rows(tables["s"])["big"]
    assert big[0] == "3" and big[3] == "5"
    assert " ".join(big[9:]).startswith("held now: tenant's cap (5/5 active)")


async def test_the_stats_table_names_a_fairness_key_at_its_cap(live: Live):
    """Issue 44: a key held at its cap is named on its tenant's row, with its running
    jobs against its cap (the least of its own and its type's per-key cap)."""
    c = live.client
    await c.put("/v2/job-types/s", json={"maxActivePerKey": 2})
    await enqueue(c, "s", "acme", 10, fairnessKey="cust-7")
    await live.services.stats.sample()
    assert len(await activate(c, "s", 10)) == 2
    await live.services.stats.sample()
    ran = await jobfair(live.url, "stats")
    assert ran.returncode == 0, ran.stderr
    acme = rows(titled(ran.stdout, ["s"])["s"])["acme"]
    assert "key cust-7 at its cap (2/2 active)" in " ".join(acme[9:])


async def test_the_stats_table_names_a_fifo_keys_failed_head(live: Live):
    """Issue 44 §2: a FIFO key whose head FAILED is named on its tenant's row with it."""
    c = live.client
    await c.put("/v2/job-types/s", json={"keyOrdering": "fifo"})
    await enqueue(c, "s", "acme", 3, fairnessKey="cust-7")
    await live.services.stats.sample()
    [head] = await activate(c, "s", 10)
    r = await c.post(
        f"/v2/jobs/{head['jobKey']}/fail",
        json={"retries": 0, "activationCount": head["activationCount"]},
    )
    assert r.status_code == 204
    await live.services.stats.sample()
    ran = await jobfair(live.url, "stats")
    assert ran.returncode == 0, ran.stderr
    acme = rows(titled(ran.stdout, ["s"])["s"])["acme"]
    notes = " ".join(acme[9:])
    assert f"key cust-7 waits for its head, job {head['jobKey']} (FAILED)" in notes, notes


async def test_tenants_set_keeps_a_minimum_and_the_stats_name_it(live: Live):
    """Issue 44 §3: a minimum set, kept by a later set of something else, shown with the
    tenant's active jobs on its rows; refused above the cap."""
    ran = await jobfair(live.url, "tenants", "set", "acme", "--min-active-jobs", "2")
    assert ran.returncode == 0, ran.stderr
    assert rows(ran.stdout)["acme"][-1] == "2"
    await jobfair(live.url, "tenants", "set", "acme", "--weight", "3")
    got = (await live.client.get("/v2/tenants/acme")).json()
    assert (got["minActiveJobs"], got["weight"]) == (2, 3)
    ran = await jobfair(live.url, "tenants", "set", "acme", "--max-active-jobs", "1")
    assert ran.returncode != 0 and "minActiveJobs" in ran.stderr, ran.stderr
    await enqueue(live.client, "s", "acme", 5)
    await live.services.stats.sample()
    await activate(live.client, "s", 1)
    await live.services.stats.sample()
    ran = await jobfair(live.url, "stats")
    acme = rows(titled(ran.stdout, ["s"])["s"])["acme"]
    assert "minimum 1/2 active: served first" in " ".join(acme[9:])
    ran = await jobfair(live.url, "tenants", "set", "acme", "--no-minimum")
    assert rows(ran.stdout)["acme"][-1] == "-"


async def test_the_names_dot_and_dot_dot_are_names_not_dot_segments(live: Live):
    """'.' and '..' are valid tenant ids, and a job type may have them between its '/'s:
    sent as they are, httpx would resolve them (PUT /v2/tenants/.. went to /v2, a 405)."""
    for tenant in (".", ".."):
        ran = await jobfair(live.url, "tenants", "set", tenant, "--weight", "7")
        assert ran.returncode == 0, ran.stderr
        # A second set reads the first back (it keeps what it is not told to change).
        ran = await jobfair(live.url, "tenants", "set", tenant, "--max-active-jobs", "4")
        assert ran.returncode == 0, ran.stderr
    got = {
        t["tenantId"]: t["weight"] for t in (await live.client.get("/v2/tenants")).json()["tenants"]
    }
    assert got == {".": 7, "..": 7}
    caps = {
        t["tenantId"]: t["maxActiveJobs"]
        for t in (await live.client.get("/v2/tenants")).json()["tenants"]
    }
    assert caps == {".": 4, "..": 4}
    ran = await jobfair(live.url, "job-types", "set", "a/../b", "--max-active-jobs", "3")
    assert ran.returncode == 0, ran.stderr
    types = (await live.client.get("/v2/job-types")).json()["jobTypes"]
    assert [(t["type"], t["maxActiveJobs"]) for t in types] == [("a/../b", 3)]


async def test_stats_json_is_the_servers_and_type_narrows_it(live: Live):
    await enqueue(live.client, "a", "t1", 3)
    await enqueue(live.client, "b", "t1", 1)
    ran = await jobfair(live.url, "stats", "--json")
    assert ran.returncode == 0, ran.stderr
    got = json.loads(ran.stdout)
    expected = (await live.client.get("/v2/stats")).json()
    for t in (got, expected):  # ages and times move on between the two calls
        t.pop("windowMs")
        for jt in t["jobTypes"]:
            jt.pop("noActivationForMs")
            for x in [jt, *jt["tenants"]]:
                x.pop("oldestPendingAgeMs")
                x.pop("heldInWindow", None)
    assert got == expected
    ran = await jobfair(live.url, "stats", "--type", "b", "--json")
    assert [t["type"] for t in json.loads(ran.stdout)["jobTypes"]] == ["b"]
    ran = await jobfair(live.url, "stats", "--type", "b")
    assert list(titled(ran.stdout, ["a", "b"])) == ["b"]


async def test_stats_watch_as_json_prints_a_document_a_line_until_ctrl_c(live: Live):
    await enqueue(live.client, "w", "t1", 2)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app.cli",
        "stats",
        "--watch",
        "--json",
        "--interval",
        "0.2",
        "--url",
        live.url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    docs = [json.loads(await proc.stdout.readline()) for _ in range(3)]
    proc.send_signal(signal.SIGINT)  # Ctrl-C
    await proc.wait()
    assert proc.returncode == 0
    assert all(d["jobTypes"][0]["ready"] == 2 for d in docs)


async def test_stats_watch_into_a_file_writes_a_frame_per_refresh(live: Live, tmp_path):
    """Not a terminal: plain frames, flushed, there when a SIGTERM ends the watch."""
    await enqueue(live.client, "w", "t1", 2)
    out = tmp_path / "frames.txt"
    with out.open("w") as f:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "app.cli", "stats", "--watch", "--interval", "0.2", "--url", live.url),
            stdout=f,
            stderr=asyncio.subprocess.PIPE,
        )

        async def frames(n: int) -> None:
            while out.read_text().count("--- ") < n:  # noqa: ASYNC110 - a file has no event
                await asyncio.sleep(0.05)

        try:
            await asyncio.wait_for(frames(3), timeout=30)
        finally:
            proc.send_signal(signal.SIGTERM)
            await proc.wait()
    text = out.read_text()
    assert "\x1b[" not in text  # no terminal control: a file reads as text
    frames_written = text.split("--- ")[1:]
    assert len(frames_written) >= 3
    assert all(rows(frame)["t1"][:3] == ["1", "2", "0"] for frame in frames_written)


async def test_the_stats_table_shows_a_trickle_tenant_and_a_silent_backlog(live: Live):
    c = live.client
    await enqueue(c, "mail", "bigco", 100)
    await enqueue(c, "idle", "waiting", 3)
    stats = live.services.stats
    await stats.sample()
    for _ in range(3):
        await enqueue(c, "mail", "trickle", 1)
        for j in await activate(c, "mail", 2):
            assert (await complete(c, j)).status_code == 204
    total, at, moved = stats._moved["idle"]
    stats._moved["idle"] = (total, at - 60, moved)  # as if first seen a minute ago
    ran = await jobfair(live.url, "stats")
    tables = titled(ran.stdout, ["idle", "mail"])
    trickle = rows(tables["mail"])["trickle"]
    assert trickle[:7] == ["1", "0", "0", "0", "-", "3", "50.0%"]
    assert rows(tables["mail"])["(all)"][4] == "6"  # every row's activations
    idle = r"^idle  no activation of this type for (at least )?1m0\ds *$"
    assert re.search(idle, ran.stdout, re.M)


# -- tenants and job types --------------------------------------------------------------


async def test_tenants_set_changes_what_is_given_and_keeps_the_rest(live: Live):
    ran = await jobfair(live.url, "tenants", "set", "acme", "--weight", "3")
    assert ran.returncode == 0, ran.stderr
    assert rows(ran.stdout)["acme"][:2] == ["3", "-"]
    ran = await jobfair(live.url, "tenants", "set", "acme", "--max-active-jobs", "5")
    assert rows(ran.stdout)["acme"][:2] == ["3", "5"]
    await jobfair(live.url, "tenants", "set", "beta", "--weight", "2")
    listed = await jobfair(live.url, "tenants", "list")
    assert {t: r[:2] for t, r in rows(listed.stdout).items() if t != "tenant"} == {
        "acme": ["3", "5"],
        "beta": ["2", "-"],
    }
    as_json = json.loads((await jobfair(live.url, "tenants", "list", "--json")).stdout)
    assert as_json == (await live.client.get("/v2/tenants")).json()
    ran = await jobfair(live.url, "tenants", "set", "acme", "--no-cap", "--json")
    assert json.loads(ran.stdout) | {"maxActiveJobs": None, "weight": 3} == json.loads(ran.stdout)
    assert json.loads(ran.stdout) == (await live.client.get("/v2/tenants/acme")).json()
    ran = await jobfair(live.url, "tenants", "reset", "acme")
    assert ran.returncode == 0 and "defaults" in ran.stdout
    assert (await live.client.get("/v2/tenants/acme")).json()["weight"] == 1
    for bad in (["acme"], ["acme", "--no-cap", "--max-active-jobs", "3"]):
        ran = await jobfair(live.url, "tenants", "set", *bad)
        assert ran.returncode == 2, bad
    assert [t["tenantId"] for t in as_json["tenants"]] == ["acme", "beta"]


async def test_tenants_set_keeps_a_rate_limit_it_was_not_told_to_change(live: Live):
    """A PUT replaces the whole configuration: the CLI carries the rate limit over, so
    that setting a weight does not remove it."""
    ran = await jobfair(live.url, "tenants", "set", "acme", "--rate-per-second", "50",
                        "--burst", "100")  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert rows(ran.stdout)["acme"] == ["1", "-", "no", "50/s,burst=100", "-"]
    await jobfair(live.url, "tenants", "set", "acme", "--weight", "3")
    await jobfair(live.url, "tenants", "set", "acme", "--burst", "10")
    got = (await live.client.get("/v2/tenants/acme")).json()
    assert got["weight"] == 3 and got["rateLimit"] == {"perSecond": 50, "burst": 10, "tokens": 10}
    ran = await jobfair(live.url, "tenants", "set", "acme", "--no-rate-limit")
    assert rows(ran.stdout)["acme"] == ["3", "-", "no", "-", "-"]
    for bad in (
        ["beta", "--burst", "3"],  # a new limit needs both
        ["acme", "--no-rate-limit", "--rate-per-second", "3"],
    ):
        ran = await jobfair(live.url, "tenants", "set", *bad)
        assert ran.returncode == 2, bad
    ran = await jobfair(live.url, "job-types", "set", "mail", "--rate-per-second", "0.5",
                        "--burst", "1")  # fmt: skip
    assert rows(ran.stdout)["mail"] == [
        "-", "1m00s", "10", "no", "0.5/s,burst=1", "activations", "-", "priority"
    ]  # fmt: skip
    ran = await jobfair(live.url, "job-types", "set", "mail", "--fairness-by", "workerTime")
    assert rows(ran.stdout)["mail"][-3] == "workerTime"
    ran = await jobfair(live.url, "job-types", "set", "mail", "--max-active-per-key", "2")
    assert rows(ran.stdout)["mail"][-2] == "2"
    ran = await jobfair(live.url, "job-types", "set", "mail", "--fifo-keys")
    assert rows(ran.stdout)["mail"][-1] == "fifo"
    await jobfair(live.url, "job-types", "set", "mail", "--max-active-jobs", "4")
    got = (await live.client.get("/v2/job-types/mail")).json()
    assert got["rateLimit"] == {"perSecond": 0.5, "burst": 1, "tokens": 1}
    assert got["fairnessBy"] == "workerTime"  # what is not given stays as it is
    assert got["maxActivePerKey"] == 2 and got["keyOrdering"] == "fifo"
    ran = await jobfair(live.url, "job-types", "set", "mail", "--no-per-key-cap", "--no-fifo-keys")
    assert rows(ran.stdout)["mail"][-2:] == ["-", "priority"]
    for bad in (["--fairness-by", "time"], ["--max-active-per-key", "0"],
                ["--max-active-per-key", "2", "--no-per-key-cap"]):  # fmt: skip
        ran = await jobfair(live.url, "job-types", "set", "mail", *bad)
        assert ran.returncode != 0, (bad, ran.stdout)
    assert (await live.client.get("/v2/job-types/mail")).json()["maxActivePerKey"] is None


async def test_job_types_set_then_list(live: Live):
    ran = await jobfair(live.url, "job-types", "set", "billing/invoice", "--max-active-jobs", "4")
    assert ran.returncode == 0, ran.stderr
    assert rows(ran.stdout)["billing/invoice"][:3] == ["4", "1m00s", "10"]
    ran = await jobfair(live.url, "job-types", "set", "billing/invoice", "--aging-step", "0",
                        "--aging-interval-ms", "5000")  # fmt: skip
    assert rows(ran.stdout)["billing/invoice"][:3] == ["4", "5.0s", "0"]
    listed = json.loads((await jobfair(live.url, "job-types", "list", "--json")).stdout)
    assert listed == (await live.client.get("/v2/job-types")).json()
    [record] = listed["jobTypes"]
    assert record | {"type": "billing/invoice", "maxActiveJobs": 4, "agingIntervalMs": 5000,
                     "agingStep": 0} == record  # fmt: skip
    table = await jobfair(live.url, "job-types", "list")
    assert rows(table.stdout)["billing/invoice"][:3] == ["4", "5.0s", "0"]


async def test_pause_and_resume_a_tenant_and_a_job_type(live: Live):
    await route_or_skip(live, "POST", "/v2/tenants/probe/resume")
    c = live.client
    await enqueue(c, "p", "acme", 3)
    await enqueue(c, "p", "beta", 3)
    ran = await jobfair(live.url, "tenants", "pause", "acme")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "tenant acme: paused"
    listed = await jobfair(live.url, "tenants", "list")
    assert rows(listed.stdout)["acme"][2] == "yes"
    jobs = await activate(c, "p", 10)
    assert {j["tenantId"] for j in jobs} == {"beta"}
    stats = await jobfair(live.url, "stats")
    assert "paused" in " ".join(rows(stats.stdout)["acme"])
    ran = await jobfair(live.url, "tenants", "resume", "acme", "--json")
    assert json.loads(ran.stdout)["paused"] is False
    assert {j["tenantId"] for j in await activate(c, "p", 10)} == {"acme"}

    await route_or_skip(live, "POST", "/v2/job-types/probe/resume")
    await enqueue(c, "q", "acme", 2)
    ran = await jobfair(live.url, "job-types", "pause", "q")
    assert ran.stdout.strip() == "job type q: paused"
    assert await activate(c, "q", 5) == []
    stats = await jobfair(live.url, "stats", "--type", "q")
    assert "paused" in stats.stdout
    assert (await jobfair(live.url, "job-types", "resume", "q")).stdout.strip() == (
        "job type q: resumed"
    )
    assert len(await activate(c, "q", 5)) == 2


# -- jobs -------------------------------------------------------------------------------


async def failed_job(live: Live, tenant: str = "acme", job_type: str = "mail") -> str:
    c = live.client
    r = await c.post(
        "/v2/jobs", json={"type": job_type, "tenantId": tenant, "variables": {"to": "x@y"}}
    )
    key = r.json()["jobKey"]
    [job] = await activate(c, job_type, 1, worker="w-1", tenantIds=[tenant])
    r = await c.post(f"/v2/jobs/{key}/fail", json={"activationCount": job["activationCount"],
                     "retries": 0, "errorMessage": "smtp said no"})  # fmt: skip
    assert r.status_code == 204, r.text
    return str(key)


async def test_jobs_show_prints_the_record(live: Live):
    key = await failed_job(live)
    ran = await jobfair(live.url, "jobs", "show", key)
    assert ran.returncode == 0, ran.stderr
    fields = rows(ran.stdout)
    assert fields["jobKey"] == [key] and fields["state"] == ["FAILED"]
    assert fields["worker"] == ["w-1"] and fields["errorMessage"] == ["smtp", "said", "no"]
    assert fields["variables"] == ['{"to":', '"x@y"}']
    ran = await jobfair(live.url, "jobs", "show", key, "--json")
    shown = json.loads(ran.stdout)
    assert shown["job"] == (await live.client.get(f"/v2/jobs/{key}")).json()


async def test_jobs_show_includes_the_history(live: Live):
    await route_or_skip(live, "GET", "/v2/jobs/1/history")
    key = await failed_job(live)
    ran = await jobfair(live.url, "jobs", "show", key)
    history = ran.stdout.split("history")[-1]
    assert "smtp said no" in history and "w-1" in history
    as_json = json.loads((await jobfair(live.url, "jobs", "show", key, "--json")).stdout)
    assert as_json["history"] == (await live.client.get(f"/v2/jobs/{key}/history")).json()
    assert len(as_json["history"]["items"]) >= 2  # activated, failed


async def test_jobs_retry_gives_a_failed_job_retries_again(live: Live):
    key = await failed_job(live)
    ran = await jobfair(live.url, "jobs", "retry", key, "--retries", "2")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == f"job {key}: retries 2, CREATED"
    assert (await live.client.get(f"/v2/jobs/{key}")).json()["state"] == "CREATED"
    for bad in ([], [key, "--failed"], [key, "--tenant", "acme"]):
        assert (await jobfair(live.url, "jobs", "retry", *bad)).returncode == 2, bad


async def test_jobs_cancel_cancels_a_created_job_and_says_why_it_cannot_twice(live: Live):
    r = await live.client.post("/v2/jobs", json={"type": "t"})
    key = r.json()["jobKey"]
    ran = await jobfair(live.url, "jobs", "cancel", key)
    assert ran.returncode == 0 and ran.stdout.strip() == f"job {key}: CANCELED"
    assert (await live.client.get(f"/v2/jobs/{key}")).json()["state"] == "CANCELED"
    again = await jobfair(live.url, "jobs", "cancel", key)
    assert again.returncode == 1
    assert one_line(again.stderr).startswith("409 INVALID_STATE: ")


async def test_jobs_list_pages_newest_first_with_a_cursor(live: Live):
    await route_or_skip(live, "GET", "/v2/jobs", params={"limit": 1})
    keys = await enqueue(live.client, "l", "acme", 5)
    await enqueue(live.client, "l", "beta", 2)
    first = json.loads((await jobfair(live.url, "jobs", "list", "--tenant", "acme", "--limit",
                                      "3", "--json")).stdout)  # fmt: skip
    assert [j["jobKey"] for j in first["items"]] == keys[::-1][:3]
    assert first["nextCursor"]
    ran = await jobfair(live.url, "jobs", "list", "--tenant", "acme", "--limit", "3",
                        "--cursor", first["nextCursor"])  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    listed = [k for k in rows(ran.stdout) if k.isdigit()]
    assert listed == keys[::-1][3:]
    table = await jobfair(live.url, "jobs", "list", "--type", "l", "--limit", "2")
    assert one_line(table.stderr).startswith("more: --cursor ")
    assert all(rows(table.stdout)[k][2] == "CREATED" for k in rows(table.stdout) if k.isdigit())


async def test_bulk_retry_revives_every_failed_job_in_batches(live: Live):
    await route_or_skip(live, "POST", "/v2/jobs/retry", json={"tenantId": "nobody", "limit": 1})
    keys = [await failed_job(live, "acme") for _ in range(5)]
    other = await failed_job(live, "beta")
    refused = await jobfair(live.url, "jobs", "retry", "--failed", "--tenant", "acme", input="n\n")
    assert refused.returncode == 1
    # The question says how many it would touch (counted by a dry run: nothing changed).
    assert "give 5 FAILED jobs of tenant acme 1 retries?" in refused.stdout
    none = await jobfair(live.url, "jobs", "retry", "--failed", "--tenant", "nobody")
    assert (none.returncode, none.stdout.strip()) == (0, "no FAILED job of tenant nobody")
    assert (await live.client.get(f"/v2/jobs/{keys[0]}")).json()["state"] == "FAILED"
    ran = await jobfair(live.url, "jobs", "retry", "--failed", "--tenant", "acme", "--batch",
                        "2", "--retries", "3", "--yes")  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "retried 5 FAILED jobs of tenant acme"
    for key in keys:
        job = (await live.client.get(f"/v2/jobs/{key}")).json()
        assert (job["state"], job["retries"]) == ("CREATED", 3)
    assert (await live.client.get(f"/v2/jobs/{other}")).json()["state"] == "FAILED"


async def test_bulk_cancel_asks_then_cancels_a_tenants_created_jobs(live: Live):
    await route_or_skip(live, "POST", "/v2/jobs/cancel", json={"tenantId": "nobody", "limit": 1})
    keys = await enqueue(live.client, "c", "acme", 7)
    kept = await enqueue(live.client, "c", "beta", 2)
    refused = await jobfair(live.url, "jobs", "cancel", "--tenant", "acme", input="n\n")
    assert refused.returncode == 1 and "(7 now)" in refused.stdout
    ran = await jobfair(live.url, "jobs", "cancel", "--tenant", "acme", "--batch", "3",
                        input="y\n")  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip().endswith("canceled 7 CREATED jobs of tenant acme")
    states = {(await live.client.get(f"/v2/jobs/{k}")).json()["state"] for k in keys}
    assert states == {"CANCELED"}
    assert (await live.client.get(f"/v2/jobs/{kept[0]}")).json()["state"] == "CREATED"


async def test_workers_lists_who_activated_jobs_of_each_type(live: Live):
    await route_or_skip(live, "GET", "/v2/workers")
    await enqueue(live.client, "mail", "acme", 2)
    await activate(live.client, "mail", 1, worker="mailer-7")
    ran = await jobfair(live.url, "workers", "--type", "mail")
    assert ran.returncode == 0, ran.stderr
    assert rows(ran.stdout)["mail"][0] == "mailer-7"
    as_json = json.loads((await jobfair(live.url, "workers", "--json")).stdout)
    assert [(w["type"], w["worker"]) for w in as_json["items"]] == [("mail", "mailer-7")]


# -- what goes wrong --------------------------------------------------------------------


async def test_a_problem_is_one_line_with_status_title_and_detail_and_changes_nothing(
    live: Live,
):
    ran = await jobfair(live.url, "jobs", "show", "2251799813685249")
    assert ran.returncode == 1 and ran.stdout == ""
    assert re.fullmatch(r"404 NOT_FOUND: .*2251799813685249.*", one_line(ran.stderr))
    ran = await jobfair(live.url, "tenants", "set", "acme", "--weight", "0")
    assert ran.returncode == 1
    assert re.fullmatch(r"400 INVALID_ARGUMENT: .*weight.*", one_line(ran.stderr))
    assert (await live.client.get("/v2/tenants")).json() == {"tenants": []}
    ran = await jobfair(live.url, "jobs", "retry", "not-a-key")
    assert ran.returncode == 1 and one_line(ran.stderr).startswith("400 INVALID_ARGUMENT: ")


async def test_a_route_the_server_lacks_is_named_as_such(live: Live):
    ran = await jobfair(live.url, "tenants", "list", "--url", live.url + "/nowhere")
    assert ran.returncode == 1
    assert one_line(ran.stderr).endswith(
        "has no GET /nowhere/v2/tenants (is it older than this command?)"
    )


async def test_a_server_that_is_not_there_is_one_line_naming_its_url():
    url = f"http://127.0.0.1:{free_port()}"
    for args in (["stats"], ["tenants", "list"], ["jobs", "show", "1"]):
        ran = await jobfair(url, *args)
        assert ran.returncode == 1, args
        assert one_line(ran.stderr) == (
            f"cannot reach the Jobfair server at {url}: connection refused (is it running? --url)"
        )
    ran = await jobfair("ftp://example", "stats")
    assert ran.returncode == 2 and "http://" in one_line(ran.stderr)


async def test_the_key_comes_from_the_option_or_the_environment(db_url: str):
    settings: Settings = quiet_settings(auth="required")
    async with serving(create_app(settings, db_url)) as live:
        _, secret = await live.services.keys.create(Role.ADMIN, None, None, "cli", None, "test")
        ran = await jobfair(live.url, "tenants", "list")
        assert ran.returncode == 1
        assert one_line(ran.stderr).startswith("401 UNAUTHENTICATED: ")
        assert "--key or JOBFAIR_API_KEY" in ran.stderr
        by_option = await jobfair(live.url, "tenants", "set", "acme", "--weight", "2",
                                  "--key", secret)  # fmt: skip
        assert by_option.returncode == 0, by_option.stderr
        by_env = await jobfair(live.url, "tenants", "list", "--json", JOBFAIR_API_KEY=secret)
        assert json.loads(by_env.stdout)["tenants"][0]["weight"] == 2
        assert secret not in by_option.stdout + by_env.stdout


# -- the command itself -----------------------------------------------------------------


def commands(command: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """Every command under ``command`` (typer's click objects), with its path."""
    found = [(path, command)]
    for name, sub in getattr(command, "commands", {}).items():
        found += commands(sub, (*path, name))
    return found


def test_every_help_shows_each_options_default():
    """Every option with a default shows it (an unset one says what applies then), and
    every command's --help runs."""
    root = typer.main.get_command(cli)
    missing = []
    for path, command in commands(root):
        for p in command.params:
            if not isinstance(p, TyperOption) or p.is_flag or p.required:
                continue
            if not p.show_default or (p.default is None and not isinstance(p.show_default, str)):
                missing.append((" ".join(path), p.name))
        ran = jobfair_sync(*path, "--help")
        assert ran.returncode == 0, path
    assert missing == []
    stats_help = jobfair_sync("stats", "--help").stdout
    assert "[default: http://127.0.0.1:8080]" in stats_help
    assert "JOBFAIR_URL" in stats_help and "JOBFAIR_API_KEY" in stats_help
    assert "[default: 2.0]" in stats_help
    assert "[default: 100000]" in jobfair_sync("demo", "--help").stdout


def test_version_prints_the_package_version():
    from app import __version__

    ran = jobfair_sync("--version")
    head = migrations.head_revision()
    assert ran.returncode == 0 and ran.stdout == f"jobfair {__version__} (schema {head})\n"


async def test_what_callers_wrote_reaches_the_terminal_without_its_control_characters(live: Live):
    """A worker's name and an error message come from whoever holds a worker key: an
    escape sequence in them (colours, the window's title) is shown as text, not sent."""
    (key,) = await enqueue(live.client, "esc", "t", 1)
    hostile = "\x1b[41mW\x1b]0;pwned\x07"
    (job,) = await activate(live.client, "esc", worker=hostile)
    failed = await live.client.post(
        f"/v2/jobs/{key}/fail",
        json={"activationCount": job["activationCount"], "retries": 0,
              "errorMessage": "\x1b[31mRED\x1b[2J"},
    )  # fmt: skip
    assert failed.status_code == 204, failed.text
    for args in (("jobs", "list", "--state", "FAILED"), ("jobs", "show", key), ("workers",)):
        ran = await jobfair(live.url, *args)
        assert ran.returncode == 0, ran.stderr
        assert "\x1b" not in ran.stdout and "\x07" not in ran.stdout, (args, ran.stdout)
        assert "\\x1b[41mW" in ran.stdout or "\\x1b[31mRED" in ran.stdout, (args, ran.stdout)
