"""Typed job records (API.md "Job record") and the values a handler can return."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


def _instant(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value.replace("Z", "+00:00"))


@dataclass(frozen=True, slots=True)
class Job:
    key: str
    type: str
    tenant_id: str
    state: str
    priority: int
    effective_priority: int
    retries: int
    activation_count: int
    worker: str | None
    deadline: datetime | None
    run_at: datetime | None
    variables: dict[str, Any]
    custom_headers: dict[str, Any]
    error_code: str | None
    error_message: str | None
    created_at: datetime | None
    activated_at: datetime | None
    completed_at: datetime | None
    idempotency_key: str | None
    # Its fairness key inside its tenant ("<default>" when created without one).
    fairness_key: str = "<default>"
    # What it declares it costs (1 unless sent): charged to its lane where its type is
    # fair by cost.
    cost: float = 1.0
    # When it reached a final state (COMPLETED, FAILED, ERROR_THROWN, CANCELED);
    # ``completed_at`` is set only when it COMPLETED.  None from servers before it.
    finished_at: datetime | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Job:
        return cls(
            key=d["jobKey"],
            type=d["type"],
            tenant_id=d["tenantId"],
            state=d["state"],
            priority=d["priority"],
            effective_priority=d["effectivePriority"],
            retries=d["retries"],
            activation_count=d["activationCount"],
            worker=d.get("worker"),
            deadline=_instant(d.get("deadline")),
            run_at=_instant(d.get("runAt")),
            variables=d.get("variables") or {},
            custom_headers=d.get("customHeaders") or {},
            error_code=d.get("errorCode"),
            error_message=d.get("errorMessage"),
            created_at=_instant(d.get("createdAt")),
            activated_at=_instant(d.get("activatedAt")),
            completed_at=_instant(d.get("completedAt")),
            idempotency_key=d.get("idempotencyKey"),
            fairness_key=d.get("fairnessKey", "<default>"),
            cost=d.get("cost", 1.0),
            finished_at=_instant(d.get("finishedAt")),
        )


@dataclass(frozen=True, slots=True)
class NewJob:
    """A job to create (``create_jobs``)."""

    type: str
    tenant_id: str | None = None
    priority: int | None = None
    retries: int | None = None
    variables: dict[str, Any] = field(default_factory=dict)
    custom_headers: dict[str, Any] = field(default_factory=dict)
    run_at: datetime | None = None
    delay_ms: int | None = None
    idempotency_key: str | None = None
    # Divides the tenant's share among its keys (an end user, a project).
    fairness_key: str | None = None
    # What it costs, where its type is fair by cost (a positive number; None: 1).
    cost: float | None = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"type": self.type}
        optional = {
            "tenantId": self.tenant_id,
            "priority": self.priority,
            "retries": self.retries,
            "variables": self.variables or None,
            "customHeaders": self.custom_headers or None,
            "runAt": None if self.run_at is None else self.run_at.isoformat(),
            "delay": self.delay_ms,
            "idempotencyKey": self.idempotency_key,
            "fairnessKey": self.fairness_key,
            "cost": self.cost,
        }
        body.update({k: v for k, v in optional.items() if v is not None})
        return body


class BusinessError(Exception):
    """Return (or raise) this from a handler to throw a job error: the job ends
    ERROR_THROWN with ``code``, without retries."""

    def __init__(
        self, code: str, message: str | None = None, variables: dict[str, Any] | None = None
    ) -> None:
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.message = message
        self.variables = variables
