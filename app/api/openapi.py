"""The OpenAPI description of API.md, built from the request models the routes validate with.

The routes read their bodies themselves (``parsing.body``) so that every error is
problem+json, which leaves FastAPI's generated description without bodies or errors.  This
module states, once per route, what it takes and answers; ``tests/unit/test_openapi.py``
fails when a route is missing here or ``clients/openapi.json`` is stale.  Regenerate with
``make openapi`` (``python -m app.api.openapi > clients/openapi.json``).
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from pydantic import BaseModel, Field, TypeAdapter

from app import __version__
from app.api import camunda, schemas
from app.domain import MAX_ACTIVATE_JOBS, MAX_LEASE_MS

# The TypedDict request bodies (pydantic validates them through a TypeAdapter).
TypedDictBody = schemas.CreateJob | schemas.CreateBatch

# -- answers (documentation models: the routes build these shapes as dicts) -------------


class Problem(BaseModel):
    """RFC 9457 problem details; ``type`` is stable per kind of error."""

    type: str = Field(examples=["urn:jobfair:stale-activation"])
    title: Literal[
        "INVALID_ARGUMENT",
        "NOT_FOUND",
        "INVALID_STATE",
        "RESOURCE_EXHAUSTED",
        "OUTCOME_UNKNOWN",
        "METHOD_NOT_ALLOWED",
        "PAYLOAD_TOO_LARGE",
        "UNSUPPORTED_MEDIA_TYPE",
    ]
    status: int
    detail: str
    instance: str


class Job(BaseModel):
    jobKey: str = Field(description="int64 as a decimal string")
    type: str
    tenantId: str
    state: Literal["CREATED", "ACTIVATED", "COMPLETED", "FAILED", "ERROR_THROWN", "CANCELED"]
    priority: int
    effectivePriority: int = Field(
        description="after aging: what the scheduler uses now (CREATED), or what the pick "
        "that activated the job used"
    )
    retries: int
    activationCount: int = Field(description="the fencing token: +1 on every activation")
    worker: str | None
    deadline: str | None = Field(description="lease end while ACTIVATED (RFC 3339, UTC)")
    runAt: str
    variables: dict[str, Any]
    customHeaders: dict[str, Any]
    errorCode: str | None
    errorMessage: str | None
    createdAt: str
    activatedAt: str | None
    completedAt: str | None
    idempotencyKey: str | None


class Jobs(BaseModel):
    jobs: list[Job]


class JobKeys(BaseModel):
    jobKeys: list[str]


class CompleteResult(BaseModel):
    jobKey: str
    status: Literal[204, 404, 409]


class CompleteResults(BaseModel):
    results: list[CompleteResult]


class Tenant(BaseModel):
    tenantId: str
    weight: int
    maxActiveJobs: int | None


class Tenants(BaseModel):
    tenants: list[Tenant]


class JobTypeConfig(BaseModel):
    type: str
    maxActiveJobs: int | None
    agingIntervalMs: int
    agingStep: int


class JobTypes(BaseModel):
    jobTypes: list[JobTypeConfig]


class TenantStats(BaseModel):
    tenantId: str
    pending: int = Field(description="CREATED jobs: ready + delayed")
    ready: int = Field(description="activatable now")
    delayed: int = Field(description="a runAt or a retry back-off still ahead")
    active: int
    oldestPendingAgeMs: int | None = Field(
        description="how long the oldest ready job has been ready (delayed jobs left out)"
    )
    oldestReadyJobKey: str | None
    cappedBy: Literal["tenant", "type"] | None = Field(
        description="the cap that keeps the lane from more jobs now: its tenant's (over "
        "every type), else its type's; null when neither is reached"
    )
    activatedLastMinute: int
    realizedShare: float
    configuredShare: float = Field(description="of the weights of the lanes with ready jobs")


class TypeStats(BaseModel):
    type: str
    pending: int
    ready: int
    delayed: int
    active: int
    oldestPendingAgeMs: int | None
    oldestReadyJobKey: str | None
    tenants: list[TenantStats]


class Stats(BaseModel):
    jobTypes: list[TypeStats]


class CamundaJob(BaseModel):
    jobKey: str
    type: str
    worker: str
    retries: int
    deadline: int = Field(description="epoch milliseconds")
    variables: dict[str, Any]
    customHeaders: dict[str, Any]
    tenantId: str
    kind: Literal["BPMN_ELEMENT"]
    listenerEventType: Literal["UNSPECIFIED"]
    processDefinitionId: str
    processDefinitionVersion: int
    processDefinitionKey: str
    processInstanceKey: str
    elementId: str
    elementInstanceKey: str
    userTask: None
    tags: list[str]
    rootProcessInstanceKey: None
    priority: int
    physicalTenantId: str
    businessId: None
    jobLeaseToken: str = Field(description="the fencing token; send it back to finish")


class CamundaJobs(BaseModel):
    jobs: list[CamundaJob]


class Status(BaseModel):
    status: str


ANY_OBJECT: dict[str, Any] = {"type": "object", "additionalProperties": True}
# One event of the stream (as OpenAPI 3.2's itemSchema would say; keep-alives are
# comments, not events).
SSE_EVENT: dict[str, Any] = {
    "type": "object",
    "description": "event: job, id: <jobKey>, data: <Job as JSON>",
    "properties": {
        "event": {"const": "job"},
        "id": {"type": "string", "pattern": "^[0-9]+$"},
        "data": {"type": "string", "contentMediaType": "application/json"},
    },
    "required": ["event", "id", "data"],
}


# -- the routes ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    method: str
    path: str
    summary: str
    tag: str
    body: type[BaseModel] | type[TypedDictBody] | None = None
    status: int = 200
    answer: type[BaseModel] | dict[str, Any] | None = None
    errors: tuple[int, ...] = (400,)
    query: tuple[tuple[str, dict[str, Any], bool], ...] = ()  # (name, schema, required)
    media: str = "application/json"
    body_optional: bool = False
    notes: str = ""
    also: dict[int, str] = field(default_factory=dict)
    # OpenAPI links from the success answer: what a client (or a stateful fuzzer) can
    # call next with what it got, {name: (operationId, parameters, requestBody)}.
    links: dict[str, tuple[str, dict[str, str], dict[str, Any] | None]] = field(
        default_factory=dict
    )


JOB_KEY = "/v2/jobs/{jobKey}"
_TENANT = schemas.TENANT_ID_PATTERN.strip("^$")
TENANT_LIST_PATTERN = f"^({_TENANT}(,{_TENANT})*)?$"
NAME_LIST_PATTERN = r"^[^,\x00]{0,1000}(,[^,\x00]{0,1000})*$"
# "." and ".." are valid names but dot segments of a URL: clients resolve them away, and
# the request then names another path, or none (404).
DOT_SEGMENTS = "A tenant id or job type of . or .. cannot be sent in a path (404)."


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
OPS: tuple[Op, ...] = (
    Op(
        "post",
        "/v2/jobs",
        "Create a job",
        "jobs",
        schemas.CreateJob,
        201,
        Job,
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
    Op(
        "post",
        "/v2/jobs/batch",
        "Create up to 10,000 jobs, all or nothing",
        "jobs",
        schemas.CreateBatch,
        201,
        JobKeys,
    ),
    Op("get", JOB_KEY, "Get a job", "jobs", answer=Job, errors=(400, 404)),
    Op(
        "post",
        JOB_KEY + "/cancel",
        "Cancel a CREATED job",
        "jobs",
        status=204,
        errors=(400, 404, 409),
    ),
    Op(
        "post",
        "/v2/jobs/activate",
        "Activate jobs (long polling)",
        "jobs",
        schemas.Activate,
        200,
        Jobs,
        errors=(400, 503),
        notes="Answers as soon as at least one job is activated, or with an empty list when "
        "requestTimeout ends (0 or absent: the server default; negative: at once).",
        links=_job_links(f"{FIRST}/jobKey", f"{FIRST}/activationCount"),
    ),
    Op(
        "get",
        "/v2/jobs/stream",
        "Stream activated jobs (Server-Sent Events)",
        "jobs",
        answer=SSE_EVENT,
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
    Op(
        "post",
        JOB_KEY + "/complete",
        "Complete a job",
        "jobs",
        schemas.Complete,
        204,
        errors=(400, 404, 409),
    ),
    Op(
        "post",
        JOB_KEY + "/fail",
        "Fail a job (retry after a back-off, or FAILED)",
        "jobs",
        schemas.Fail,
        204,
        errors=(400, 404, 409),
    ),
    Op(
        "post",
        JOB_KEY + "/error",
        "Throw a business error (terminal ERROR_THROWN)",
        "jobs",
        schemas.ThrowError,
        204,
        errors=(400, 404, 409),
        notes="Shared with the Camunda surface: fenced by activationCount or jobLeaseToken; "
        "with neither, only an ACTIVATED job.",
    ),
    Op(
        "post",
        "/v2/jobs/complete",
        "Complete up to 1,000 jobs",
        "jobs",
        schemas.CompleteBatch,
        200,
        CompleteResults,
    ),
    Op(
        "patch",
        JOB_KEY,
        "Update retries, lease (timeout) or priority",
        "jobs",
        schemas.UpdateJob,
        204,
        errors=(400, 404, 409),
        notes="timeout sets the lease to now + timeout (a heartbeat). Fenced by "
        "activationCount or jobLeaseToken (a stale one is 409); without a fence the lease "
        "is only ever extended, never shortened.",
    ),
    Op(
        "post",
        "/v2/jobs/activation",
        "Camunda: activate jobs",
        "camunda",
        camunda.CamundaActivate,
        200,
        CamundaJobs,
        errors=(400, 503),
        links=CAMUNDA_LINKS,
    ),
    Op(
        "post",
        JOB_KEY + "/completion",
        "Camunda: complete a job",
        "camunda",
        camunda.CamundaComplete,
        204,
        errors=(400, 404, 409),
        body_optional=True,
    ),
    Op(
        "post",
        JOB_KEY + "/failure",
        "Camunda: fail a job (retries default to 0)",
        "camunda",
        camunda.CamundaFail,
        204,
        errors=(400, 404, 409),
        body_optional=True,
    ),
    Op(
        "post",
        "/v2/jobs/search",
        "Camunda: search jobs",
        "camunda",
        camunda.Search,
        200,
        ANY_OBJECT,
        body_optional=True,
    ),
    Op("get", "/v2/topology", "Camunda: cluster topology", "camunda", answer=ANY_OBJECT, errors=()),
    Op("get", "/v2/tenants", "List tenant configurations", "operators", answer=Tenants, errors=()),
    Op(
        "put",
        "/v2/tenants/{tenantId}",
        "Configure a tenant (weight, cap)",
        "operators",
        schemas.PutTenant,
        200,
        Tenant,
        errors=(400, 404),
        notes=DOT_SEGMENTS,
    ),
    Op(
        "get",
        "/v2/tenants/{tenantId}",
        "A tenant's configuration",
        "operators",
        answer=Tenant,
        errors=(400, 404),
        notes=DOT_SEGMENTS,
    ),
    Op(
        "delete",
        "/v2/tenants/{tenantId}",
        "Reset a tenant to defaults",
        "operators",
        status=204,
        errors=(400, 404),
    ),
    Op(
        "get",
        "/v2/job-types",
        "List job type configurations",
        "operators",
        answer=JobTypes,
        errors=(),
    ),
    Op(
        "put",
        "/v2/job-types/{type}",
        "Configure a job type (cap, aging)",
        "operators",
        schemas.PutJobType,
        200,
        JobTypeConfig,
        errors=(400, 404),
        notes=DOT_SEGMENTS,
    ),
    Op(
        "get",
        "/v2/job-types/{type}",
        "A job type's configuration",
        "operators",
        answer=JobTypeConfig,
        errors=(400, 404),
        notes=DOT_SEGMENTS,
    ),
    Op(
        "get",
        "/v2/stats",
        "Ready, delayed, active jobs, caps and shares per type and tenant",
        "operators",
        answer=Stats,
        query=(("type", {"type": "string", "pattern": schemas.JOB_TYPE_PATTERN}, False),),
        notes="type: one job type only.",
    ),
    Op("get", "/healthz", "Liveness", "operators", answer=Status, errors=()),
    Op(
        "get",
        "/readyz",
        "Readiness (database reachable, migrations at head)",
        "operators",
        answer=Status,
        errors=(503,),
    ),
    Op(
        "get",
        "/metrics",
        "Prometheus metrics",
        "operators",
        answer={"type": "string"},
        errors=(),
        media="text/plain",
    ),
)

PATH_PARAMS = {
    "jobKey": {
        "type": "string",
        "pattern": schemas.JOB_KEY_PATTERN,
        "description": "int64, decimal",
    },
    "tenantId": {"type": "string", "pattern": schemas.TENANT_ID_PATTERN},
    "type": {"type": "string", "pattern": schemas.JOB_TYPE_PATTERN},
}
ERROR_TEXT = {
    400: "Invalid input, naming the field (nothing was changed)",
    404: "No such job, tenant or job type",
    409: "Stale activationCount or lease token, or the wrong state",
    413: "The body is larger than the server's limit (16 MiB by default)",
    415: "The body is not application/json",
    503: "urn:jobfair:resource-exhausted (back pressure, or the database unavailable): "
    "nothing was changed, retry after Retry-After seconds.  urn:jobfair:outcome-unknown "
    "(no Retry-After): the database went away while the call's changes were being "
    "committed, which may or may not have happened; send it again only if doing it twice "
    "is harmless (an idempotencyKey, an activationCount), else read first",
}
# What a free-form value (variables, customHeaders, result) may hold: what PostgreSQL's
# jsonb and the server's JSON writer keep as sent.  The server refuses an integer written
# as one (no fraction, no exponent) beyond 64 bits, and takes any finite double (1e300,
# which is integral too): a schema sees values, not spellings, so it cannot say which
# integral numbers beyond 64 bits are refused, and says "number" for all of them.
JSON_VALUE: dict[str, Any] = {
    "description": "Any JSON value, except: a string or key containing NUL (U+0000), an "
    "integer written as one beyond 64 bits (-2^63 to 2^64-1), NaN or Infinity.",
    "anyOf": [
        {"type": "string", "pattern": schemas.NO_NUL},
        {"type": "number"},
        {"type": "boolean"},
        {"type": "null"},
        {"type": "array", "items": schemas.JSON_VALUE_REF},
        {
            "type": "object",
            "propertyNames": {"pattern": schemas.NO_NUL},
            "additionalProperties": schemas.JSON_VALUE_REF,
        },
    ],
}


@functools.cache
def build() -> dict[str, Any]:
    """The whole OpenAPI 3.1 document: built on first request (not at start-up), once."""
    components: dict[str, Any] = {}

    def ref(model: type[BaseModel] | type[TypedDictBody]) -> dict[str, Any]:
        # A TypeAdapter describes models and the TypedDict bodies alike.
        schema = TypeAdapter(model).json_schema(ref_template="#/components/schemas/{model}")
        for name, sub in schema.pop("$defs", {}).items():
            components.setdefault(name, _json_values(sub))
        components[model.__name__] = _json_values(schema)
        return {"$ref": f"#/components/schemas/{model.__name__}"}

    problem = ref(Problem)
    components["JsonValue"] = _json_values(JSON_VALUE)
    paths: dict[str, Any] = {}
    for op in OPS:
        params = [
            {"name": name, "in": "path", "required": True, "schema": PATH_PARAMS[name]}
            for name in PATH_PARAMS
            if "{" + name + "}" in op.path
        ] + [
            {"name": name, "in": "query", "required": required, "schema": schema}
            for name, schema, required in op.query
        ]
        responses: dict[str, Any] = {}
        if op.answer is None:
            responses[str(op.status)] = {"description": "Done"}
        else:
            schema = op.answer if isinstance(op.answer, dict) else ref(op.answer)
            responses[str(op.status)] = {
                "description": "OK",
                "content": {op.media: {"schema": schema}},
            }
        if op.links:
            responses[str(op.status)]["links"] = {
                name: {
                    "operationId": target,
                    "parameters": parameters,
                    **({"requestBody": body} if body is not None else {}),
                }
                for name, (target, parameters, body) in op.links.items()
            }
        for status, text in op.also.items():
            responses[str(status)] = {**responses[str(op.status)], "description": text}
        # Every body is read by parsing.body: over the limit, or not JSON, it is refused.
        body_errors = (413, 415) if op.body is not None else ()
        # Every call that reaches the database answers 503 while it is unavailable.
        unavailable = (503,) if op.path != "/healthz" else ()
        for status in dict.fromkeys((*op.errors, *body_errors, *unavailable)):
            error: dict[str, Any] = {
                "description": ERROR_TEXT[status],
                "content": {"application/problem+json": {"schema": problem}},
            }
            if status == 503:
                error["headers"] = {
                    "Retry-After": {
                        "description": "seconds; absent for urn:jobfair:outcome-unknown",
                        "schema": {"type": "integer"},
                    }
                }
            responses[str(status)] = error
        operation: dict[str, Any] = {
            "operationId": _operation_id(op),
            "summary": op.summary,
            "tags": [op.tag],
            "responses": responses,
        }
        if op.notes:
            operation["description"] = op.notes
        if params:
            operation["parameters"] = params
        if op.body is not None:
            operation["requestBody"] = {
                "required": not op.body_optional,
                "content": {"application/json": {"schema": ref(op.body)}},
            }
        paths.setdefault(op.path, {})[op.method] = operation
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Jobfair",
            "version": __version__,
            "description": "Fair job activation for multi-tenant back ends. The wire "
            "contract is API.md; every error is application/problem+json. While the "
            "database is unavailable every call answers 503 urn:jobfair:resource-exhausted "
            "with Retry-After (safe to retry); a call whose commit went unanswered answers "
            "503 urn:jobfair:outcome-unknown without Retry-After (retry only if idempotent).",
        },
        "paths": paths,
        "components": {
            "schemas": dict(sorted(components.items())),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{}, {"bearer": []}],
    }


def _json_values(schema: Any) -> Any:
    """``schema`` with every ``schemas.JSON_VALUE_REF`` made a reference to JsonValue."""
    if schema == schemas.JSON_VALUE_REF:
        return {"$ref": "#/components/schemas/JsonValue"}
    if isinstance(schema, dict):
        return {k: _json_values(v) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_json_values(v) for v in schema]
    return schema


def _operation_id(op: Op) -> str:
    words = [w for w in op.path.replace("/v2/", "/").split("/") if w and not w.startswith("{")]
    tail = "".join(w.title().replace("-", "") for w in words)
    return op.method + tail + ("ByKey" if "{" in op.path else "")


def render() -> bytes:
    return orjson.dumps(build(), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"


if __name__ == "__main__":
    sys.stdout.buffer.write(render())
