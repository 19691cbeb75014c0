"""A worker process that takes jobs and then stops working on them, run by
tests/chaos/test_killed_workers.py: ``python -m tests.chaos.zombie_worker URL TYPE
MAX_JOBS LEASE_MS``.

It activates up to ``MAX_JOBS`` jobs of ``TYPE`` (waiting for them), writes them to
stdout as one JSON line, and then "works" until a line arrives on stdin -- the test
kills it meanwhile (a worker that vanished), or lets it go on long after its lease
ended (a worker frozen by a pause: a stopped VM, a long GC).  Then it completes each job
with the activation it was given and writes one JSON line: each answer's status and
problem type.
"""

from __future__ import annotations

import json
import sys

import httpx


def main(url: str, job_type: str, max_jobs: int, lease_ms: int) -> None:
    with httpx.Client(base_url=url, timeout=30) as http:
        jobs: list[dict[str, object]] = []
        while not jobs:
            body = {
                "type": job_type,
                "maxJobs": max_jobs,
                "timeout": lease_ms,
                "requestTimeout": 5_000,
                "worker": "zombie",
            }
            r = http.post("/v2/jobs/activate", json=body)
            r.raise_for_status()
            jobs = r.json()["jobs"]
        print(json.dumps(jobs), flush=True)
        sys.stdin.readline()  # "working": until told to go on
        answers = []
        for job in jobs:
            r = http.post(
                f"/v2/jobs/{job['jobKey']}/complete",
                json={"activationCount": job["activationCount"]},
            )
            problem = r.json().get("type") if r.status_code >= 400 else None
            answers.append({"jobKey": job["jobKey"], "status": r.status_code, "type": problem})
        print(json.dumps(answers), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
