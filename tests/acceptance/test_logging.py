"""Logs an operator can search: a request id on every answer and on every line logged for
it, one entry per bug with its traceback, an access log, job events at levels that keep a
busy server's log readable, JSON lines from every process, and a database that cannot be
reached said in one line."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app import logs
from app.main import create_app
from tests.fixtures import Live, ServerProcess, free_port, quiet_settings, serving, wait_ready

REQUEST_ID = re.compile(r"[0-9a-f]{16}")


# -- in process: the request id, and a bug's one entry -----------------------------------


class Captured(logging.Handler):
    """Every record logged, with the fields a formatter would write (read as it is
    emitted: the request id is the logging task's)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.entries: list[tuple[logging.LogRecord, dict[str, Any]]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.entries.append((record, logs.fields(record)))

    def errors(self) -> list[tuple[logging.LogRecord, dict[str, Any]]]:
        return [(r, f) for r, f in self.entries if r.levelno >= logging.ERROR]


@pytest.fixture
def captured() -> Iterator[Captured]:
    """On the root logger and on uvicorn's (which the test server does not propagate):
    whatever either logs is seen."""
    handler = Captured()
    loggers = [logging.getLogger(), logging.getLogger("uvicorn")]
    for logger in loggers:
        logger.addHandler(handler)
    yield handler
    for logger in loggers:
        logger.removeHandler(handler)


@pytest.fixture
async def guarded(db_url: str) -> AsyncIterator[Live]:
    """A live server that requires keys, and holds no long poll (max_waiters 0)."""
    app = create_app(quiet_settings(auth="required", max_waiters=0), db_url, background=False)
    async with serving(app) as server:
        yield server


async def test_every_answer_carries_a_request_id(live: Live, guarded: Live):
    c = live.client
    answers = [
        await c.post("/v2/jobs", json={"type": "t"}),  # 201, direct dispatcher
        await c.post("/v2/jobs", json={"type": ""}),  # 400, direct dispatcher
        await c.post("/v2/jobs/1/complete", json={"activationCount": 1}),  # 404, direct
        await c.get("/v2/stats"),  # 200, FastAPI
        await c.get("/v2/jobs/1"),  # 404, FastAPI
        await c.get("/no/such/path"),  # 404, FastAPI's own
        await c.delete("/v2/jobs/activate"),  # 405
        await c.get("/healthz"),
        await guarded.client.post("/v2/jobs", json={"type": "t"}),  # 401, direct
        await guarded.client.get("/v2/keys"),  # 401, FastAPI
    ]
    statuses = [r.status_code for r in answers]
    assert statuses == [201, 400, 404, 200, 404, 404, 405, 200, 401, 401]
    ids = [r.headers.get("x-request-id") for r in answers]
    assert all(i and REQUEST_ID.fullmatch(i) for i in ids), ids
    assert len(set(ids)) == len(ids)


async def test_a_503_and_a_403_carry_one_too(guarded: Live):
    from app.keys import KeyService, Role

    keys = KeyService(guarded.services.db)
    _, worker = await keys.create(Role.WORKER, ["acme"], None, None, None, "test")
    h = {"Authorization": f"Bearer {worker}"}
    forbidden = await guarded.client.post("/v2/jobs", json={"type": "t"}, headers=h)
    assert forbidden.status_code == 403
    body = {"type": "t", "maxJobs": 1, "timeout": 1000, "requestTimeout": 5000}
    busy = await guarded.client.post("/v2/jobs/activate", json=body, headers=h)
    assert busy.status_code == 503, busy.text  # no waiter may be held
    for r in (forbidden, busy):
        assert REQUEST_ID.fullmatch(r.headers["x-request-id"])


async def test_a_sane_incoming_request_id_is_kept_and_any_other_replaced(live: Live):
    given = "7b6f5a4e-1c2d-4e3f-8a9b-0c1d2e3f4a5b"
    kept = await live.client.post("/v2/jobs", json={"type": "t"}, headers={"X-Request-Id": given})
    assert kept.headers["x-request-id"] == given
    for bad in ("x" * 129, "two words", "semi;colon"):
        r = await live.client.get("/v2/stats", headers={"X-Request-Id": bad})
        assert REQUEST_ID.fullmatch(r.headers["x-request-id"]), bad


@pytest.mark.parametrize(
    ("path", "service", "method"),
    [
        ("/v2/jobs", "jobs", "create_one"),  # answered by the direct dispatcher
        ("/v2/stats", "stats", "stats"),  # answered by FastAPI
    ],
)
async def test_a_bug_is_one_log_entry_with_its_traceback_and_the_id_its_500_names(
    live: Live, captured: Captured, monkeypatch: pytest.MonkeyPatch, path, service, method
):
    async def bug(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(getattr(live.services, service), method, bug)
    if path == "/v2/stats":
        r = await live.client.get(path)
    else:
        r = await live.client.post(path, json={"type": "t"})
    assert r.status_code == 500
    assert r.headers["content-type"] == "application/problem+json"
    problem = r.json()
    assert problem["title"] == "INTERNAL"
    rid = r.headers["x-request-id"]
    assert problem["requestId"] == rid and rid in problem["detail"]
    [(record, fields)] = captured.errors()  # one entry, not also uvicorn's
    assert record.exc_info is not None and "a bug" in str(record.exc_info[1])
    assert path in record.getMessage()
    assert fields["requestId"] == rid


async def test_a_line_logged_while_handling_a_request_carries_its_id(
    live: Live, captured: Captured
):
    logs.jobs.setLevel(logging.DEBUG)
    try:
        r = await live.client.post(
            "/v2/jobs", json={"type": "t", "tenantId": "acme"}, headers={"X-Request-Id": "r-1"}
        )
    finally:
        logs.jobs.setLevel(logging.NOTSET)
    [(record, fields)] = [(r, f) for r, f in captured.entries if r.name == "jobfair.jobs"]
    assert record.getMessage() == "job created"
    assert fields == {
        "event": "created",
        "jobKey": r.json()["jobKey"],
        "jobType": "t",
        "tenantId": "acme",
        "requestId": "r-1",
    }


@pytest.fixture
def job_events_on() -> Iterator[None]:
    logs.jobs.setLevel(logging.DEBUG)
    yield
    logs.jobs.setLevel(logging.NOTSET)


def events_of(captured: Captured) -> list[tuple[str, str, str | None]]:
    """(message, jobKey, requestId) of each job event."""
    return [
        (r.getMessage(), f["jobKey"], f.get("requestId"))
        for r, f in captured.entries
        if r.name == "jobfair.jobs"
    ]


async def test_a_job_handed_to_a_waiting_worker_is_logged_under_each_ones_request(
    live: Live, captured: Captured, job_events_on: None
):
    """The claim runs in the producer's task (a hand-off) or the dispatcher's; the job is
    activated for the worker's request, and logged so."""
    body = {"type": "t", "maxJobs": 1, "timeout": 60000, "requestTimeout": 10000}
    poll = asyncio.create_task(
        live.client.post("/v2/jobs/activate", json=body, headers={"X-Request-Id": "worker-1"})
    )
    deadline = asyncio.get_running_loop().time() + 30
    while not live.services.activation.waiters.has_waiters("t"):  # no event to wait on
        assert asyncio.get_running_loop().time() < deadline, "the poll never waited"
        await asyncio.sleep(0.01)
    made = await live.client.post("/v2/jobs", json={"type": "t"}, headers={"X-Request-Id": "p-1"})
    [got] = (await poll).json()["jobs"]
    key = made.json()["jobKey"]
    assert got["jobKey"] == key
    assert events_of(captured) == [("job created", key, "p-1"), ("job activated", key, "worker-1")]


async def test_completions_written_together_are_each_logged_under_their_request(
    live: Live, captured: Captured, job_events_on: None
):
    """Concurrent completions share one statement (the group commit), run in the task of
    whichever came first; each job's line still names the request that completed it."""
    c = live.client
    await c.post("/v2/jobs/batch", json={"jobs": [{"type": "t"}] * 20})
    body = {"type": "t", "maxJobs": 20, "timeout": 60000}
    jobs = (await c.post("/v2/jobs/activate", json=body)).json()["jobs"]
    assert len(jobs) == 20
    answers = await asyncio.gather(
        *(
            c.post(
                f"/v2/jobs/{j['jobKey']}/complete",
                json={"activationCount": 1},
                headers={"X-Request-Id": f"c-{j['jobKey']}"},
            )
            for j in jobs
        )
    )
    assert {r.status_code for r in answers} == {204}
    completed = [(k, rid) for m, k, rid in events_of(captured) if m == "job completed"]
    assert sorted(completed) == sorted((j["jobKey"], f"c-{j['jobKey']}") for j in jobs)


# -- server processes ---------------------------------------------------------------------


def json_lines(server: ServerProcess) -> list[dict[str, Any]]:
    """Every line of the server's output, each of which must be one JSON object."""
    entries = []
    for line in server.log.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            raise AssertionError(f"not a JSON line: {line!r}") from None
        assert isinstance(entry, dict), line
        assert {"time", "level", "logger", "message", "pid"} <= entry.keys(), line
        entries.append(entry)
    return entries


async def until_logged(server: ServerProcess, text: str, timeout_s: float = 30) -> str:
    """Polls the server's log (another process: no event to wait on) until ``text`` is
    in it; fails if the server exits first."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while text not in (log := server.log.read_text()):
        assert server.proc.poll() is None, log
        assert asyncio.get_running_loop().time() < deadline, log
        await asyncio.sleep(0.05)
    return log


async def stop(server: ServerProcess) -> None:
    server.proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(asyncio.to_thread(server.proc.wait), 30) == 0


async def test_with_json_logs_every_line_of_every_process_is_one_object(
    spawn_server: Callable[..., ServerProcess],
):
    server = spawn_server("--workers", "2", JOBFAIR_LOG_FORMAT="json", JOBFAIR_ACCESS_LOG="true")
    answered = []
    await until_logged(server, "Jobfair serving on")
    # Made the moment the banner is out, each at the first try: both processes listen by
    # then.  A connection each: the kernel spreads them over both processes.
    for _ in range(24):
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            answered.append(await c.post("/v2/jobs", json={"type": "t"}))
    await stop(server)
    entries = json_lines(server)
    access = {e["requestId"]: e for e in entries if e["logger"] == "jobfair.access"}
    for r in answered:
        line = access[r.headers["x-request-id"]]
        assert (line["method"], line["path"], line["status"]) == ("POST", "/v2/jobs", 201)
        assert isinstance(line["durationMs"], float) and line["durationMs"] >= 0
    assert len({e["pid"] for e in access.values()}) == 2  # both worker processes
    started = [e for e in entries if e["message"].startswith("Started server process")]
    assert {e["logger"] for e in started} == {"uvicorn.error"} and len(started) == 2
    banners = [e for e in entries if e["message"].startswith("Jobfair serving on")]
    assert [e["message"] for e in banners] == [f"Jobfair serving on {server.url}"]


async def test_the_banner_is_printed_once_the_server_listens(
    spawn_server: Callable[..., ServerProcess],
):
    server = spawn_server()  # one process; --workers 2: the JSON test above
    log = await until_logged(server, "Jobfair serving on")
    # Connections made the moment it is printed are all accepted, at the first try.
    for _ in range(8):
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            assert (await c.get("/healthz")).status_code == 200
    assert log.count("Jobfair serving on") == 1
    assert f"INFO app.cli: Jobfair serving on {server.url}\n" in log


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
async def test_an_ipv6_address_is_printed_in_brackets(spawn_server: Callable[..., ServerProcess]):
    server = spawn_server("--host", "::1")
    port = server.url.rsplit(":", 1)[1]
    await until_logged(server, "Jobfair serving on")
    assert f"Jobfair serving on http://[::1]:{port}\n" in server.log.read_text()
    async with httpx.AsyncClient(base_url=f"http://[::1]:{port}", timeout=30) as c:
        assert (await c.get("/healthz")).status_code == 200


async def job_events(server: ServerProcess, lease: bool = False) -> list[dict[str, Any]]:
    """A job completed and one failed for good, through the server (and with ``lease``
    one whose lease ran out); its job events."""
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        await wait_ready(c, server)
        for tenant in ("acme", "globex"):
            r = await c.post("/v2/jobs", json={"type": "mail", "tenantId": tenant})
            assert r.status_code == 201
        body = {"type": "mail", "maxJobs": 2, "timeout": 60000, "worker": "w1"}
        jobs = (await c.post("/v2/jobs/activate", json=body)).json()["jobs"]
        done, failing = sorted(jobs, key=lambda j: j["tenantId"])
        finish = {"activationCount": 1}
        completed = await c.post(f"/v2/jobs/{done['jobKey']}/complete", json=finish)
        assert completed.status_code == 204
        failed = await c.post(
            f"/v2/jobs/{failing['jobKey']}/fail",
            json={**finish, "retries": 0, "errorMessage": "smtp down"},
        )
        assert failed.status_code == 204
        if lease:
            assert (await c.post("/v2/jobs", json={"type": "slow"})).status_code == 201
            slow = {"type": "slow", "maxJobs": 1, "timeout": 100, "worker": "w-9"}
            assert len((await c.post("/v2/jobs/activate", json=slow)).json()["jobs"]) == 1
            await until_logged(server, "job lease expired")
    await stop(server)
    entries = json_lines(server)
    events = [e for e in entries if e["logger"] == "jobfair.jobs"]
    for e in events:
        assert e["message"] == f"job {e['event']}"
    return events


async def test_at_debug_every_job_event_names_its_job_and_tenant(
    spawn_server: Callable[..., ServerProcess],
):
    server = spawn_server("--log-level", "debug", JOBFAIR_LOG_FORMAT="json")
    events = await job_events(server)
    seen = {(e["event"], e["tenantId"]) for e in events}
    assert seen == {
        ("created", "acme"),
        ("created", "globex"),
        ("activated", "acme"),
        ("activated", "globex"),
        ("completed", "acme"),
        ("failed", "globex"),
    }
    for e in events:
        assert e["jobType"] == "mail" and re.fullmatch(r"\d+", e["jobKey"])
        assert REQUEST_ID.fullmatch(e["requestId"])  # the request that caused it
    [failed] = [e for e in events if e["event"] == "failed"]
    assert failed["level"] == "INFO" and failed["state"] == "FAILED"
    assert failed["errorMessage"] == "smtp down" and failed["activationCount"] == 1
    [activated, _] = [e for e in events if e["event"] == "activated"]
    assert activated["worker"] == "w1" and activated["level"] == "DEBUG"


async def test_at_the_default_level_only_failures_and_expired_leases_are_job_events(
    spawn_server: Callable[..., ServerProcess],
):
    server = spawn_server(JOBFAIR_LOG_FORMAT="json", JOBFAIR_LEASE_SWEEP_INTERVAL_MS="100")
    events = await job_events(server, lease=True)
    assert [(e["event"], e["level"]) for e in events] == [
        ("failed", "INFO"),
        ("lease expired", "INFO"),
    ]
    expired = events[1]
    assert (expired["jobType"], expired["tenantId"]) == ("slow", "<default>")
    assert (expired["activationCount"], expired["worker"]) == (1, "w-9")
    assert "requestId" not in expired  # the sweeper's, not a request's


# -- a database that cannot be reached at start ------------------------------------------


def serve_on(database_url: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--port", str(free_port()),
         "--database-url", database_url],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize("wait_s", ["0", "1"])
def test_an_unreachable_database_at_start_is_one_line_naming_it_without_its_password(
    wait_s: str,
):
    port = free_port()  # nothing listens on it
    r = serve_on(f"postgresql://u:secret@127.0.0.1:{port}/x", JOBFAIR_DB_STARTUP_WAIT_S=wait_s)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and "secret" not in r.stderr, r.stderr
    last = r.stderr.splitlines()[-1]
    assert f"cannot connect to the database postgresql://u:***@127.0.0.1:{port}/x" in last
    assert "ConnectionRefusedError" in last
    # Waited for: one line more, when the wait began.
    assert len(r.stderr.splitlines()) == (1 if wait_s == "0" else 2), r.stderr


def test_a_database_that_refuses_us_at_start_is_one_line_with_its_reason(db_url: str):
    missing = re.sub(r"/test_[^?]*", "/no_such_database", db_url)
    r = serve_on(missing)  # not waited for: it would refuse us the same way in a minute
    assert r.returncode == 1, r.stderr
    [line] = r.stderr.splitlines()
    assert 'InvalidCatalogNameError: database "no_such_database" does not exist' in line, line


def test_a_bad_database_url_is_one_line(tmp_path: Path):
    r = serve_on("postgresql://u:secret@127.0.0.1:notaport/x")
    assert r.returncode == 1, r.stderr
    [line] = r.stderr.splitlines()
    assert "postgresql://u:***@127.0.0.1:notaport/x" in line and "secret" not in line
