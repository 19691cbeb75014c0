"""Every NOTIFY payload is bounded below PostgreSQL's 8,000 bytes (issue 20 §1)."""

from __future__ import annotations

from app.db.listen import CREDIT_KEYS_PER_NOTIFY, NOTIFY_PAYLOAD_MAX_BYTES
from app.domain import JOB_TYPE_RE

BIGGEST_KEY = 2**63 - 1


def test_a_full_credit_payload_of_the_largest_keys_fits():
    payload = ",".join([str(BIGGEST_KEY)] * CREDIT_KEYS_PER_NOTIFY)
    assert len(payload.encode()) <= NOTIFY_PAYLOAD_MAX_BYTES


def test_a_ready_payload_of_the_longest_job_type_fits():
    longest = "a" * 128
    assert JOB_TYPE_RE.fullmatch(longest) and not JOB_TYPE_RE.fullmatch(longest + "a")
    # Only ASCII is a job type, so characters are bytes.
    assert not JOB_TYPE_RE.fullmatch("é")
    assert len(f"{longest} {BIGGEST_KEY}".encode()) <= NOTIFY_PAYLOAD_MAX_BYTES
