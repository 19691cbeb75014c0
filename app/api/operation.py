"""What the route table is made of: ``Operation`` (one declared operation), how the
table becomes FastAPI routes (``include``), and the patterns and links several
operations share.  The table itself: app.api.routes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Depends, FastAPI
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from app.api import (
    schemas,
    security,
)
from app.api.security import Permission

Endpoint = Callable[..., Awaitable[Response]]
# The TypedDict request bodies (pydantic validates them through a TypeAdapter).
TypedDictBody = schemas.CreateJob | schemas.CreateBatch

# A path parameter as the wire (and the document) names it, and as the endpoint takes it.
# ``{job_type:path}``: a job type may contain "/".

ENDPOINT_PARAMS = {
    "{jobKey}": "{key}",
    "{tenantId}": "{tenant_id}",
    "{fairnessKey}": "{fairness_key}",
    "{type}": "{job_type:path}",
    "{keyId}": "{key_id}",
    "{asset}": "{asset}",
}


# eq=False: an operation is its declaration (compared, and hashable, by identity).
@dataclass(frozen=True, eq=False)
class Operation:
    method: str  # upper case, as HTTP and Starlette spell it
    path: str  # as API.md and the document name it; see ENDPOINT_PARAMS
    endpoint: Endpoint  # async def f(request, **path_params) -> Response
    permission: Permission
    summary: str
    tag: str
    # Answered by the direct dispatcher (ADR 008): what a producer calls per job or batch
    # and a worker per job or per activation.  Its endpoint must use no FastAPI feature.
    hot: bool = False
    body: type[BaseModel] | type[TypedDictBody] | None = None
    status: int = 200  # of success
    answer: type[BaseModel] | dict[str, Any] | None = None  # None: no body
    # The problems it answers besides 413/415 (with a body) and 503 (openapi.build).
    errors: tuple[int, ...] = (400,)
    query: tuple[tuple[str, dict[str, Any], bool], ...] = ()  # (name, schema, required)
    media: str = "application/json"  # of the answer
    body_media: str = "application/json"
    body_optional: bool = False
    notes: str = ""
    also: dict[int, str] = field(default_factory=dict)
    # OpenAPI links from the success answer: what a client (or a stateful fuzzer) can
    # call next with what it got, {name: (operationId, parameters, requestBody)}.
    links: dict[str, tuple[str, dict[str, str], dict[str, Any] | None]] = field(
        default_factory=dict
    )
    # False: not part of API.md, and not in the document (FastAPI's own pages).
    documented: bool = True
    # Also answer HEAD (as FastAPI's own pages, Starlette routes, always did).
    head: bool = False

    @property
    def route_path(self) -> str:
        """The path as the router matches it, naming the endpoint's parameters."""
        path = self.path
        for wire, python in ENDPOINT_PARAMS.items():
            path = path.replace(wire, python)
        return path

    @property
    def methods(self) -> tuple[str, ...]:
        return (self.method, "HEAD") if self.head else (self.method,)

    @property
    def operation_id(self) -> str:
        words = [
            w for w in self.path.replace("/v2/", "/").split("/") if w and not w.startswith("{")
        ]
        tail = "".join(w.title().replace("-", "") for w in words)
        return self.method.lower() + tail + ("ByKey" if "{" in self.path else "")


def include(app: FastAPI, operations: Iterable[Operation]) -> None:
    """Route ``operations`` in ``app``, in their order, each behind ``authorize``."""
    for op in operations:
        app.add_api_route(
            op.route_path,
            op.endpoint,
            methods=list(op.methods),
            status_code=op.status,
            tags=[op.tag],
            include_in_schema=op.documented,
            dependencies=[Depends(_guard(op))],
        )


def _guard(op: Operation) -> Callable[[Request], Awaitable[None]]:
    async def guard(request: Request) -> None:
        await security.authorize(request, op)

    return guard


JOB_KEY = "/v2/jobs/{jobKey}"
_TENANT = schemas.TENANT_ID_PATTERN.strip("^$")
TENANT_LIST_PATTERN = f"^({_TENANT}(,{_TENANT})*)?$"
NAME_LIST_PATTERN = r"^[^,\x00]{0,1000}(,[^,\x00]{0,1000})*$"
STATE_LIST_PATTERN = (
    "^(CREATED|ACTIVATED|COMPLETED|FAILED|ERROR_THROWN|CANCELED)"
    "(,(CREATED|ACTIVATED|COMPLETED|FAILED|ERROR_THROWN|CANCELED))*$"
)
# "." and ".." are valid names but dot segments of a URL: clients resolve them away, and
# the request then names another path, or none (404).
DOT_SEGMENTS = "A tenant id, fairness key or job type of . or .. cannot be sent in a path (404)."


def job_links(key: str, count: str | None = None) -> dict[str, Any]:
    """Links to the calls on one job: its key (and activationCount) at these pointers."""
    params = {"jobKey": f"$response.body#{key}"}
    links: dict[str, Any] = {
        "GetJob": ("getJobsByKey", params, None),
        "CancelJob": ("postJobsCancelByKey", params, None),
    }
    if count is not None:
        fence = {"activationCount": f"$response.body#{count}"}
        links |= {
            "CompleteJob": ("postJobsCompleteByKey", params, fence),
            "FailJob": ("postJobsFailByKey", params, fence),
            "ThrowError": ("postJobsErrorByKey", params, {**fence, "errorCode": "E"}),
            "Heartbeat": ("patchJobsByKey", params, {**fence, "changeset": {"timeout": 60000}}),
        }
    return links


FIRST = "/jobs/0"
CAMUNDA_LINKS: dict[str, Any] = {
    f"Camunda{name}": (
        op,
        {"jobKey": f"$response.body#{FIRST}/jobKey"},
        {"jobLeaseToken": f"$response.body#{FIRST}/jobLeaseToken"},
    )
    for name, op in (("Complete", "postJobsCompletionByKey"), ("Fail", "postJobsFailureByKey"))
}
