"""Run by tests/acceptance/test_camunda_sdk.py inside the Camunda SDK's own virtualenv.

Drives Camunda's Python SDK (camunda-orchestration-sdk) against the Jobfair whose
address is in CAMUNDA_REST_ADDRESS, and prints one JSON line of what it saw.
"""

import json

import camunda_orchestration_sdk as sdk
from camunda_orchestration_sdk import CamundaClient

client = CamundaClient()
seen = {}
topology = client.get_topology()
seen["clusterSize"] = topology.cluster_size
jobs = client.activate_jobs(
    data=sdk.JobActivationRequest(
        type_="sdk", timeout=30000, max_jobs_to_activate=3, request_timeout=-1
    )
).jobs
seen["activated"] = [j.job_key for j in jobs]
seen["firstVariables"] = jobs[0].variables.to_dict()
first, second, third = jobs
client.complete_job(first.job_key, data=sdk.JobCompletionRequest(variables={"paid": True}))
client.fail_job(
    second.job_key,
    data=sdk.JobFailRequest(retries=2, error_message="card declined", retry_back_off=60000),
)
try:
    client.complete_job(first.job_key)
    seen["secondComplete"] = "accepted"
except sdk.errors.ConflictError:
    seen["secondComplete"] = "ConflictError"
result = client.search_jobs(data=sdk.JobSearchQuery(filter_=sdk.JobFilter(type_="sdk")))
seen["search"] = sorted((i.job_key, i.state.value, i.retries) for i in result.items)
seen["third"] = third.job_key
print(json.dumps(seen))
