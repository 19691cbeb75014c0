"""Run by tests/acceptance/test_camunda_sdk.py inside one of the Camunda SDK's own
virtualenvs (the 9.x or the 10.x line of camunda-orchestration-sdk).

Drives Camunda's Python SDK against the Jobfair whose address is in CAMUNDA_REST_ADDRESS
and prints one JSON line of what it saw.  ``flow`` exercises the client's job calls one by
one; ``worker`` drains jobs with the SDK's own job worker and reports the order in which
its handler saw the tenants; ``auth`` (tests/acceptance/test_camunda_sdk_auth.py) takes
and completes jobs with the credentials the environment configures (CAMUNDA_AUTH_STRATEGY
BASIC or OAUTH; with tenantFilter ASSIGNED if asked), then asks for a tenant outside the
key's scope.  The SDK validates every
response strictly, so getting through any mode is itself part of the proof.
"""

import asyncio
import json
import sys

import attrs
import camunda_orchestration_sdk as sdk
from camunda_orchestration_sdk import CamundaAsyncClient, CamundaClient, WorkerConfig

# The 10.x line knows job leases (jobLeaseToken); the 9.x line predates them.
LEASES = any(f.name == "with_lease" for f in attrs.fields(sdk.JobActivationRequest))


def activate(client, job_type, n, timeout=30_000, request_timeout=-1, **tenants):
    extra = {"with_lease": True, **tenants} if LEASES else tenants
    return client.activate_jobs(
        data=sdk.JobActivationRequest(
            type_=job_type,
            timeout=timeout,
            max_jobs_to_activate=n,
            request_timeout=request_timeout,
            **extra,
        )
    ).jobs


def outcome(call, status=False):
    """The SDK's own name for how a call ended (with the HTTP status, if ``status``)."""
    try:
        call()
    except sdk.errors.ApiError as exc:
        return f"{type(exc).__name__} {exc.status_code}" if status else type(exc).__name__
    return "ok"


def flow():
    client = CamundaClient()
    seen = {"leases": LEASES}
    seen["clusterSize"] = client.get_topology().cluster_size

    jobs = activate(client, "sdk", 4)
    seen["activated"] = [j.job_key for j in jobs]
    seen["firstVariables"] = jobs[0].variables.to_dict()
    paid, declined, no_stock, slow = jobs
    client.complete_job(paid.job_key, data=sdk.JobCompletionRequest(variables={"paid": True}))
    client.fail_job(
        declined.job_key,
        data=sdk.JobFailRequest(retries=2, error_message="card declined", retry_back_off=60_000),
    )
    client.throw_job_error(
        no_stock.job_key,
        data=sdk.JobErrorRequest(error_code="NO_STOCK", error_message="none left"),
    )
    client.update_job(
        slow.job_key,
        data=sdk.JobUpdateRequest(changeset=sdk.JobChangeset(retries=7, timeout=600_000)),
    )
    # Finishing a job twice: the conflict error the SDK knows.
    seen["completeAgain"] = outcome(lambda: client.complete_job(paid.job_key))
    seen["errorAgain"] = outcome(
        lambda: client.throw_job_error(no_stock.job_key, data=sdk.JobErrorRequest(error_code="X"))
    )
    seen["missing"] = outcome(lambda: client.complete_job("4242"))

    if LEASES:
        # A stale worker: its lease ran out (1 ms) and the job went to someone else, whose
        # long poll the lease sweep wakes.  The first worker's token is now refused.
        [first] = activate(client, "lease", 1, timeout=1)
        [second] = activate(client, "lease", 1, request_timeout=10_000)
        assert second.job_key == first.job_key
        seen["staleComplete"] = outcome(
            lambda: client.complete_job(
                first.job_key, data=sdk.JobCompletionRequest(job_lease_token=first.job_lease_token)
            )
        )
        seen["currentComplete"] = outcome(
            lambda: client.complete_job(
                second.job_key,
                data=sdk.JobCompletionRequest(job_lease_token=second.job_lease_token),
            )
        )

    result = client.search_jobs(data=sdk.JobSearchQuery(filter_=sdk.JobFilter(type_="sdk")))
    seen["search"] = sorted((i.job_key, i.state.value, i.retries) for i in result.items)
    print(json.dumps(seen))


def auth(job_type, outside, assigned=False):
    """Activate and complete every job of ``job_type`` the key may see, as the SDK
    authenticates from the environment (with tenantFilter ASSIGNED if ``assigned``);
    then activate naming tenant ``outside``."""
    client = CamundaClient()
    seen = {"strategy": client.configuration.CAMUNDA_AUTH_STRATEGY}
    tenants = {"tenant_filter": sdk.JobActivationRequestTenantFilter.ASSIGNED} if assigned else {}
    jobs = activate(client, job_type, 10, **tenants)
    seen["activated"] = sorted([j.job_key, j.tenant_id] for j in jobs)
    seen["completed"] = [
        outcome(lambda j=j: client.complete_job(j.job_key, data=sdk.JobCompletionRequest()))
        for j in jobs
    ]
    seen["outside"] = outcome(
        lambda: activate(client, job_type, 10, tenant_ids=[outside]), status=True
    )
    # What the SDK put on its requests: "Basic ...", or "Bearer <the token it fetched>".
    scheme, _, credentials = client.auth_provider.get_headers()["Authorization"].partition(" ")
    seen["scheme"] = scheme
    seen["accessToken"] = credentials if scheme == "Bearer" else None
    client.close()
    print(json.dumps(seen))


async def worker(job_type, total, concurrency):
    """Camunda's job worker draining ``total`` jobs; prints the tenants in handling order."""
    order = []
    drained = asyncio.Event()

    async def handler(job):
        order.append(job.tenant_id)
        if len(order) >= total:
            drained.set()
        return {"handledBy": "camunda-sdk"}

    extra = {"with_lease": True} if LEASES else {}
    async with CamundaAsyncClient() as client:
        client.create_job_worker(
            config=WorkerConfig(
                job_type=job_type,
                job_timeout_milliseconds=60_000,
                request_timeout_milliseconds=5_000,
                max_concurrent_jobs=concurrency,
                **extra,
            ),
            callback=handler,
            execution_strategy="async",
        )
        running = asyncio.create_task(client.run_workers())
        await asyncio.wait_for(drained.wait(), timeout=120)
        # Let the last completions go out before the workers stop.
        for _ in range(200):
            left = await client.search_jobs(
                data=sdk.JobSearchQuery(
                    filter_=sdk.JobFilter(type_=job_type, state=sdk.JobStateExactMatch.CREATED)
                )
            )
            if left.page.total_items == 0:
                break
            await asyncio.sleep(0.05)
        running.cancel()  # run_workers stops its workers when cancelled
        await asyncio.gather(running, return_exceptions=True)
    print(json.dumps({"order": order}))


if __name__ == "__main__":
    if sys.argv[1] == "flow":
        flow()
    elif sys.argv[1] == "auth":
        auth(sys.argv[2], sys.argv[3], assigned=sys.argv[4:] == ["assigned"])
    else:
        asyncio.run(worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
