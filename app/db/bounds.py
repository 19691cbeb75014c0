"""The numbers and names the statements share with their Python twins.

A ``.sql`` file spells one of these as ``{{NAME}}`` (app.db.sql puts its value in at
load), so a bound the SQL and the Python both rely on -- how many lanes a small read
probes, how many activations a job's history keeps, an advisory lock's class -- is written
once.  A leaf: it imports only the pure scheduler and the lock keys (app.db.locks, a leaf
too).
"""

from __future__ import annotations

from app.db.locks import RELEASE_GATE_CLASS, TENANT_CAP_LOCK_CLASS
from app.scheduler import DEFAULT_LEASE_ESTIMATE_S, MIN_STRIDE, VTIME_RESOLUTION

# Reads of at most this many lanes probe each for a ready job, and so does the lead claim
# (claim_lead): small activations (long polls, streams), which an empty lane would cost a
# whole round.  A larger read (100 jobs over 108 lanes) takes every lane as ready: an
# empty one comes up short in the claim, is excluded and parked, and the call reads on.
# Probing every lane of a large read cost the 10,000-tenant drain a measurable share
# (ADR 014, with the figures) for rounds that eager parking makes rare.  Key reads follow
# the same rule, per lane (read_keys).
PROBED_LANES = 16
# A read scans at most this many lanes: past them, the next round reads on (the empty
# lanes met are excluded from it), so one statement's cost stays bounded even where
# thousands of lanes were emptied at once and not yet parked.
SCANNED_LANES = 1024

# The channel producers notify with "type n" when n jobs of a type became ready.
NOTIFY_CHANNEL = "jobfair"

# A job's history (app.db.history) keeps the rows of its first FIRST_ACTIVATIONS
# activations and of its latest LAST_ACTIVATIONS; each row has its step in its
# activation: END (how it ended), REVIVED (FAILED -> CREATED after it), CANCELED.
FIRST_ACTIVATIONS = 10
LAST_ACTIVATIONS = 20
END, REVIVED, CANCELED = 1, 2, 3
# The connection setting that turns history's writes off ("off"; anything else, or none,
# is on): set by the pool from JOBFAIR_JOB_HISTORY, so the statements stay the same and a
# connection without it (tests, tools) writes history.
HISTORY_SETTING = "jobfair.history"


def constants() -> dict[str, object]:
    """Every bound a .sql file may name, by name."""
    return {
        "PROBED_LANES": PROBED_LANES,
        "SCANNED_LANES": SCANNED_LANES,
        "NOTIFY_CHANNEL": NOTIFY_CHANNEL,
        "FIRST_ACTIVATIONS": FIRST_ACTIVATIONS,
        "LAST_ACTIVATIONS": LAST_ACTIVATIONS,
        "KEPT_ACTIVATIONS": FIRST_ACTIVATIONS + LAST_ACTIVATIONS,
        "END": END,
        "REVIVED": REVIVED,
        "CANCELED": CANCELED,
        "HISTORY_SETTING": HISTORY_SETTING,
        # repr: the shortest decimal that reads back as the same float8.
        "VTIME_RESOLUTION": repr(VTIME_RESOLUTION),
        "MIN_STRIDE": repr(MIN_STRIDE),
        "DEFAULT_LEASE_ESTIMATE_S": repr(DEFAULT_LEASE_ESTIMATE_S),
        # Advisory lock classes (app.db.locks): a tenant's cap lock, the release gate.
        "TENANT_CAP_LOCK_CLASS": TENANT_CAP_LOCK_CLASS,
        "RELEASE_GATE_CLASS": RELEASE_GATE_CLASS,
    }
