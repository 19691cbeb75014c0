"""What holds a lane back (the stats' held-by, a job's explanation)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from app.scheduler.stride import Bucket


class HoldReason(StrEnum):
    """Why a lane with ready jobs gets none now, in the order the claim applies them."""

    TENANT_PAUSED = "tenantPaused"
    TYPE_PAUSED = "typePaused"
    TENANT_CAP = "tenantCap"
    TYPE_CAP = "typeCap"
    TENANT_RATE = "tenantRate"
    TYPE_RATE = "typeRate"
    # The job's fairness key at its own cap, or at its type's per-key cap (ADR 040): a
    # hold of the key, not of the lane.
    KEY_CAP = "keyCap"
    PER_KEY_CAP = "perKeyCap"


# The reasons that hold a lane back (a key's caps hold one key of it, not the lane).
LANE_REASONS = tuple(r for r in HoldReason if r not in (HoldReason.KEY_CAP, HoldReason.PER_KEY_CAP))


@dataclass(frozen=True, slots=True)
class Hold:
    """One thing that holds a lane back: a pause, a cap (its active jobs counted up to
    its ``limit``) or a rate limit (its bucket empty; the next token ``next_token_s``
    from now)."""

    reason: HoldReason
    active: int | None = None
    limit: int | None = None
    next_token_s: float | None = None


@dataclass(frozen=True, slots=True)
class LaneLimits:
    """What the claim checks of a lane before taking from it: its tenant's and its type's
    pause, cap (with the active jobs it counts against) and rate bucket."""

    tenant_paused: bool = False
    type_paused: bool = False
    tenant_cap: int | None = None
    tenant_active: int = 0
    type_cap: int | None = None
    type_active: int = 0
    tenant_bucket: Bucket | None = None
    type_bucket: Bucket | None = None


def holds(limits: LaneLimits, now: datetime) -> list[Hold]:
    """Everything that stops the claim from taking a job of the lane at ``now``, in the
    order it checks them (empty: nothing does; the lane waits its turn)."""
    out = []
    if limits.tenant_paused:
        out.append(Hold(HoldReason.TENANT_PAUSED))
    if limits.type_paused:
        out.append(Hold(HoldReason.TYPE_PAUSED))
    if limits.tenant_cap is not None and limits.tenant_active >= limits.tenant_cap:
        out.append(Hold(HoldReason.TENANT_CAP, limits.tenant_active, limits.tenant_cap))
    if limits.type_cap is not None and limits.type_active >= limits.type_cap:
        out.append(Hold(HoldReason.TYPE_CAP, limits.type_active, limits.type_cap))
    for reason, bucket in (
        (HoldReason.TENANT_RATE, limits.tenant_bucket),
        (HoldReason.TYPE_RATE, limits.type_bucket),
    ):
        if bucket is not None and bucket.room(now) < 1:
            out.append(Hold(reason, next_token_s=bucket.next_token_s(now)))
    return out


def key_holds(cap: int | None, active: int, per_key: int | None, type_active: int) -> list[Hold]:
    """What holds a fairness key back (ADR 040): its own cap, with its ACTIVATED jobs of
    every type, and its type's per-key cap, with its ACTIVATED jobs of the type."""
    out = []
    if cap is not None and active >= cap:
        out.append(Hold(HoldReason.KEY_CAP, active, cap))
    if per_key is not None and type_active >= per_key:
        out.append(Hold(HoldReason.PER_KEY_CAP, type_active, per_key))
    return out
