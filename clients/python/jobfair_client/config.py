"""Operators' configuration records (API.md "Operators"): a tenant's, a fairness key's
and a job type's.  A PUT sets the whole configuration: a field left at its default is
sent as that default (``None``: no cap, no minimum, no limit), so read, change and put
back (``dataclasses.replace``) to change one field alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

FairnessBy = Literal["activations", "workerTime", "cost"]


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A token bucket: ``per_second`` activations a second on average, ``burst`` at once."""

    per_second: float
    burst: float

    def to_json(self) -> dict[str, Any]:
        return {"perSecond": self.per_second, "burst": self.burst}

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> RateLimit | None:
        return None if d is None else cls(d["perSecond"], d["burst"])


def _rate(limit: RateLimit | None) -> dict[str, Any] | None:
    return None if limit is None else limit.to_json()


@dataclass(frozen=True, slots=True)
class TenantConfig:
    """A tenant's share (``weight``, 1-10,000), its cap on ACTIVATED jobs of every type,
    its guaranteed minimum of them (at most the cap) and its rate limit.  ``paused`` and
    ``configured`` are answered, never sent."""

    weight: int = 1
    max_active_jobs: int | None = None
    min_active_jobs: int | None = None
    rate_limit: RateLimit | None = None
    paused: bool = False
    configured: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "weight": self.weight,
            "maxActiveJobs": self.max_active_jobs,
            "minActiveJobs": self.min_active_jobs,
            "rateLimit": _rate(self.rate_limit),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TenantConfig:
        return cls(
            weight=d["weight"],
            max_active_jobs=d.get("maxActiveJobs"),
            min_active_jobs=d.get("minActiveJobs"),
            rate_limit=RateLimit.from_json(d.get("rateLimit")),
            paused=d.get("paused", False),
            configured=d.get("configured", True),
        )


@dataclass(frozen=True, slots=True)
class KeyConfig:
    """A fairness key's weight inside its tenant and its cap on ACTIVATED jobs of every
    type."""

    weight: int = 1
    max_active_jobs: int | None = None
    configured: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"weight": self.weight, "maxActiveJobs": self.max_active_jobs}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> KeyConfig:
        return cls(
            weight=d["weight"],
            max_active_jobs=d.get("maxActiveJobs"),
            configured=d.get("configured", True),
        )


@dataclass(frozen=True, slots=True)
class JobTypeConfig:
    """A job type's cap, aging (``None``: the server's defaults), rate limit, what its
    lanes are charged by, its cap per fairness key, and ``key_ordering="fifo"`` for each
    key's jobs one at a time in creation order.  ``paused`` and ``configured`` are
    answered, never sent."""

    max_active_jobs: int | None = None
    aging_interval_ms: int | None = None
    aging_step: int | None = None
    rate_limit: RateLimit | None = None
    fairness_by: FairnessBy | None = None
    max_active_per_key: int | None = None
    key_ordering: Literal["fifo"] | None = None
    paused: bool = False
    configured: bool = False

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "maxActiveJobs": self.max_active_jobs,
            "rateLimit": _rate(self.rate_limit),
            "maxActivePerKey": self.max_active_per_key,
            "keyOrdering": self.key_ordering,
        }
        optional = {
            "agingIntervalMs": self.aging_interval_ms,
            "agingStep": self.aging_step,
            "fairnessBy": self.fairness_by,
        }
        body.update({k: v for k, v in optional.items() if v is not None})
        return body

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> JobTypeConfig:
        return cls(
            max_active_jobs=d.get("maxActiveJobs"),
            aging_interval_ms=d.get("agingIntervalMs"),
            aging_step=d.get("agingStep"),
            rate_limit=RateLimit.from_json(d.get("rateLimit")),
            fairness_by=d.get("fairnessBy"),
            max_active_per_key=d.get("maxActivePerKey"),
            key_ordering=d.get("keyOrdering"),
            paused=d.get("paused", False),
            configured=d.get("configured", True),
        )
