"""The numbers and names the statements share with their Python twins.

A ``.sql`` file spells one of these as ``{{NAME}}`` (app.db.sql puts its value in at
load), so a bound the SQL and the Python both rely on -- how many lanes a small read
probes, how many activations a job's history keeps -- is written once.  A leaf: it
imports only the pure scheduler and the row shapes.  It names the bounds' values; the
modules that own them (app.db.listen, app.db.locks, app.db.history) import them back.
"""

from __future__ import annotations

from app.db.rows import JOB_COLUMNS, job_columns
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
# The channel the statements that end activations notify with the keys of stream-activated
# jobs, each a credit back to its stream (app.db.listen).
DONE_CHANNEL = "jobfair_done"
# PostgreSQL refuses a NOTIFY payload of 8,000 bytes or more ("payload string too long"),
# failing the statement that sends it; every payload here is bounded below that.
NOTIFY_PAYLOAD_MAX_BYTES = 7999
# Job keys per ``jobfair_done`` payload: a key (a positive bigint) is at most 19 digits,
# and a comma follows it.
CREDIT_KEYS_PER_NOTIFY = NOTIFY_PAYLOAD_MAX_BYTES // 20

# Advisory lock classes the statements name (app.db.locks has them all, and the protocols):
# the tenants' cap locks, and the release gate (key 0) between finishes and tenant
# configuration changes (jobfair_release_holds, alembic 0004).
TENANT_CAP_LOCK_CLASS = 0x4A460003
RELEASE_GATE_CLASS = 0x4A460004
# The fairness keys' cap locks (alembic 0016: jobfair_lock_key_caps).
KEY_CAP_LOCK_CLASS = 0x4A460006
# A job type's per-key configuration (key hashtext(type)): shared by the claims that count
# keys, exclusive by a change of the type's maxActivePerKey (alembic 0016).
TYPE_KEYS_LOCK_CLASS = 0x4A460007

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


# The job-key sequence's last value (app.db.schema.job_key_seq: a key, n << 11 with its
# shard, stays below 2**63).
JOB_KEY_MAX = (1 << 52) - 1
# After a restore (`jobfair restored`): how far job keys and unfinished jobs'
# activationCounts move on past what the backup knew (docs/backup.md).  Keys: 2**40, more
# than a cluster creating 30,000 jobs a second makes in a year between a backup and its
# loss; the sequence (2**51 keys) has room for 2,000 restores.  Counts: more activations
# than one job gets between a backup and the cluster's loss.
RESTORE_KEY_GAP = 1 << 40
RESTORE_COUNT_GAP = 1000


def constants() -> dict[str, object]:
    """Every bound a .sql file may name, by name."""
    return {
        "PROBED_LANES": PROBED_LANES,
        "JOB_KEY_MAX": JOB_KEY_MAX,
        "SCANNED_LANES": SCANNED_LANES,
        "NOTIFY_CHANNEL": NOTIFY_CHANNEL,
        "DONE_CHANNEL": DONE_CHANNEL,
        "CREDIT_KEYS_PER_NOTIFY": CREDIT_KEYS_PER_NOTIFY,
        "TENANT_CAP_LOCK_CLASS": TENANT_CAP_LOCK_CLASS,
        "RELEASE_GATE_CLASS": RELEASE_GATE_CLASS,
        "KEY_CAP_LOCK_CLASS": KEY_CAP_LOCK_CLASS,
        "TYPE_KEYS_LOCK_CLASS": TYPE_KEYS_LOCK_CLASS,
        "FIRST_ACTIVATIONS": FIRST_ACTIVATIONS,
        "LAST_ACTIVATIONS": LAST_ACTIVATIONS,
        "KEPT_ACTIVATIONS": FIRST_ACTIVATIONS + LAST_ACTIVATIONS,
        "END": END,
        "REVIVED": REVIVED,
        "CANCELED": CANCELED,
        "HISTORY_SETTING": HISTORY_SETTING,
        # The columns a job record is built from, in JobRow's order (app.db.rows), bare
        # and of the table aliased j.
        "JOB_COLUMNS": JOB_COLUMNS,
        "J_JOB_COLUMNS": job_columns("j"),
        # repr: the shortest decimal that reads back as the same float8.
        "VTIME_RESOLUTION": repr(VTIME_RESOLUTION),
        "MIN_STRIDE": repr(MIN_STRIDE),
        "DEFAULT_LEASE_ESTIMATE_S": repr(DEFAULT_LEASE_ESTIMATE_S),
    }
