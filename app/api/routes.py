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

from app.api import (
    answers,
    camunda,
    docs,
    jobs,
    operator_routes,
    schemas,
)
from app.api.operation import (
    CAMUNDA_LINKS,
    FIRST,
    JOB_KEY,
    NAME_LIST_PATTERN,
    TENANT_LIST_PATTERN,
    Operation,
    job_links,
)
from app.api.security import Permission
from app.domain import MAX_ACTIVATE_JOBS, MAX_LEASE_MS

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
            **job_links("/jobKey"),
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
        links=job_links(f"{FIRST}/jobKey", f"{FIRST}/activationCount"),
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
    *operator_routes.OPERATIONS,
)
