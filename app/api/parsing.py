"""Body and path parsing shared by the routers: sizes, JSON, validation -> 400."""

from __future__ import annotations

import asyncio
import base64
import urllib.parse
from collections.abc import Sequence
from typing import Any, TypeVar, overload

import orjson
from fastapi import Request
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.requests import ClientDisconnect

from app.api import faithful
from app.errors import InvalidArgument, PayloadTooLarge, StaleActivation, UnsupportedMediaType

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")
INT64_MAX = (1 << 63) - 1
INT32_MAX = (1 << 31) - 1
TOKEN_PREFIX = "jfl1"


@overload
async def body(request: Request, model: type[M]) -> M: ...
@overload
async def body(request: Request, model: TypeAdapter[T]) -> T: ...
async def body(request: Request, model: type[M] | TypeAdapter[T]) -> M | T:
    """The request's JSON body validated as ``model`` (a pydantic model, or a TypeAdapter
    for the TypedDict bodies); 400 if it is empty or invalid, 413 if it is too large, 415
    if it is not JSON.  Every body of every route is read here, and validated by types
    that bound every field (``schemas``), so no value reaches the database unchecked.
    A large body is read in a worker thread: its parsing and checks take tenths of a
    second a megabyte, and on the event loop they would hold up every other request
    (the GIL still lets the loop run between the thread's slices)."""
    raw = await _raw_body(request)
    if len(raw) > IN_A_THREAD:
        return await asyncio.to_thread(_parse, raw, model)
    return _parse(raw, model)


# Bodies larger than this are parsed in a worker thread (a hop costs tens of
# microseconds: a worker's small bodies stay on the loop).
IN_A_THREAD = 256 * 1024


def _parse(raw: bytes, model: type[M] | TypeAdapter[T]) -> M | T:
    if not raw:
        raise InvalidArgument("request body is empty; expected a JSON object")
    try:
        parsed: M | T = (
            model.validate_json(raw)
            if isinstance(model, TypeAdapter)
            else model.model_validate_json(raw)
        )
    except ValidationError as exc:
        raise InvalidArgument(describe(exc)) from None
    try:
        faithful.as_sent(raw)
    except faithful.NotAsSent as exc:
        raise InvalidArgument(str(exc)) from None
    return parsed


async def form_body(request: Request) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body (the OAuth token request, RFC 6749
    4.4.2), at most 16 KiB: each field once, as strict UTF-8; 400 or 415 otherwise."""
    raw = await _raw_body(request, form=True, limit=16 * 1024)
    try:
        pairs = urllib.parse.parse_qsl(
            raw.decode("ascii"),
            keep_blank_values=True,
            strict_parsing=bool(raw),
            errors="strict",
            max_num_fields=100,
        )
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidArgument(f"the form body is malformed: {exc}") from None
    fields: dict[str, str] = {}
    for name, value in pairs:
        if name in fields:
            raise InvalidArgument(f"form field {name!r} is given twice")
        if "\x00" in name or "\x00" in value:
            raise InvalidArgument(f"form field {name!r} contains NUL (U+0000)")
        fields[name] = value
    return fields


def _is_form(media: bytes) -> bool:
    return media.partition(b";")[0].strip().lower() == b"application/x-www-form-urlencoded"


async def _raw_body(
    request: Request,
    *,
    form: bool = False,
    limit: int | None = None,
) -> bytes:
    """The request's body, read no further than the size limit: a body sent in chunks
    (no Content-Length) gets its 400 at the limit, not after the server buffered all of
    it, however long the client keeps sending.

    Read straight from the ASGI messages, as Starlette's ``Request.stream`` does, but
    without its async generator and without building a ``Headers`` object: a worker's
    per-job bodies are small and arrive in one message.  With the database left out,
    reading them that way was a fifth of the server's CPU for a complete call (py-spy).
    Nothing reads a body twice, so Starlette's own record of a consumed stream is not
    kept."""
    if limit is None:
        limit = request.app.state.settings.max_body_bytes
    media = None
    for name, value in request.scope["headers"]:
        if name == b"content-length" and value.isdigit() and int(value) > limit:
            raise PayloadTooLarge(f"request body is larger than {limit} bytes")
        if name == b"content-type":
            media = value
    if form:
        if media is None or not _is_form(media):
            shown = "none" if media is None else repr(media.decode("latin-1"))
            raise UnsupportedMediaType(
                f"this body must be application/x-www-form-urlencoded, not {shown}"
            )
    elif media is not None and not _is_json(media):
        raise UnsupportedMediaType(
            f"a body must be application/json, not {media.decode('latin-1')!r}"
        )
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body is larger than {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)  # one chunk: that very bytes object, not a copy


def _is_json(media: bytes) -> bool:
    """application/json or a structured ``+json`` type, parameters (charset) aside."""
    kind = media.partition(b";")[0].strip().lower()
    return kind == b"application/json" or (
        kind.startswith(b"application/") and kind.endswith(b"+json")
    )


def validate(model: type[M], data: dict[str, Any]) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InvalidArgument(describe(exc)) from None


async def optional_body(request: Request, model: type[M]) -> M:
    """A body the caller may leave out entirely (Camunda's completion, failure, search)."""
    raw = await _raw_body(request)
    if not raw.strip():
        return model()
    if len(raw) > IN_A_THREAD:
        return await asyncio.to_thread(_parse, raw, model)
    return _parse(raw, model)


def describe(exc: ValidationError) -> str:
    return describe_errors(list(exc.errors()))


def describe_errors(errors: Sequence[Any]) -> str:
    """What was wrong, for a problem's ``detail``: the first five errors, then a count."""
    parts = []
    for e in errors[:5]:
        path = e["loc"]
        if e["type"] == faithful.ERROR_TYPE:
            path = faithful.located(path, e.get("ctx", {}))
        loc = ".".join(str(p) for p in path if p != "body")
        msg = faithful.message(e)
        if e["type"] == "json_invalid":
            msg = "body is not valid JSON: " + str(e.get("ctx", {}).get("error", ""))
        parts.append(f"{loc}: {msg}" if loc else msg)
    more = len(errors) - len(parts)
    if more > 0:
        parts.append(f"and {more} more")
    return "; ".join(parts) or "invalid request"


def query_params(request: Request) -> dict[str, str]:
    """The query string's parameters, each at most once (400 for one given twice),
    percent-decoded as strict UTF-8: Starlette replaces bytes that are not UTF-8
    (``%ED%A0%80``, ``%FF``) with U+FFFD, which would then be stored as if sent.  A
    parameter that is not UTF-8 is refused, by name."""
    raw = request.scope.get("query_string", b"").decode("latin-1")
    params: dict[str, str] = {}
    for pair in raw.split("&"):
        if not pair:
            continue
        name, _, value = pair.partition("=")
        try:
            name = urllib.parse.unquote_plus(name, errors="strict")
            value = urllib.parse.unquote_plus(value, errors="strict")
        except UnicodeDecodeError:
            shown = urllib.parse.unquote_plus(name)
            raise InvalidArgument(f"query parameter {shown!r} is not UTF-8") from None
        if name in params:
            # Which one counts is the reader's choice (Starlette takes the last, many
            # proxies the first): a way around a check made in front.  Refused.
            raise InvalidArgument(f"query parameter {name!r} is given twice; send it once")
        params[name] = value
    return params


def job_key(raw: str) -> int:
    if not ascii_digits(raw, 19) or int(raw) > INT64_MAX:
        raise InvalidArgument(f"jobKey must be a decimal int64 string, got {raw!r}")
    return int(raw)


def ascii_digits(raw: str, most: int) -> bool:
    """1 to ``most`` ASCII digits, and nothing else.  ``str.isdigit`` and ``int`` also take
    the digits of other scripts (``int('١٢') == 12``), superscripts that ``int`` then
    refuses (``'²'``), underscores and spaces."""
    return 0 < len(raw) <= most and raw.isascii() and raw.isdigit()


def payload(request: Request, *parts: dict[str, Any] | None) -> list[str | None]:
    """Serialize variables/headers once, enforcing the combined size limit."""
    limit = request.app.state.settings.max_payload_bytes
    out: list[str | None] = []
    size = 0
    for part in parts:
        if part is None:
            out.append(None)
            continue
        text = orjson.dumps(part).decode()
        size += len(text)
        out.append(text)
    if size > limit:
        raise InvalidArgument(f"variables and customHeaders exceed {limit} bytes serialized")
    return out


def payload_limit(request: Request) -> int | None:
    """The per-job payload limit to check each job against, or None when the request's
    body is itself under it: then no job in it can be over, and the work is skipped."""
    limit: int = request.app.state.settings.max_payload_bytes
    declared = request.headers.get("content-length")
    if declared is not None and ascii_digits(declared, 20) and int(declared) <= limit:
        return None
    return limit


def check_payload_size(limit: int, variables: dict[str, Any], headers: dict[str, Any]) -> None:
    """variables + customHeaders of one job, serialized, within the limit."""
    if len(orjson.dumps(variables)) + len(orjson.dumps(headers)) > limit:
        raise InvalidArgument(f"variables and customHeaders exceed {limit} bytes serialized")


# -- fencing tokens -----------------------------------------------------------------------


def lease_token(key: int, activation_count: int) -> str:
    """The Camunda surface's ``jobLeaseToken``: an opaque spelling of the activationCount."""
    raw = f"{TOKEN_PREFIX}:{key}:{activation_count}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def activation_from_token(key: int, token: str) -> int:
    """The activationCount a token carries.  The token is opaque to clients, so one that
    is not a lease of this job (another job's, or no token at all) is a lease that does
    not match: 409, as a stale one is, never a value sent on to the database."""
    try:
        padded = token + "=" * (-len(token) % 4)
        prefix, token_key, count = base64.urlsafe_b64decode(padded).decode().split(":")
        if prefix != TOKEN_PREFIX or token_key != str(key) or not ascii_digits(count, 10):
            raise ValueError
        if int(count) > INT32_MAX:  # no activationCount is (an int4 column)
            raise ValueError
        return int(count)
    except ValueError:
        raise StaleActivation(f"jobLeaseToken holds no lease of job {key}") from None


def fence(key: int, activation_count: int | None, token: str | None) -> int | None:
    """The activation a call on the shared routes (``/error``, ``PATCH``) is fenced by:
    the native ``activationCount``, Camunda's ``jobLeaseToken``, or None when neither was
    sent (then only a currently ACTIVATED job can be finished, as Camunda guarantees)."""
    if token is None:
        return activation_count
    from_token = activation_from_token(key, token)
    if activation_count is not None and activation_count != from_token:
        raise InvalidArgument(
            f"activationCount {activation_count} and jobLeaseToken (activation {from_token}) "
            "disagree; send one of them"
        )
    return from_token
