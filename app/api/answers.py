"""The shapes of the answers, for the OpenAPI document only: the routes build them as
dicts (``app.api.problems.JSON``), and ``app.api.routes`` names them per operation."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


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
        "UNAUTHENTICATED",
        "FORBIDDEN",
        "TOO_MANY_REQUESTS",
    ]
    status: int
    detail: str
    instance: str


class Job(BaseModel):
    jobKey: str = Field(description="int64 as a decimal string")
    type: str
    tenantId: str
    fairnessKey: str = Field(
        description="its fairness key inside its tenant; <default> when sent without one"
    )
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
    completedAt: str | None = Field(description="when it was COMPLETED (null otherwise)")
    finishedAt: str | None = Field(
        description="when it reached a final state: COMPLETED, FAILED, ERROR_THROWN, CANCELED"
    )
    idempotencyKey: str | None
    cost: float = Field(
        description="what it declares it costs (1 unless sent); charged to its lane where "
        "its type is fair by cost"
    )


class Jobs(BaseModel):
    jobs: list[Job]


class JobPage(BaseModel):
    items: list[Job] = Field(description="newest first (job key descending)")
    nextCursor: str | None = Field(
        description="pass as cursor for the next page; null: this page is the last"
    )


class HistoryEntry(BaseModel):
    at: str = Field(description="RFC 3339, UTC")
    event: Literal[
        "created",
        "activated",
        "completed",
        "failed",
        "retried",
        "error-thrown",
        "lease-expired",
        "released",
        "revived",
        "canceled",
    ]
    activationCount: int = Field(description="the activation the entry belongs to (0: none yet)")
    worker: str | None = Field(description="the activation's worker, as it named itself")
    deadline: str | None = Field(description="activated: the lease's end")
    errorCode: str | None
    errorMessage: str | None
    retries: int | None = Field(description="attempts left after the event (null: created)")


class JobHistory(BaseModel):
    items: list[HistoryEntry] = Field(description="oldest first")
    truncated: bool = Field(
        description="some activations between the first and the latest were dropped "
        "(a job keeps its first 10 and latest 20)"
    )


class JobExplanation(BaseModel):
    """Why a job is not running now (docs/api.md, GET /v2/jobs/{jobKey}/explain)."""

    jobKey: str
    type: str
    tenantId: str
    fairnessKey: str
    state: str
    at: str = Field(description="the instant explained")
    activatableNow: bool = Field(description="ready, and nothing holds its lane back")
    nextInLane: bool = Field(description="the next activation of its lane takes it")
    reasons: list[dict[str, Any]] = Field(description="each with its figures; empty: none")
    estimatedStartAt: str | None = Field(
        description="an estimate, from its lane's service rate in the stats window"
    )
    priority: dict[str, Any] | None = None
    queue: dict[str, Any] | None = None
    lane: dict[str, Any] | None = None
    demand: dict[str, Any] | None = None


class BulkResult(BaseModel):
    count: int = Field(description="jobs changed")
    more: bool = Field(description="jobs matching remain beyond the limit: call again")


class WorkerSeen(BaseModel):
    type: str
    worker: str
    lastSeenAt: str = Field(description="its latest activation request or stream")
    lastActivatedAt: str | None = Field(description="the latest that got jobs")


class Workers(BaseModel):
    items: list[WorkerSeen]


class JobKeys(BaseModel):
    jobKeys: list[str]


class CompleteResult(BaseModel):
    jobKey: str
    status: Literal[204, 404, 409]


class CompleteResults(BaseModel):
    results: list[CompleteResult]


class Caller(BaseModel):
    keyId: str | None = Field(description="null when auth is off (loopback only)")
    role: Literal["admin", "producer", "worker"]
    tenants: Literal["*"] | list[str]
    types: Literal["*"] | list[str]
    auth: Literal["on", "off"]


class RateLimitShown(BaseModel):
    perSecond: float
    burst: float
    tokens: float = Field(
        description="the activations the bucket allows now (whole tokens are taken), as read"
    )


class Tenant(BaseModel):
    tenantId: str
    weight: int
    maxActiveJobs: int | None
    minActiveJobs: int | None = Field(
        None,
        description="its guaranteed minimum: while it has fewer ACTIVATED jobs, its ready "
        "jobs are served before the weighted share; null: none",
    )
    rateLimit: RateLimitShown | None = Field(description="null: no rate limit")
    paused: bool
    configured: bool = Field(description="false: never configured (the defaults answered)")


class FairnessKey(BaseModel):
    tenantId: str
    fairnessKey: str
    weight: int = Field(description="its share of its tenant's, against its tenant's other keys")
    maxActiveJobs: int | None = Field(
        None, description="its ACTIVATED jobs of every type at most; null: no cap"
    )
    configured: bool = Field(description="false: no weight of its own (it weighs 1)")


class Tenants(BaseModel):
    tenants: list[Tenant]


class JobTypeConfig(BaseModel):
    type: str
    maxActiveJobs: int | None
    agingIntervalMs: int
    agingStep: int
    rateLimit: RateLimitShown | None = Field(description="null: no rate limit")
    fairnessBy: Literal["activations", "workerTime", "cost"] = Field(
        description="what its lanes are charged by: one per activation, the jobs' cost, or "
        "the seconds their leases were held"
    )
    maxActivePerKey: int | None = Field(
        None, description="every fairness key's ACTIVATED jobs of the type at most; null: no cap"
    )
    keyOrdering: Literal["fifo"] | None = Field(
        None,
        description="fifo: each fairness key's jobs activated one at a time, in creation "
        "order; null: by priority",
    )
    paused: bool
    configured: bool = Field(description="false: never configured (the defaults answered)")


class JobTypes(BaseModel):
    jobTypes: list[JobTypeConfig]


class KeyStats(BaseModel):
    fairnessKey: str = Field(description="<other>: the keys not listed, folded")
    activatedLastMinute: int
    realizedShare: float = Field(description="of its tenant's activations of the type")
    entitledShare: float = Field(
        description="what its weight entitled it to of them, among its tenant's keys "
        "backlogged then"
    )
    weight: int
    vtimeLag: float | None = Field(
        description="its virtual time minus the least of its tenant's backlogged keys "
        "(0: served next inside its lane); null when not backlogged"
    )
    maxActiveJobs: int | None = Field(description="its own cap, over every type; null: none")
    maxActivePerKey: int | None = Field(description="its type's cap per key; null: none")
    held: bool = Field(description="at one of its caps now: out of the claims until a job ends")
    active: int | None = Field(description="its ACTIVATED jobs of the type, where a cap applies")
    head: str | None = Field(
        None,
        description="in a FIFO type (keyOrdering fifo): the key's head, the one job it "
        "may have out; null: none, or not FIFO",
    )
    headState: str | None = Field(
        None, description="the head's state: CREATED (ready, or backing off), ACTIVATED or FAILED"
    )
    activeAllTypes: int | None = Field(
        description="its ACTIVATED jobs of every type, where it has a cap of its own"
    )


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
    realizedShare: float = Field(
        description="of the type's activations in the window; of its cost or worker time "
        "where the type is fair by them (fairnessBy)"
    )
    configuredShare: float = Field(
        description="entitled now: its weight over the weights of the type's lanes with "
        "ready jobs now (paused tenants left out)"
    )
    entitledShare: float = Field(
        description="what its weight entitled it to of the type's activations in the window, "
        "among the lanes backlogged then, a lane held back or out of jobs entitled to what "
        "it took (docs/metrics.md)"
    )
    weight: int = Field(description="its tenant's weight")
    minActiveJobs: int | None = Field(
        None, description="its tenant's guaranteed minimum; null: none"
    )
    tenantActive: int | None = Field(
        None,
        description="its tenant's ACTIVATED jobs of every type, where a cap or a minimum "
        "counts them (below minActiveJobs: served before the weighted share)",
    )
    heldBy: list[dict[str, Any]] = Field(
        description="what holds its ready jobs back now, each {reason, active and limit "
        "(a cap) or nextTokenInMs (a rate limit)}; reasons tenantPaused, typePaused, "
        "tenantCap, typeCap, tenantRate, typeRate"
    )
    heldInWindow: dict[str, float] = Field(
        description="per reason, the fraction of the window it held the lane's ready jobs"
    )
    vtimeLag: float | None = Field(
        description="its virtual time minus the smallest of its type's backlogged lanes "
        "not held at a cap; null when not backlogged"
    )
    paused: bool = Field(description="the tenant is paused")
    keys: list[KeyStats] = Field(
        description="its most active fairness keys in the window (JOBFAIR_METRICS_TOP_KEYS), "
        "then <other>: every other key, folded"
    )


class TypeStats(BaseModel):
    type: str
    pending: int
    ready: int
    delayed: int
    active: int
    oldestPendingAgeMs: int | None
    oldestReadyJobKey: str | None
    paused: bool = Field(description="the job type is paused")
    activatedPerMinute: list[int | None] | None = Field(
        description="activations of each of the last 15 minutes, oldest first (null: a "
        "minute before this server process started); null for a key scoped to some "
        "tenants or types"
    )
    noActivationForMs: int | None = Field(
        description="how long no activation of the type was seen (null: one was, in the "
        "latest sampling interval)"
    )
    noActivationSinceStart: bool = Field(
        description="none was seen since this server process first saw the type: the "
        "figure is a lower bound"
    )
    tenants: list[TenantStats]


class Stats(BaseModel):
    jobTypes: list[TypeStats]
    windowMs: int = Field(description="the span the share window covers now")


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


class Key(BaseModel):
    keyId: str
    role: Literal["admin", "producer", "worker"]
    tenants: Literal["*"] | list[str]
    types: Literal["*"] | list[str]
    name: str | None
    expiresAt: str | None
    createdAt: str
    createdBy: str | None = Field(description="the key id that made it; null: the CLI")
    lastUsedAt: str | None = Field(description="updated at most once a minute per server")
    revokedAt: str | None


class NewKey(Key):
    secret: str = Field(
        description="the whole token, shown this once: a Bearer token, the Basic password "
        "(user: keyId), or the OAuth client secret (client id: keyId)"
    )


class Keys(BaseModel):
    keys: list[Key]


class AccessToken(BaseModel):
    access_token: str
    token_type: Literal["Bearer"]
    expires_in: int = Field(description="seconds")


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
