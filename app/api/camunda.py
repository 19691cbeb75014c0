"""Camunda 8 REST names for the worker operations (API.md, "Camunda-compatible surface").

Bodies follow Camunda's schemas (unknown fields are 400), activated jobs carry every field
Camunda's strict clients require, and ``jobLeaseToken`` carries the fencing token.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request
from pydantic import Field, StringConstraints
from starlette.responses import Response

from app.activation import ActivateRequest
from app.api import schemas
from app.api.jobs import fail, long_poll
from app.api.parsing import body, fence, job_key, lease_token, optional_body, payload
from app.api.problems import JSON
from app.domain import MAX_ACTIVATE_JOBS, rfc3339, visible_variables
from app.errors import InvalidArgument

router = APIRouter(prefix="/v2/jobs", tags=["camunda"])

# Neutral values for the BPMN fields Jobfair has no use for (valid for strict clients).
NO_KEY = "0"
PROCESS_DEFINITION_ID = "jobfair"


class CamundaActivate(schemas.Strict):
    type: schemas.JobType
    maxJobsToActivate: Annotated[int, Field(strict=True, ge=1, le=MAX_ACTIVATE_JOBS)]
    timeout: schemas.LeaseMs
    requestTimeout: schemas.Int | None = None
    worker: Annotated[str, StringConstraints(max_length=128)] | None = None
    tenantIds: list[schemas.TenantId] | None = None
    fetchVariable: list[Annotated[str, StringConstraints(max_length=1000)]] | None = None
    tenantFilter: Literal["PROVIDED", "ASSIGNED"] | None = None
    withLease: bool | None = None


class CamundaComplete(schemas.Strict):
    variables: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    jobLeaseToken: str | None = None


class CamundaFail(schemas.Strict):
    retries: schemas.Retries = 0  # Camunda's default, unlike the native route
    errorMessage: schemas.ShortText | None = None
    retryBackOff: schemas.BackoffMs = 0
    variables: dict[str, Any] | None = None
    jobLeaseToken: str | None = None


def camunda_job(row: Any, fetch: list[str] | None) -> dict[str, Any]:
    variables = visible_variables(row["variables"], fetch)
    return {
        "jobKey": str(row["job_key"]),
        "type": row["job_type"],
        "worker": row["worker"] or "",
        "retries": row["retries"],
        "deadline": int(row["deadline"].timestamp() * 1000),
        "variables": variables,
        "customHeaders": row["custom_headers"],
        "tenantId": row["tenant_id"],
        "kind": "BPMN_ELEMENT",
        "listenerEventType": "UNSPECIFIED",
        "processDefinitionId": PROCESS_DEFINITION_ID,
        "processDefinitionVersion": -1,
        "processDefinitionKey": NO_KEY,
        "processInstanceKey": NO_KEY,
        "elementId": row["job_type"],
        "elementInstanceKey": NO_KEY,
        "userTask": None,
        "tags": [],
        "rootProcessInstanceKey": None,
        "priority": row["priority"],
        "physicalTenantId": row["tenant_id"],
        "businessId": None,
        "jobLeaseToken": lease_token(row["job_key"], row["activation_count"]),
    }


@router.post("/activation")
async def activation(request: Request) -> Response:
    spec = await body(request, CamundaActivate)
    req = ActivateRequest(
        spec.type, spec.maxJobsToActivate, spec.timeout, spec.worker, spec.tenantIds or None
    )
    rows = await long_poll(request, req, spec.requestTimeout)
    return JSON({"jobs": [camunda_job(r, spec.fetchVariable) for r in rows]})


@router.post("/{key}/completion", status_code=204)
async def completion(request: Request, key: str) -> Response:
    k = job_key(key)
    spec = await optional_body(request, CamundaComplete)
    [variables] = payload(request, spec.variables)
    count = fence(k, None, spec.jobLeaseToken)
    await request.app.state.services.jobs.complete(k, count, variables)
    return Response(status_code=204)


@router.post("/{key}/failure", status_code=204)
async def failure(request: Request, key: str) -> Response:
    k = job_key(key)
    spec = await optional_body(request, CamundaFail)
    await fail(request, k, fence(k, None, spec.jobLeaseToken), spec)
    return Response(status_code=204)


# -- search and topology --------------------------------------------------------------

CAMUNDA_STATES = {
    "CREATED": ("CREATED", "SCHEDULED", "ACTIVATED"),
    "COMPLETED": ("COMPLETED",),
    "FAILED": ("FAILED",),
    "ERROR_THROWN": ("ERROR_THROWN",),
    "CANCELED": ("CANCELED",),
}
# Camunda states that no Jobfair job is ever in: a filter on them matches nothing.
NEVER = ("MIGRATED", "RETRIES_UPDATED", "TIMED_OUT", "TIMEOUT_UPDATED", "PRIORITY_UPDATED")
FilterValue = str | int | dict[str, Any]


class SearchFilter(schemas.Strict):
    jobKey: FilterValue | None = None
    type: FilterValue | None = None
    state: FilterValue | None = None
    tenantId: FilterValue | None = None
    worker: FilterValue | None = None
    retries: FilterValue | None = None


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
    limit: Annotated[int, Field(strict=True, ge=1, le=10_000)] = 100
    from_: Annotated[int, Field(strict=True, ge=0, alias="from")] = 0


class Search(schemas.Strict):
    filter: SearchFilter | None = None
    sort: list[SortField] | None = None
    page: Page | None = None


def _values(field: str, value: FilterValue) -> list[Any]:
    """A plain value, or Camunda's advanced filter {"$eq": v} / {"$in": [...]}."""
    if isinstance(value, dict):
        if set(value) == {"$eq"}:
            items = [value["$eq"]]
        elif set(value) == {"$in"} and isinstance(value["$in"], list):
            items = list(value["$in"])
        else:
            raise InvalidArgument(f"filter.{field}: supported operators are $eq and $in")
    else:
        items = [value]
    try:
        if field == "jobKey":
            return [job_key(str(v)) for v in items]
        if field == "retries":
            return [int(v) for v in items]
    except (TypeError, ValueError):
        raise InvalidArgument(f"filter.{field}: expected integers") from None
    if field == "state":
        out: list[Any] = []
        for v in items:
            if v in CAMUNDA_STATES:
                out.extend(CAMUNDA_STATES[v])
            elif v not in NEVER:
                raise InvalidArgument(f"filter.state: unknown job state {v!r}")
        return out
    return [str(v) for v in items]


def search_item(row: Any) -> dict[str, Any]:
    state = row["state"]
    camunda_state = "CREATED" if state in ("SCHEDULED", "ACTIVATED") else state
    times = [t for t in (row["created_at"], row["activated_at"], row["completed_at"]) if t]
    return {
        "jobKey": str(row["job_key"]),
        "type": row["job_type"],
        "worker": row["worker"] or "",
        "state": camunda_state,
        "kind": "BPMN_ELEMENT",
        "listenerEventType": "UNSPECIFIED",
        "retries": row["retries"],
        "isDenied": None,
        "deniedReason": None,
        "hasFailedWithRetriesLeft": row["error_message"] is not None
        and row["retries"] > 0
        and camunda_state == "CREATED",
        "errorCode": row["error_code"],
        "errorMessage": row["error_message"],
        "customHeaders": row["custom_headers"],
        "deadline": rfc3339(row["deadline"]),
        "endTime": rfc3339(row["completed_at"]),
        "processDefinitionId": PROCESS_DEFINITION_ID,
        "processDefinitionKey": NO_KEY,
        "processInstanceKey": NO_KEY,
        "rootProcessInstanceKey": None,
        "elementId": row["job_type"],
        "elementInstanceKey": NO_KEY,
        "tenantId": row["tenant_id"],
        "businessId": None,
        "creationTime": rfc3339(row["created_at"]),
        "lastUpdateTime": rfc3339(max(times)) if times else None,
        "priority": row["priority"],
    }


@router.post("/search")
async def search(request: Request) -> Response:
    spec = await optional_body(request, Search)
    filters: dict[str, list[Any]] = {}
    if spec.filter is not None:
        for field, value in spec.filter.model_dump(exclude_none=True).items():
            filters[field] = _values(field, value)
    sort = [(s.field, s.order.upper() == "DESC") for s in spec.sort or []]
    page = spec.page or Page()
    store = request.app.state.services.store
    rows, total, more = await store.search_jobs(filters, sort, page.limit, page.from_)
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


topology_router = APIRouter(tags=["camunda"])


@topology_router.get("/v2/topology")
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
