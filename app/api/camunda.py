"""Camunda 8 REST names for the worker operations (API.md, "Camunda-compatible surface").

Bodies follow Camunda's schemas (unknown fields are 400), activated jobs carry every field
Camunda's strict clients require, and ``jobLeaseToken`` carries the fencing token.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import Request
from pydantic import AfterValidator, Field, WithJsonSchema
from starlette.responses import Response

from app.activation import ActivateRequest
from app.api import context, schemas, security, traced
from app.api.callers import HttpCaller
from app.api.finishes import fail, fenced
from app.api.parsing import ascii_digits, body, job_key, lease_token, optional_body, payload
from app.api.problems import JSON
from app.db.rows import JobRow
from app.domain import JobState, rfc3339, visible_variables

# Neutral values for the BPMN fields Jobfair has no use for (valid for strict clients).
NO_KEY = "0"
PROCESS_DEFINITION_ID = "jobfair"


class CamundaActivate(schemas.Strict):
    type: schemas.JobType
    maxJobsToActivate: schemas.MaxJobs
    timeout: schemas.LeaseMs
    requestTimeout: schemas.RequestTimeoutMs | None = None
    worker: schemas.Worker | None = None
    tenantIds: Annotated[list[schemas.TenantId], Field(max_length=1000)] | None = None
    fetchVariable: list[schemas.VariableName] | None = None
    tenantFilter: Literal["PROVIDED", "ASSIGNED"] | None = None
    withLease: Annotated[bool, Field(strict=True)] | None = None  # not 0 or 1


class CamundaComplete(schemas.Strict):
    variables: schemas.JsonObject | None = None
    result: schemas.JsonObject | None = None
    jobLeaseToken: schemas.LeaseToken | None = None


class CamundaFail(schemas.Strict):
    retries: schemas.Retries = 0  # Camunda's default, unlike the native route
    errorMessage: schemas.ShortText | None = None
    retryBackOff: schemas.BackoffMs = 0
    variables: schemas.JsonObject | None = None
    jobLeaseToken: schemas.LeaseToken | None = None


def camunda_job(row: JobRow, fetch: list[str] | None) -> dict[str, Any]:
    """An activated job as Camunda's clients read it."""
    assert row.deadline is not None  # an activated job has a lease
    variables = visible_variables(row.variables, fetch)
    return {
        "jobKey": str(row.job_key),
        "type": row.job_type,
        "worker": row.worker or "",
        "retries": row.retries,
        "deadline": int(row.deadline.timestamp() * 1000),
        "variables": variables,
        "customHeaders": row.custom_headers,
        "tenantId": row.tenant_id,
        "kind": "BPMN_ELEMENT",
        "listenerEventType": "UNSPECIFIED",
        "processDefinitionId": PROCESS_DEFINITION_ID,
        "processDefinitionVersion": -1,
        "processDefinitionKey": NO_KEY,
        "processInstanceKey": NO_KEY,
        "elementId": row.job_type,
        "elementInstanceKey": NO_KEY,
        "userTask": None,
        "tags": [],
        "rootProcessInstanceKey": None,
        "priority": row.priority,
        "physicalTenantId": row.tenant_id,
        "businessId": None,
        "jobLeaseToken": lease_token(row.job_key, row.activation_count),
    }


async def activation(request: Request) -> Response:
    spec = await body(request, CamundaActivate)
    caller = HttpCaller(request)
    asked = spec.tenantIds or None
    if spec.tenantFilter == "ASSIGNED":
        asked = None  # Camunda's "the tenants assigned to me": the key's, all for no key
    tenants = security.activation_tenants(caller.principal, spec.type, asked)
    req = ActivateRequest(spec.type, spec.maxJobsToActivate, spec.timeout, spec.worker, tenants)
    got = await traced.long_poll(request, req, caller, spec.requestTimeout, api="camunda")
    return JSON({"jobs": [camunda_job(r, spec.fetchVariable) for r in got.rows]})


async def completion(request: Request, key: str) -> Response:
    k = job_key(key)
    spec = await optional_body(request, CamundaComplete)
    [variables] = payload(request, spec.variables)
    await security.visible_job(request, k)
    count = await fenced(request, k, None, spec.jobLeaseToken)
    with traced.finish(request, "jobfair complete", **_finished(key)):
        await context.services(request).jobs.complete(k, count, variables)
    return Response(status_code=204)


async def failure(request: Request, key: str) -> Response:
    k = job_key(key)
    spec = await optional_body(request, CamundaFail)
    await security.visible_job(request, k)
    count = await fenced(request, k, None, spec.jobLeaseToken)
    with traced.finish(request, "jobfair fail", **_finished(key)):
        await fail(request, k, count, spec)
    return Response(status_code=204)


def _finished(key: str) -> dict[str, str]:
    return {"jobfair.job_key": key, "jobfair.api": "camunda"}


# -- search and topology --------------------------------------------------------------

CAMUNDA_STATES: dict[str, tuple[JobState, ...]] = {
    "CREATED": (JobState.CREATED, JobState.SCHEDULED, JobState.ACTIVATED),
    "COMPLETED": (JobState.COMPLETED,),
    "FAILED": (JobState.FAILED,),
    "ERROR_THROWN": (JobState.ERROR_THROWN,),
    "CANCELED": (JobState.CANCELED,),
}
NEVER = ("MIGRATED", "RETRIES_UPDATED", "TIMED_OUT", "TIMEOUT_UPDATED", "PRIORITY_UPDATED")
STATES = ("CREATED", "COMPLETED", "FAILED", "ERROR_THROWN", "CANCELED", *NEVER)


def _whole(v: object) -> int | None:
    """A JSON number without a fraction as an int (58.0 is 58); None for anything else."""
    if type(v) is int:
        return v
    if type(v) is float and v.is_integer():
        return int(v)
    return None


def _key(v: object) -> int:
    """A job key: the decimal string, or (as clients also send it) the int64 itself."""
    if type(v) is str and ascii_digits(v, 19) and int(v) <= schemas.INT64_MAX:
        return int(v)
    n = _whole(v)
    if n is not None and 0 <= n <= schemas.INT64_MAX:
        return n
    raise ValueError(f"a job key is a decimal int64 string, got {v!r}")


def _text(v: object) -> str:
    if type(v) is str and len(v) <= 1000 and "\x00" not in v:
        return v
    raise ValueError("expected a string of at most 1000 characters, without NUL (U+0000)")


def _state(v: object) -> str:
    if type(v) is str and v in STATES:
        return v
    raise ValueError(f"unknown job state {v!r}; one of {', '.join(STATES)}")


def _retries(v: object) -> int:
    n = _whole(v)
    if n is not None and 0 <= n <= schemas.INT32_MAX:
        return n
    raise ValueError(f"retries are an integer from 0 to {schemas.INT32_MAX}, got {v!r}")


def _filter_values(item: Callable[[object], Any]) -> Callable[[Any], list[Any]]:
    """A plain value, or Camunda's advanced filter ``{"$eq": v}`` / ``{"$in": [...]}``:
    the list of values it accepts, each checked by ``item`` as the column it is compared
    with."""

    def values(v: Any) -> list[Any]:
        if isinstance(v, dict):
            if set(v) == {"$eq"}:
                v = [v["$eq"]]
            elif set(v) == {"$in"} and isinstance(v["$in"], list) and len(v["$in"]) <= 1000:
                v = v["$in"]
            else:
                raise ValueError("supported operators are $eq and $in (a list of 1000 at most)")
        else:
            v = [v]
        return [item(x) for x in v]

    return values


def _filter_schema(schema: dict[str, Any]) -> dict[str, Any]:
    in_ = {"type": "array", "items": schema, "maxItems": 1000}
    operators = [
        {"type": "object", "properties": {op: s}, "required": [op], "additionalProperties": False}
        for op, s in (("$eq", schema), ("$in", in_))
    ]
    return {"anyOf": [schema, *operators]}


TEXT_SCHEMA = {"type": "string", "maxLength": 1000, "pattern": schemas.NO_NUL}
KEY_SCHEMA = {
    "anyOf": [
        {"type": "string", "pattern": schemas.JOB_KEY_PATTERN},
        {"type": "integer", "minimum": 0, "maximum": schemas.INT64_MAX},
    ]
}
RETRIES_SCHEMA = {"type": "integer", "minimum": 0, "maximum": schemas.INT32_MAX}
KeyFilter = Annotated[
    Any, AfterValidator(_filter_values(_key)), WithJsonSchema(_filter_schema(KEY_SCHEMA))
]
TextFilter = Annotated[
    Any, AfterValidator(_filter_values(_text)), WithJsonSchema(_filter_schema(TEXT_SCHEMA))
]
StateFilter = Annotated[
    Any,
    AfterValidator(_filter_values(_state)),
    WithJsonSchema(_filter_schema({"enum": list(STATES)})),
]
RetriesFilter = Annotated[
    Any, AfterValidator(_filter_values(_retries)), WithJsonSchema(_filter_schema(RETRIES_SCHEMA))
]


class SearchFilter(schemas.Strict):
    jobKey: KeyFilter | None = None
    type: TextFilter | None = None
    state: StateFilter | None = None
    tenantId: TextFilter | None = None
    worker: TextFilter | None = None
    retries: RetriesFilter | None = None


class SortField(schemas.Strict):
    field: Literal[
        "jobKey",
        "type",
        "tenantId",
        "state",
        "worker",
        "retries",
        "priority",
        "deadline",
        "creationTime",
        "endTime",
    ]
    order: Literal["ASC", "DESC", "asc", "desc"] = "ASC"


class Page(schemas.Strict):
    limit: Annotated[int, Field(ge=1, le=10_000), schemas.JsonInteger] = 100
    from_: Annotated[int, Field(ge=0, le=schemas.INT64_MAX, alias="from"), schemas.JsonInteger] = 0


class Search(schemas.Strict):
    filter: SearchFilter | None = None
    sort: list[SortField] | None = None
    page: Page | None = None


def _values(field: str, values: list[Any]) -> list[Any]:
    """A filter's values as the store compares them: Camunda's states as Jobfair's."""
    if field == "state":
        return [s for v in values if v not in NEVER for s in CAMUNDA_STATES[v]]
    return values


def search_item(row: JobRow) -> dict[str, Any]:
    state = row.state
    camunda_state = JobState.CREATED if state in (JobState.SCHEDULED, JobState.ACTIVATED) else state
    times = [t for t in (row.created_at, row.activated_at, row.completed_at) if t]
    return {
        "jobKey": str(row.job_key),
        "type": row.job_type,
        "worker": row.worker or "",
        "state": camunda_state,
        "kind": "BPMN_ELEMENT",
        "listenerEventType": "UNSPECIFIED",
        "retries": row.retries,
        "isDenied": None,
        "deniedReason": None,
        "hasFailedWithRetriesLeft": row.error_message is not None
        and row.retries > 0
        and camunda_state == "CREATED",
        "errorCode": row.error_code,
        "errorMessage": row.error_message,
        "customHeaders": row.custom_headers,
        "deadline": rfc3339(row.deadline),
        "endTime": rfc3339(row.completed_at),
        "processDefinitionId": PROCESS_DEFINITION_ID,
        "processDefinitionKey": NO_KEY,
        "processInstanceKey": NO_KEY,
        "rootProcessInstanceKey": None,
        "elementId": row.job_type,
        "elementInstanceKey": NO_KEY,
        "tenantId": row.tenant_id,
        "businessId": None,
        "creationTime": rfc3339(row.created_at),
        "lastUpdateTime": rfc3339(max(times)) if times else None,
        "priority": row.priority,
    }


async def search(request: Request) -> Response:
    spec = await optional_body(request, Search)
    filters: dict[str, list[Any]] = {}
    if spec.filter is not None:
        for field in spec.filter.model_fields_set:
            value = getattr(spec.filter, field)
            if value is not None:
                filters[field] = _values(field, value)
    sort: list[tuple[str, bool]] = [(s.field, s.order.upper() == "DESC") for s in spec.sort or []]
    page = spec.page or Page()
    caller = security.principal(request)
    for field, scope in (("tenantId", caller.tenants), ("type", caller.types)):
        if scope is not None:  # only what the key may see
            filters[field] = [v for v in filters.get(field, sorted(scope)) if v in scope]
    search_jobs = context.services(request).search.search
    rows, total, more = await search_jobs(filters, sort, page.limit, page.from_)
    return JSON(
        {
            "items": [search_item(r) for r in rows],
            "page": {
                "totalItems": total,
                "hasMoreTotalItems": more,
                "startCursor": None,
                "endCursor": None,
            },
        }
    )


async def topology(request: Request) -> Response:
    """A one-broker, one-partition cluster: what Jobfair looks like to Camunda clients."""
    settings = request.app.state.settings
    return JSON(
        {
            "brokers": [
                {
                    "nodeId": 0,
                    "brokerId": "0",
                    "host": settings.host,
                    "port": settings.port,
                    "partitions": [
                        {"partitionId": 1, "role": "leader", "health": "healthy", "state": "active"}
                    ],
                    "version": request.app.version,
                }
            ],
            "clusterId": None,
            "clusterSize": 1,
            "partitionsCount": 1,
            "replicationFactor": 1,
            "gatewayVersion": request.app.version,
            "lastCompletedChangeId": "-1",
        }
    )
