"""Log lines: their fields in both formats, the request id they carry, and what a log
line may say about a database URL."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import logging.config
import re
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from app import logs
from app.api import tracing
from app.cli.main import base_url
from app.db.pool import connect_error, without_password

RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture(params=["json", "text"])
def log_format(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def stream(log_format: str) -> Iterator[io.StringIO]:
    """The root logger (and uvicorn's) configured as a server process is, into a string."""
    out = io.StringIO()
    config = logs.config(log_format, "debug")  # type: ignore[arg-type]
    config["handlers"]["stderr"]["stream"] = out
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    logging.config.dictConfig(config)
    yield out
    root.handlers[:], _ = saved
    root.setLevel(saved[1])


def lines(out: io.StringIO) -> list[str]:
    return out.getvalue().splitlines()


def test_a_json_line_has_time_level_logger_message_and_the_extra_fields():
    record = logging.makeLogRecord(
        {"name": "app.jobs", "levelno": logging.INFO, "levelname": "INFO", "msg": "job %s"}
    )
    record.args = ("failed",)
    record.jobKey = "2251799813685249"
    record.tenantId = "acme"
    entry = json.loads(logs.JsonFormatter().format(record))
    assert RFC3339_UTC.match(entry["time"]), entry
    assert entry["level"] == "INFO" and entry["logger"] == "app.jobs"
    assert entry["message"] == "job failed"
    assert entry["jobKey"] == "2251799813685249" and entry["tenantId"] == "acme"
    assert isinstance(entry["pid"], int)


@pytest.mark.parametrize(
    "instants", [[0.0, 0.5, 1.999, 2.0], [1_700_000_000.25, 1_700_000_000.75, 1_700_000_059.001]]
)
def test_a_timestamp_is_the_instant_in_utc_to_the_millisecond(instants: list[float]):
    for created in instants:  # seconds formatted before are reused, and must be the same
        expected = datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")
        assert logs.timestamp(created) == expected.replace("+00:00", "Z")


def test_every_line_carries_the_request_id_of_the_request_it_was_logged_for(stream, log_format):
    token = logs.request_id.set("req-42")
    try:
        logging.getLogger("app.anything").warning("inside")
    finally:
        logs.request_id.reset(token)
    logging.getLogger("app.anything").warning("outside")
    inside, outside = lines(stream)
    if log_format == "json":
        assert json.loads(inside)["requestId"] == "req-42"
        assert "requestId" not in json.loads(outside)
    else:
        assert inside.endswith("app.anything: inside requestId=req-42")
        assert outside.endswith("app.anything: outside")


def test_a_traceback_stays_inside_its_json_line(stream, log_format):
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("app.x").exception("it broke")
    if log_format == "json":
        [line] = lines(stream)
        entry = json.loads(line)
        assert entry["level"] == "ERROR" and entry["message"] == "it broke"
        assert "Traceback" in entry["exception"] and "RuntimeError: boom" in entry["exception"]
    else:
        first, *rest = lines(stream)
        assert first.endswith("ERROR app.x: it broke") and rest[0].startswith("Traceback")


def test_uvicorns_loggers_go_through_the_same_handler(stream, log_format):
    logging.getLogger("uvicorn.error").info(
        "Started server process [%d]", 1, extra={"color_message": "x"}
    )
    logging.getLogger("uvicorn.access").info("a line")
    first, second = lines(stream)
    if log_format == "json":
        entry = json.loads(first)
        assert entry["logger"] == "uvicorn.error"
        assert entry["message"] == "Started server process [1]"
        assert "color_message" not in entry  # uvicorn's coloured copy is no field
        assert json.loads(second)["logger"] == "uvicorn.access"
    else:
        assert RFC3339_UTC.match(first.split(" ")[0])
        assert first.endswith("INFO uvicorn.error: Started server process [1]")


def test_a_text_value_with_spaces_is_quoted_to_stay_one_field(stream, log_format):
    logging.getLogger("app.x").info("failed", extra={"errorMessage": 'no "space" left'})
    [line] = lines(stream)
    if log_format == "text":
        assert line.endswith(r'errorMessage="no \"space\" left"')
    else:
        assert json.loads(line)["errorMessage"] == 'no "space" left'


def test_job_events_are_not_built_when_their_level_is_off(stream, log_format, monkeypatch):
    logs.jobs.setLevel(logging.INFO)
    built = []
    monkeypatch.setattr(logs, "job_event", lambda *a, **k: built.append(a))
    try:

        class Row:
            job_key, job_type, tenant_id, activation_count, worker = 1, "t", "a", 1, "w"

        logs.jobs_activated([Row()])
    finally:
        logs.jobs.setLevel(logging.NOTSET)
    assert built == [] and lines(stream) == []


def test_a_url_logged_has_no_password():
    assert without_password("postgresql://u:secret@db:5432/x") == "postgresql://u:***@db:5432/x"
    assert without_password("postgresql://u:p@ss@db/x") == "postgresql://u:***@db/x"
    assert (
        without_password("postgresql://u@db/x?sslmode=require&password=secret")
        == "postgresql://u@db/x?sslmode=require&password=***"
    )
    assert without_password("postgresql://u@/x?host=/run/pg") == "postgresql://u@/x?host=/run/pg"


def test_a_connection_error_is_its_type_and_message_on_one_line():
    refused = ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 1)")
    assert connect_error(refused) == (
        "ConnectionRefusedError: [Errno 111] Connect call failed ('127.0.0.1', 1)"
    )
    assert connect_error(TimeoutError()) == "TimeoutError"
    assert connect_error(ValueError("a\n  b")) == "ValueError: a b"


def test_an_ipv6_host_is_written_in_brackets():
    assert base_url("http", "::1", 8080) == "http://[::1]:8080"
    assert base_url("https", "127.0.0.1", 443) == "https://127.0.0.1:443"


@pytest.mark.parametrize(
    ("header", "kept"),
    [
        (b"0af7651916cd43dd8448eb211c80319c", True),
        (b"7b6f5a4e-1c2d-4e3f-8a9b-0c1d2e3f4a5b", True),
        (b"Root=1-67891233-abcdef012345678912345678", True),
        (b"x" * tracing.MAX_REQUEST_ID, True),
        (b"x" * (tracing.MAX_REQUEST_ID + 1), False),
        (b"has space", False),
        (b"new\nline", False),
        (b"", False),
        ("caf\u00e9".encode(), False),
    ],
)
def test_a_callers_request_id_is_kept_only_if_it_is_sane(header: bytes, kept: bool):
    scope = {"headers": [(b"host", b"x"), (b"x-request-id", header)]}
    assert tracing.incoming_request_id(scope) == (header.decode() if kept else None)


def test_a_new_request_id_is_sixteen_hex_digits_and_new_each_time():
    ids = {tracing.new_request_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(re.fullmatch(r"[0-9a-f]{16}", i) for i in ids)


async def test_a_task_serving_many_requests_logs_under_none_of_them():
    async def seen() -> str | None:
        return logs.request_id.get()

    logs.request_id.set("first")
    inherited = await asyncio.create_task(seen())
    shared = await asyncio.create_task(logs.unattributed(seen()))
    assert (inherited, shared, logs.request_id.get()) == ("first", None, "first")
