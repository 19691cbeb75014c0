"""Every operation of the HTTP surface, declared once.

``OPERATIONS`` says, per operation, its method and path, the endpoint that answers it,
the permission it needs, whether it is on the hot path, and what it takes and answers.
Everything else is built from it: the FastAPI routes (``include``), the direct
dispatcher's routes (``direct.DirectRoutes``, the ``hot`` ones), the paths whose other
methods are 405 (``direct.literal_paths``), the OpenAPI document (``openapi.build``), and
the permission check (``security.authorize``, called before every endpoint).

The order is the order FastAPI tries the routes in, and it matters: Camunda's routes
come before the native ones, so that ``POST /v2/jobs/activation`` is not taken for a job
key.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Depends, FastAPI
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from app.api import (
    answers,
    browser,
    camunda,
    docs,
    jobs,
    keys,
    operators,
    schemas,
    security,
    ui,
)
from app.api.security import Permission
from app.domain import MAX_ACTIVATE_JOBS, MAX_LEASE_MS

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


def _job_links(key: str, count: str | None = None) -> dict[str, Any]:
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
OPERATIONS: tuple[Operation, ...] = (
    # -- FastAPI's own pages (it routed them before the API's) ------------------------
    Operation(
        "GET",
        docs.OPENAPI_URL,
        docs.openapi_document,
        Permission.DOCS,
        "This document",
        "operators",
        documented=False,
        head=True,
    ),
    Operation(
        "GET",
        docs.DOCS_URL,
        docs.swagger_ui,
        Permission.DOCS,
        "Swagger UI",
        "operators",
        documented=False,
        head=True,
    ),
    Operation(
        "GET",
        docs.OAUTH2_REDIRECT_URL,
        docs.swagger_ui_redirect,
        Permission.DOCS,
        "Swagger UI's OAuth2 redirect",
        "operators",
        documented=False,
        head=True,
    ),
    Operation(
        "GET",
        docs.SWAGGER_JS_URL,
        docs.swagger_js,
        Permission.DOCS,
        "Swagger UI's script",
        "operators",
        documented=False,
        head=True,
    ),
    Operation(
        "GET",
        docs.SWAGGER_CSS_URL,
        docs.swagger_css,
        Permission.DOCS,
        "Swagger UI's stylesheet",
        "operators",
        documented=False,
        head=True,
    ),
    Operation(
        "GET",
        docs.FAVICON_URL,
        docs.favicon,
        Permission.DOCS,
        "Swagger UI's icon",
        "operators",
        documented=False,
        head=True,
    ),
    # -- Camunda (API.md "Camunda-compatible surface") ------------------------------------
    Operation(
        "POST",
        "/v2/jobs/activation",
        camunda.activation,
        Permission.WORK,
        "Camunda: activate jobs",
        "camunda",
        body=camunda.CamundaActivate,
        answer=answers.CamundaJobs,
        errors=(400, 503),
        links=CAMUNDA_LINKS,
    ),
    Operation(
        "POST",
        JOB_KEY + "/completion",
        camunda.completion,
        Permission.WORK,
        "Camunda: complete a job",
        "camunda",
        body=camunda.CamundaComplete,
        status=204,
        errors=(400, 404, 409),
        body_optional=True,
    ),
    Operation(
        "POST",
        JOB_KEY + "/failure",
        camunda.failure,
        Permission.WORK,
        "Camunda: fail a job (retries default to 0)",
        "camunda",
        body=camunda.CamundaFail,
        status=204,
        errors=(400, 404, 409),
        body_optional=True,
    ),
    Operation(
        "POST",
        "/v2/jobs/search",
        camunda.search,
        Permission.READ_JOBS,
        "Camunda: search jobs",
        "camunda",
        body=camunda.Search,
        answer=answers.ANY_OBJECT,
        body_optional=True,
    ),
    # What Camunda's clients ask first; it names this server's host, port and version,
    # which the document (public too) also states.
    Operation(
        "GET",
        "/v2/topology",
        camunda.topology,
        Permission.AUTHENTICATED,
        "Camunda: cluster topology",
        "camunda",
        answer=answers.ANY_OBJECT,
        errors=(),
    ),
    # -- jobs (API.md "Producers" and "Workers") --------------------------------------
    Operation(
        "POST",
        "/v2/jobs",
        jobs.create_job,
        Permission.PRODUCE,
        "Create a job",
        "jobs",
        hot=True,
        body=schemas.CreateJob,
        status=201,
        answer=answers.Job,
        errors=(400, 409),
        also={200: "an existing job with the same idempotencyKey"},
        links={
            **_job_links("/jobKey"),
            # Activate the job's type, so that the calls on an activated job follow.
            "ActivateType": (
                "postJobsActivate",
                {},
                {
                    "type": "$response.body#/type",
                    "maxJobs": 1,
                    "timeout": 60000,
                    "requestTimeout": -1,
                },
            ),
            "CamundaActivateType": (
                "postJobsActivation",
                {},
                {
                    "type": "$response.body#/type",
                    "maxJobsToActivate": 1,
                    "timeout": 60000,
                    "requestTimeout": -1,
                },
            ),
        },
    ),
    Operation(
        "POST",
        "/v2/jobs/batch",
        jobs.create_batch,
        Permission.PRODUCE,
        "Create up to 10,000 jobs, all or nothing",
        "jobs",
        hot=True,
        body=schemas.CreateBatch,
        status=201,
        answer=answers.JobKeys,
        errors=(400, 409),
    ),
    Operation(
        "POST",
        "/v2/jobs/activate",
        jobs.activate,
        Permission.WORK,
        "Activate jobs (long polling)",
        "jobs",
        hot=True,
        body=schemas.Activate,
        answer=answers.Jobs,
        errors=(400, 503),
        notes="Answers as soon as at least one job is activated, or with an empty list when "
        "requestTimeout ends (0 or absent: the server default; negative: at once).",
        links=_job_links(f"{FIRST}/jobKey", f"{FIRST}/activationCount"),
    ),
    Operation(
        "GET",
        "/v2/jobs/stream",
        jobs.stream,
        Permission.WORK,
        "Stream activated jobs (Server-Sent Events)",
        "jobs",
        answer=answers.SSE_EVENT,
        errors=(400, 503),
        media="text/event-stream",
        query=(
            ("type", {"type": "string", "pattern": schemas.JOB_TYPE_PATTERN}, True),
            ("maxJobs", {"type": "integer", "minimum": 1, "maximum": MAX_ACTIVATE_JOBS}, True),
            ("timeout", {"type": "integer", "minimum": 1, "maximum": MAX_LEASE_MS}, True),
            ("worker", {"type": "string", "maxLength": 128, "pattern": schemas.NO_NUL}, False),
            ("tenantIds", {"type": "string", "pattern": TENANT_LIST_PATTERN}, False),
            ("fetchVariables", {"type": "string", "pattern": NAME_LIST_PATTERN}, False),
        ),
        notes="maxJobs is the stream's credit: at most that many of its jobs ACTIVATED and "
        "unfinished at once. tenantIds and fetchVariables are comma-separated (empty: none). "
        "A job counts as delivered once its event is written: when the stream ends, jobs "
        "not written, and the one whose write the break cut, return to CREATED at once; "
        "jobs written before the break keep their lease (they may be unread in socket "
        "buffers) until it ends.",
    ),
    Operation(
        "POST",
        "/v2/jobs/complete",
        jobs.complete_batch,
        Permission.WORK,
        "Complete up to 1,000 jobs",
        "jobs",
        hot=True,
        body=schemas.CompleteBatch,
        answer=answers.CompleteResults,
    ),
    Operation(
        "GET",
        JOB_KEY,
        jobs.get_job,
        Permission.READ_JOBS,
        "Get a job",
        "jobs",
        answer=answers.Job,
        errors=(400, 404),
    ),
    Operation(
        "POST",
        JOB_KEY + "/cancel",
        jobs.cancel_job,
        Permission.PRODUCE,
        "Cancel a CREATED or ACTIVATED job",
        "jobs",
        status=204,
        errors=(400, 404, 409),
    ),
    Operation(
        "POST",
        JOB_KEY + "/complete",
        jobs.complete_job,
        Permission.WORK,
        "Complete a job",
        "jobs",
        hot=True,
        body=schemas.Complete,
        status=204,
        errors=(400, 404, 409),
    ),
    Operation(
        "POST",
        JOB_KEY + "/fail",
        jobs.fail_job,
        Permission.WORK,
        "Fail a job (retry after a back-off, or FAILED)",
        "jobs",
        hot=True,
        body=schemas.Fail,
        status=204,
        errors=(400, 404, 409),
    ),
    Operation(
        "POST",
        JOB_KEY + "/error",
        jobs.throw_error,
        Permission.WORK,
        "Throw a business error (terminal ERROR_THROWN)",
        "jobs",
        hot=True,
        body=schemas.ThrowError,
        status=204,
        errors=(400, 404, 409),
        notes="Shared with the Camunda surface: fenced by activationCount or jobLeaseToken; "
        "with neither, only an ACTIVATED job.",
    ),
    # A worker's heartbeat (timeout), and Camunda's retries update; priority too.
    Operation(
        "PATCH",
        JOB_KEY,
        jobs.update_job,
        Permission.WORK,
        "Update retries, lease (timeout) or priority",
        "jobs",
        body=schemas.UpdateJob,
        status=204,
        errors=(400, 404, 409),
        notes="timeout sets the lease to now + timeout (a heartbeat). Fenced by "
        "activationCount or jobLeaseToken (a stale one is 409); without a fence the lease "
        "is only ever extended, never shortened.",
    ),
    # -- a job browser's (issue 24) ------------------------------------------------------
    Operation(
        "GET",
        "/v2/jobs",
        browser.list_jobs,
        Permission.READ_JOBS,
        "List jobs, newest first, a page at a time",
        "operators",
        answer=answers.JobPage,
        query=(
            ("type", {"type": "string", "pattern": schemas.JOB_TYPE_PATTERN}, False),
            ("tenantId", {"type": "string", "pattern": schemas.TENANT_ID_PATTERN}, False),
            ("state", {"type": "string", "pattern": STATE_LIST_PATTERN}, False),
            ("createdAfter", schemas.INSTANT_SCHEMA, False),
            ("createdBefore", schemas.INSTANT_SCHEMA, False),
            ("limit", {"type": "integer", "minimum": 1, "maximum": browser.MAX_PAGE}, False),
            ("cursor", {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,200}$"}, False),
        ),
        notes="state: comma-separated, of CREATED (delayed jobs too), ACTIVATED, COMPLETED, "
        "FAILED, ERROR_THROWN, CANCELED. createdAfter is inclusive, createdBefore exclusive. "
        "cursor: a page's nextCursor, with the same filters (another is 400). A key sees "
        "only its tenants' and types' jobs.",
    ),
    Operation(
        "POST",
        "/v2/jobs/retry",
        browser.retry_jobs,
        Permission.ADMIN,
        "Revive FAILED jobs in bulk (by type, tenant, creation time)",
        "operators",
        body=schemas.RetryJobs,
        answer=answers.BulkResult,
        notes="In batches of 1,000, each its own transaction; more: call again.",
    ),
    Operation(
        "POST",
        "/v2/jobs/cancel",
        browser.cancel_jobs,
        Permission.ADMIN,
        "Cancel a tenant's CREATED jobs in bulk",
        "operators",
        body=schemas.CancelJobs,
        answer=answers.BulkResult,
        notes="Delayed jobs too. In batches of 1,000, each its own transaction; more: call again.",
    ),
    Operation(
        "GET",
        JOB_KEY + "/history",
        browser.job_history,
        Permission.READ_JOBS,
        "A job's attempt history",
        "jobs",
        answer=answers.JobHistory,
        errors=(400, 404),
    ),
    Operation(
        "GET",
        JOB_KEY + "/explain",
        browser.explain_job,
        Permission.READ_JOBS,
        "Why a job is not running now",
        "jobs",
        answer=answers.JobExplanation,
        errors=(400, 404),
        notes="Each reason with its figures, from what the next activation reads; "
        "an estimate of when it starts.",
    ),
    Operation(
        "GET",
        "/v2/workers",
        browser.list_workers,
        Permission.ADMIN,
        "Worker names seen asking for jobs in the last 24 hours, per job type",
        "operators",
        answer=answers.Workers,
        query=(("type", {"type": "string", "pattern": schemas.JOB_TYPE_PATTERN}, False),),
    ),
    # -- operators ----------------------------------------------------------------------
    Operation(
        "PUT",
        "/v2/tenants/{tenantId}",
        operators.put_tenant,
        Permission.ADMIN,
        "Configure a tenant (weight, cap)",
        "operators",
        body=schemas.PutTenant,
        answer=answers.Tenant,
        errors=(400, 404),
        notes=DOT_SEGMENTS,
    ),
    Operation(
        "GET",
        "/v2/tenants",
        operators.list_tenants,
        Permission.ADMIN,
        "List tenant configurations",
        "operators",
        answer=answers.Tenants,
        errors=(),
    ),
    Operation(
        "GET",
        "/v2/tenants/{tenantId}",
        operators.get_tenant,
        Permission.ADMIN,
        "A tenant's configuration",
        "operators",
        answer=answers.Tenant,
        errors=(400, 404),
        notes=DOT_SEGMENTS,
    ),
    Operation(
        "DELETE",
        "/v2/tenants/{tenantId}",
        operators.delete_tenant,
        Permission.ADMIN,
        "Reset a tenant to defaults",
        "operators",
        status=204,
        errors=(400, 404),
    ),
    Operation(
        "PUT",
        "/v2/tenants/{tenantId}/keys/{fairnessKey}",
        operators.put_key,
        Permission.ADMIN,
        "Weigh a fairness key inside its tenant (applies at the next activation)",
        "operators",
        body=schemas.PutKey,
        answer=answers.FairnessKey,
        errors=(400, 404),
        notes=DOT_SEGMENTS,
    ),
    Operation(
        "GET",
        "/v2/tenants/{tenantId}/keys/{fairnessKey}",
        operators.get_key,
        Permission.ADMIN,
        "A fairness key's weight",
        "operators",
        answer=answers.FairnessKey,
        errors=(400, 404),
        notes=DOT_SEGMENTS,
    ),
    Operation(
        "DELETE",
        "/v2/tenants/{tenantId}/keys/{fairnessKey}",
        operators.delete_key,
        Permission.ADMIN,
        "Reset a fairness key to weight 1",
        "operators",
        status=204,
        errors=(400, 404),
    ),
    Operation(
        "POST",
        "/v2/tenants/{tenantId}/pause",
        operators.pause_tenant,
        Permission.ADMIN,
        "Pause a tenant: none of its jobs is activated until it is resumed",
        "operators",
        answer=answers.Tenant,
        errors=(400, 404),
        notes=DOT_SEGMENTS,
    ),
    Operation(
        "POST",
        "/v2/tenants/{tenantId}/resume",
        operators.resume_tenant,
        Permission.ADMIN,
        "Resume a paused tenant, in its fair place",
        "operators",
        answer=answers.Tenant,
        errors=(400, 404),
        notes=DOT_SEGMENTS,
    ),
    Operation(
        "POST",
        "/v2/job-types/{type}/pause",
        operators.pause_job_type,
        Permission.ADMIN,
        "Pause a job type: no job of it is activated until it is resumed",
        "operators",
        answer=answers.JobTypeConfig,
        errors=(400, 404),
        notes=DOT_SEGMENTS,
    ),
    Operation(
        "POST",
        "/v2/job-types/{type}/resume",
        operators.resume_job_type,
        Permission.ADMIN,
        "Resume a paused job type",
        "operators",
        answer=answers.JobTypeConfig,
        errors=(400, 404),
        notes=DOT_SEGMENTS,
    ),
    Operation(
        "PUT",
        "/v2/job-types/{type}",
        operators.put_job_type,
        Permission.ADMIN,
        "Configure a job type (cap, aging)",
        "operators",
        body=schemas.PutJobType,
        answer=answers.JobTypeConfig,
        errors=(400, 404),
        notes=DOT_SEGMENTS,
    ),
    Operation(
        "GET",
        "/v2/job-types",
        operators.list_job_types,
        Permission.ADMIN,
        "List job type configurations",
        "operators",
        answer=answers.JobTypes,
        errors=(),
    ),
    Operation(
        "GET",
        "/v2/job-types/{type}",
        operators.get_job_type,
        Permission.ADMIN,
        "A job type's configuration",
        "operators",
        answer=answers.JobTypeConfig,
        errors=(400, 404),
        notes=DOT_SEGMENTS,
    ),
    Operation(
        "GET",
        "/v2/stats",
        operators.stats,
        Permission.READ_STATS,
        "Ready, delayed, active jobs, caps and shares per type and tenant",
        "operators",
        answer=answers.Stats,
        query=(("type", {"type": "string", "pattern": schemas.JOB_TYPE_PATTERN}, False),),
        notes="type: one job type only.",
    ),
    Operation(
        "GET",
        "/healthz",
        operators.healthz,
        Permission.PUBLIC,
        "Liveness",
        "operators",
        answer=answers.Status,
        errors=(),
    ),
    Operation(
        "GET",
        "/readyz",
        operators.readyz,
        Permission.PUBLIC,
        "Readiness (database reachable, migrations at head)",
        "operators",
        answer=answers.Status,
        errors=(503,),
    ),
    # Any key (a scraper's need not be able to reconfigure tenants), or none when
    # settings.metrics_open.
    Operation(
        "GET",
        "/metrics",
        operators.metrics,
        Permission.METRICS,
        "Prometheus metrics",
        "operators",
        answer={"type": "string"},
        errors=(),
        media="text/plain",
    ),
    # -- the dashboard (ADR 022): a page that holds no data, so it needs no key ----------
    Operation(
        "GET",
        "/ui",
        ui.page,
        Permission.PUBLIC,
        "The live dashboard (a web page; it signs in with an API key)",
        "operators",
        answer={"type": "string"},
        errors=(),
        media="text/html",
    ),
    Operation(
        "GET",
        "/ui/{asset}",
        ui.asset,
        Permission.PUBLIC,
        "The dashboard's scripts and styles",
        "operators",
        errors=(404,),
        documented=False,
    ),
    Operation(
        "GET",
        "/v2/whoami",
        keys.whoami,
        Permission.AUTHENTICATED,
        "The calling key's role and scope (what a page may ask for)",
        "security",
        answer=answers.Caller,
        errors=(),
    ),
    # -- keys (API.md "Security") ---------------------------------------------------------
    Operation(
        "POST",
        "/v2/keys",
        keys.create_key,
        Permission.ADMIN,
        "Create an API key (its secret is answered this once)",
        "security",
        body=keys.CreateKey,
        status=201,
        answer=answers.NewKey,
    ),
    Operation(
        "GET",
        "/v2/keys",
        keys.list_keys,
        Permission.ADMIN,
        "List API keys (never their secrets)",
        "security",
        answer=answers.Keys,
        errors=(),
    ),
    Operation(
        "DELETE",
        "/v2/keys/{keyId}",
        keys.revoke_key,
        Permission.ADMIN,
        "Revoke an API key (on every server within a second)",
        "security",
        status=204,
        errors=(400, 404),
    ),
    Operation(
        "POST",
        "/oauth/token",
        keys.token,
        Permission.PUBLIC,
        "OAuth 2.0 client credentials: an access token for a key",
        "security",
        body=keys.TokenRequest,
        answer=answers.AccessToken,
        errors=(400, 401),
        body_media="application/x-www-form-urlencoded",
        notes="Form fields grant_type=client_credentials, client_id (the key id), "
        "client_secret (the key's secret); or the id and secret as HTTP Basic. audience "
        "and scope are accepted and ignored. Answers RFC 6749's error members in a "
        "problem+json body.",
    ),
)
