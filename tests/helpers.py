"""Small HTTP helpers shared by the acceptance tests (API.md shapes, asserted)."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import httpx


async def enqueue(
    client: httpx.AsyncClient, job_type: str, tenant: str, n: int, **fields: Any
) -> list[str]:
    keys: list[str] = []
    for start in range(0, n, 10_000):
        count = min(10_000, n - start)
        jobs = [{"type": job_type, "tenantId": tenant, **fields} for _ in range(count)]
        r = await client.post("/v2/jobs/batch", json={"jobs": jobs})
        assert r.status_code == 201, r.text
        keys.extend(r.json()["jobKeys"])
    return keys


async def activate(
    client: httpx.AsyncClient,
    job_type: str,
    max_jobs: int = 1,
    lease_ms: int = 60_000,
    **fields: Any,
) -> list[dict[str, Any]]:
    body = {
        "type": job_type,
        "maxJobs": max_jobs,
        "timeout": lease_ms,
        "requestTimeout": -1,
        **fields,
    }
    r = await client.post("/v2/jobs/activate", json=body)
    assert r.status_code == 200, r.text
    jobs: list[dict[str, Any]] = r.json()["jobs"]
    return jobs


async def complete(client: httpx.AsyncClient, job: dict[str, Any], **fields: Any) -> httpx.Response:
    return await client.post(
        f"/v2/jobs/{job['jobKey']}/complete",
        json={"activationCount": job["activationCount"], **fields},
    )


def tenants_of(jobs: list[dict[str, Any]]) -> Counter[str]:
    return Counter(j["tenantId"] for j in jobs)


def assert_problem(r: httpx.Response, status: int, title: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json"), r.headers
    body: dict[str, Any] = r.json()
    assert body["status"] == status
    assert body["type"].startswith("urn:jobfair:")
    assert body["detail"]
    if title is not None:
        assert body["title"] == title
    return body


async def backdate(db: Any, job_keys: list[int], by: timedelta, *columns: str) -> None:
    """Move the jobs' ``columns`` (created_at if none) back by ``by``: each job read, then
    written with the new values, its shard named.  On Citus an UPDATE may not compute a
    column from a column with a STABLE function (timestamptz minus an interval is one),
    and a row is found there by its distribution column (make citus)."""
    names = columns or ("created_at",)
    for key in job_keys:
        where = "job_key = $1 AND shard = ($1::bigint & 2047)::int2"
        row = await db.fetchrow(f"SELECT {', '.join(names)} FROM jobs WHERE {where}", key)
        sets = ", ".join(f"{c} = ${i + 2}" for i, c in enumerate(names))
        await db.execute(
            f"UPDATE jobs SET {sets} WHERE {where}", key, *(row[c] - by for c in names)
        )
