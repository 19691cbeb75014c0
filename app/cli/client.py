"""How the ``jobfair`` commands that talk to a server call it: one HTTP client, and one
place that turns what can go wrong (no server, a problem+json answer) into a line a
person can act on.

The commands are the server's operators' tools, so the URL and key come from the same
variables the clients' examples and test suites use: ``JOBFAIR_URL`` and
``JOBFAIR_API_KEY``.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote, urlsplit

import httpx
import typer

from app import __version__

DEFAULT_URL = "http://127.0.0.1:8080"
TIMEOUT_S = 30.0

Url = Annotated[
    str, typer.Option("--url", envvar="JOBFAIR_URL", help="the Jobfair server", metavar="URL")
]
Key = Annotated[
    str | None,
    typer.Option(
        "--key",
        envvar="JOBFAIR_API_KEY",
        help="API key, sent as 'Authorization: Bearer <key>'",
        show_default="none",
        metavar="SECRET",
    ),
]
Json = Annotated[bool, typer.Option("--json", help="print the server's JSON, for scripts")]


class CommandFailed(Exception):
    """What a command prints (one line, on stderr) before it exits with ``code``."""

    def __init__(self, message: str, code: int = 1, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status  # the HTTP status that said so, if one did


class RouteMissing(CommandFailed):
    """The server does not have the route (404 or 405 with no problem of its own): a
    server older than this command."""


class Server:
    """A Jobfair server over HTTP: ``call`` answers the decoded JSON of a success (None
    for 204) and raises ``CommandFailed`` with the reason for anything else."""

    def __init__(self, url: str, key: str | None, timeout_s: float = TIMEOUT_S) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise CommandFailed(f"--url {url!r}: give an http:// or https:// URL", code=2)
        self.url = url.rstrip("/")
        headers = {"User-Agent": f"jobfair-cli/{__version__}"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()

    def call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
    ) -> Any:
        query = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            r = self.http.request(method, path, json=json, params=query)
        except httpx.TransportError as exc:
            raise CommandFailed(transport_failure(self.url, exc)) from None
        if r.status_code >= 400:
            raise failure(r)
        if r.status_code == 204 or not r.content:
            return None
        return r.json()


def segment(value: str) -> str:
    """A tenant id or job type as one path segment (a job type may hold "/", which the
    server's routes accept as is); the valid names "." and ".." (and such parts of a job
    type) spelled %2E, which httpx does not take for dot segments."""
    return "/".join(
        part.replace(".", "%2E") if part in (".", "..") else quote(part, safe="")
        for part in value.split("/")
    )


def transport_failure(url: str, exc: httpx.TransportError) -> str:
    if isinstance(exc, httpx.ConnectError):
        reason = str(exc) or type(exc).__name__
        if "refused" in reason.lower():
            reason = "connection refused"
        return f"cannot reach the Jobfair server at {url}: {reason} (is it running? --url)"
    if isinstance(exc, httpx.TimeoutException):
        return f"the Jobfair server at {url} did not answer in time ({type(exc).__name__})"
    return f"talking to the Jobfair server at {url} failed: {exc or type(exc).__name__}"


def failure(r: httpx.Response) -> CommandFailed:
    """One line for an error answer: its status, title and detail."""
    problem: dict[str, Any] = {}
    if r.headers.get("content-type", "").startswith(
        ("application/problem+json", "application/json")
    ):
        try:
            body = r.json()
        except ValueError:
            body = None
        if isinstance(body, dict):
            problem = body
    title = problem.get("title") or r.reason_phrase
    detail = problem.get("detail")
    if detail is None and not problem:
        detail = r.text.strip()[:200] or None
    line = f"{r.status_code} {title}" + (f": {detail}" if detail else "")
    if r.status_code == 401:
        line += " (give an API key with --key or JOBFAIR_API_KEY)"
    if r.status_code == 405 or (r.status_code == 404 and detail == "Not Found"):
        # No route (Starlette's own answer), not a missing job or tenant: a server
        # older than this command.
        request = r.request
        return RouteMissing(
            f"{line}: the server at {self_url(request)} has no {request.method} "
            f"{request.url.path} (is it older than this command?)",
            status=r.status_code,
        )
    return CommandFailed(line, status=r.status_code)


def self_url(request: httpx.Request) -> str:
    return f"{request.url.scheme}://{request.url.netloc.decode()}"
