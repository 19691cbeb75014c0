# ruff: noqa: E501 - the tables of cases read best one case to a line
"""Every value is stored faithfully or refused with a 400 that names it (API.md, Limits).

Each case below was a 500 (or a silently changed value) once: a NUL that PostgreSQL cannot
store, an integer beyond what orjson or an int4 column holds, an instant that overflows
when moved to UTC, a Unicode digit read as an ASCII one, NaN stored as null.  Each must
answer 400 problem+json naming the field, and change nothing."""

from __future__ import annotations

import base64
import json
from decimal import Decimal

import pytest

from tests.helpers import activate, assert_problem

NUL = "\\u0000"  # spelled as JSON spells it: the bodies below are raw JSON text


def _raw(text: str) -> bytes:
    return text.encode()


# (method, path, raw JSON body, the field the detail must name).  {k} is an ACTIVATED
# job's key at activation 1; {t} a lease token of it.
CASES: dict[str, tuple[str, str, str, str]] = {
    # -- NUL, anywhere a string reaches the database --
    "NUL in a variable": ("POST", "/v2/jobs", f'{{"type": "t", "variables": {{"a": "{NUL}"}}}}', "variables.a"),
    "NUL in a variable's key": ("POST", "/v2/jobs", f'{{"type": "t", "variables": {{"a{NUL}": 1}}}}', "variables"),
    "NUL deep in variables": ("POST", "/v2/jobs", f'{{"type": "t", "variables": {{"a": [1, {{"b": "{NUL}"}}]}}}}', "variables.a.1.b"),
    "NUL in customHeaders": ("POST", "/v2/jobs", f'{{"type": "t", "customHeaders": {{"h": "{NUL}"}}}}', "customHeaders.h"),
    "NUL in idempotencyKey": ("POST", "/v2/jobs", f'{{"type": "t", "idempotencyKey": "k{NUL}"}}', "idempotencyKey"),
    "NUL in a batch job": ("POST", "/v2/jobs/batch", f'{{"jobs": [{{"type": "t"}}, {{"type": "t", "variables": {{"a": "{NUL}"}}}}]}}', "jobs.1.variables.a"),
    "NUL in worker": ("POST", "/v2/jobs/activate", f'{{"type": "t", "maxJobs": 1, "timeout": 1000, "requestTimeout": -1, "worker": "w{NUL}"}}', "worker"),
    "NUL in Camunda worker": ("POST", "/v2/jobs/activation", f'{{"type": "t", "maxJobsToActivate": 1, "timeout": 1000, "requestTimeout": -1, "worker": "w{NUL}"}}', "worker"),
    "NUL in completion variables": ("POST", "/v2/jobs/{k}/complete", f'{{"activationCount": 1, "variables": {{"a": "{NUL}"}}}}', "variables.a"),
    "NUL in batch completion": ("POST", "/v2/jobs/complete", f'{{"jobs": [{{"jobKey": "{{k}}", "activationCount": 1, "variables": {{"a": "{NUL}"}}}}]}}', "jobs.0.variables.a"),
    "NUL in errorMessage": ("POST", "/v2/jobs/{k}/fail", f'{{"activationCount": 1, "errorMessage": "{NUL}"}}', "errorMessage"),
    "NUL in errorCode": ("POST", "/v2/jobs/{k}/error", f'{{"activationCount": 1, "errorCode": "E{NUL}"}}', "errorCode"),
    "NUL in error's message": ("POST", "/v2/jobs/{k}/error", f'{{"activationCount": 1, "errorCode": "E", "errorMessage": "{NUL}"}}', "errorMessage"),
    "NUL in Camunda completion": ("POST", "/v2/jobs/{k}/completion", f'{{"variables": {{"a": "{NUL}"}}}}', "variables.a"),
    "NUL in Camunda result": ("POST", "/v2/jobs/{k}/completion", f'{{"result": {{"a": "{NUL}"}}}}', "result.a"),
    "NUL in Camunda failure": ("POST", "/v2/jobs/{k}/failure", f'{{"errorMessage": "{NUL}"}}', "errorMessage"),
    "NUL in a search filter": ("POST", "/v2/jobs/search", f'{{"filter": {{"worker": "{NUL}"}}}}', "filter.worker"),
    "NUL in a search $in": ("POST", "/v2/jobs/search", f'{{"filter": {{"type": {{"$in": ["a", "{NUL}"]}}}}}}', "filter.type"),
    # -- integers beyond 64 bits, either sign --
    "2^64 in variables": ("POST", "/v2/jobs", '{"type": "t", "variables": {"a": 18446744073709551616}}', "variables.a"),
    "-2^63-1 in variables": ("POST", "/v2/jobs", '{"type": "t", "variables": {"a": [-9223372036854775809]}}', "variables.a.0"),
    "2^64 in completion variables": ("POST", "/v2/jobs/{k}/complete", '{"activationCount": 1, "variables": {"a": 18446744073709551616}}', "variables.a"),
    # -- what an int4 column holds --
    "activationCount 2^31": ("POST", "/v2/jobs/{k}/complete", '{"activationCount": 2147483648}', "activationCount"),
    "activationCount 2^31, unknown job": ("POST", "/v2/jobs/42/complete", '{"activationCount": 2147483648}', "activationCount"),
    "activationCount 2^31 on fail": ("POST", "/v2/jobs/{k}/fail", '{"activationCount": 2147483648}', "activationCount"),
    "activationCount 2^31 on error": ("POST", "/v2/jobs/{k}/error", '{"activationCount": 2147483648, "errorCode": "E"}', "activationCount"),
    "activationCount 2^31 on PATCH": ("PATCH", "/v2/jobs/{k}", '{"activationCount": 2147483648, "changeset": {"retries": 1}}', "activationCount"),
    "activationCount 2^31 in a batch": ("POST", "/v2/jobs/complete", '{"jobs": [{"jobKey": "{k}", "activationCount": 2147483648}]}', "jobs.0.activationCount"),
    "tenant maxActiveJobs 2^31": ("PUT", "/v2/tenants/acme", '{"maxActiveJobs": 2147483648}', "maxActiveJobs"),
    "job type maxActiveJobs 2^31": ("PUT", "/v2/job-types/t", '{"maxActiveJobs": 2147483648}', "maxActiveJobs"),
    "job type agingIntervalMs 2^31": ("PUT", "/v2/job-types/t", '{"agingIntervalMs": 2147483648}', "agingIntervalMs"),
    "search filter.retries 2^40": ("POST", "/v2/jobs/search", '{"filter": {"retries": 1099511627776}}', "filter.retries"),
    "search filter.retries $in 2^40": ("POST", "/v2/jobs/search", '{"filter": {"retries": {"$in": [1, 1099511627776]}}}', "filter.retries"),
    "search filter.retries a string": ("POST", "/v2/jobs/search", '{"filter": {"retries": "3"}}', "filter.retries"),
    "search filter.retries a fraction": ("POST", "/v2/jobs/search", '{"filter": {"retries": 1.5}}', "filter.retries"),
    "search page.from 2^63": ("POST", "/v2/jobs/search", '{"page": {"from": 9223372036854775808}}', "page.from"),
    "search filter.jobKey in Arabic digits": ("POST", "/v2/jobs/search", '{"filter": {"jobKey": "\u0661\u0662"}}', "filter.jobKey"),
    # -- instants that leave the calendar when moved to UTC --
    "runAt after year 9999 in UTC": ("POST", "/v2/jobs", '{"type": "t", "runAt": "9999-12-31T23:59:59-14:00"}', "runAt"),
    "runAt before year 1 in UTC": ("POST", "/v2/jobs", '{"type": "t", "runAt": "0001-01-01T00:00:00+14:00"}', "runAt"),
    # -- numbers JSON does not have, or a double does not hold: never stored as null --
    "NaN": ("POST", "/v2/jobs", '{"type": "t", "variables": {"a": NaN}}', "variables.a"),
    "Infinity": ("POST", "/v2/jobs", '{"type": "t", "variables": {"a": Infinity}}', "variables.a"),
    "-Infinity": ("POST", "/v2/jobs", '{"type": "t", "customHeaders": {"a": [-Infinity]}}', "customHeaders.a.0"),
    "1e400": ("POST", "/v2/jobs", '{"type": "t", "variables": {"a": {"b": 1e400}}}', "variables.a.b"),
    # -- numbers a double does not keep as sent (issue 39 §2): refused, never rounded --
    "1e-400 (0.0 as a double)": ("POST", "/v2/jobs", '{"type": "t", "variables": {"a": 1e-400}}', "variables.a"),
    "-0.0 (numeric has no negative zero)": ("POST", "/v2/jobs", '{"type": "t", "variables": {"a": [1, -0.0]}}', "variables.a.1"),
    "-0e7 in customHeaders": ("POST", "/v2/jobs", '{"type": "t", "customHeaders": {"h": -0e7}}', "customHeaders.h"),
    "36 digits (0.1 as a double)": ("POST", "/v2/jobs", '{"type": "t", "variables": {"a": 0.1000000000000000055511151231257827}}', "variables.a"),
    "2.5e-324 (5e-324 as a double)": ("POST", "/v2/jobs/batch", '{"jobs": [{"type": "t"}, {"type": "t", "variables": {"a": 2.5e-324}}]}', "jobs.1.variables.a"),
    "1e-400 in completion variables": ("POST", "/v2/jobs/{k}/complete", '{"activationCount": 1, "variables": {"a": 1e-400}}', "variables.a"),
    "1e-400 in a Camunda result": ("POST", "/v2/jobs/{k}/completion", '{"result": {"a": 1e-400}}', "result.a"),
    "a cost rounded away": ("POST", "/v2/jobs", '{"type": "t", "cost": 1.00000000000000000001}', "cost"),
    "an exponent of 19 digits (a 500 once)": ("POST", "/v2/jobs", '{"type": "t", "variables": {"a": 1e-9999999999999999999}}', "variables.a"),
    "%.17g of 0.1": ("POST", "/v2/jobs", '{"type": "t", "variables": {"a": 0.10000000000000001}}', "variables.a"),
    "NaN as a lease": ("POST", "/v2/jobs/activate", '{"type": "t", "maxJobs": 1, "timeout": NaN}', "timeout"),
    # -- a long poll is bounded at one hour --
    "requestTimeout over 1 h": ("POST", "/v2/jobs/activate", '{"type": "t", "maxJobs": 1, "timeout": 1000, "requestTimeout": 3600001}', "requestTimeout"),
    "Camunda requestTimeout over 1 h": ("POST", "/v2/jobs/activation", '{"type": "t", "maxJobsToActivate": 1, "timeout": 1000, "requestTimeout": 3600001}', "requestTimeout"),
}  # fmt: skip

# Paths and query strings: job keys are ASCII digits, and nothing else is read as one.
BAD_URLS: dict[str, tuple[str, str, str]] = {
    "superscript two as a job key": ("GET", "/v2/jobs/%C2%B2", "jobKey"),
    "Arabic-Indic digits as a job key": ("GET", "/v2/jobs/%D9%A1%D9%A2", "jobKey"),
    "Arabic-Indic digits to complete": ("POST", "/v2/jobs/%D9%A1%D9%A2/complete", "jobKey"),
    "fullwidth digits to cancel": ("POST", "/v2/jobs/%EF%BC%91/cancel", "jobKey"),
    "Arabic-Indic maxJobs on a stream": (
        "GET",
        "/v2/jobs/stream?type=t&maxJobs=%D9%A1&timeout=1000",
        "maxJobs",
    ),
    "underscored timeout on a stream": (
        "GET",
        "/v2/jobs/stream?type=t&maxJobs=1&timeout=1_000",
        "timeout",
    ),
    "NUL in a stream's worker": (
        "GET",
        "/v2/jobs/stream?type=t&maxJobs=1&timeout=1000&worker=w%00",
        "worker",
    ),
    "an empty tenant in a stream's tenantIds": (
        "GET",
        "/v2/jobs/stream?type=t&maxJobs=1&timeout=1000&tenantIds=a,,b",
        "tenantIds",
    ),
    # -- a parameter given twice: which one counts is the reader's choice (issue 39 §2) --
    "type twice on a stream": (
        "GET",
        "/v2/jobs/stream?type=t&maxJobs=1&timeout=1000&type=u",
        "'type' is given twice",
    ),
    "tenantIds twice on a stream": (
        "GET",
        "/v2/jobs/stream?type=t&maxJobs=1&timeout=1000&tenantIds=a&tenantIds=b",
        "'tenantIds' is given twice",
    ),
    "type twice on stats": ("GET", "/v2/stats?type=a&type=b", "'type' is given twice"),
    "tenantId twice on the listing": (
        "GET",
        "/v2/jobs?tenantId=a&tenantId=b",
        "'tenantId' is given twice",
    ),
    "a tenant id ending in a newline": ("GET", "/v2/tenants/acme%0A", "tenantId"),
    "a job type ending in a newline": ("GET", "/v2/job-types/t%0A", "type"),
}


@pytest.fixture
async def world(live, store):
    """One ACTIVATED job; the state of every table, to compare after each refusal."""
    c = live.client
    assert (await c.post("/v2/jobs", json={"type": "t", "variables": {"x": 1}})).status_code == 201
    [job] = await activate(c, "t")
    # The activation charges its lane after answering: let it, before the snapshot.
    await live.services.activation.settle()
    token = base64.urlsafe_b64encode(f"jfl1:{job['jobKey']}:2147483648".encode())
    fill = {"k": job["jobKey"], "t": token.decode().rstrip("=")}

    async def tables() -> list[object]:
        return [
            await store.fetchval(
                f"SELECT md5(coalesce(string_agg(x::text, '|' ORDER BY x::text), '')) FROM {t} x"
            )
            for t in ("jobs", "lanes", "tenants", "job_types")
        ]

    return fill, tables


@pytest.mark.parametrize("case", list(CASES))
async def test_a_value_that_cannot_be_stored_faithfully_is_a_400_naming_it(live, world, case):
    fill, tables = world
    method, path, body, field = CASES[case]
    before = await tables()
    body = body.replace("{k}", fill["k"]).replace("{t}", fill["t"])
    r = await live.client.request(
        method,
        path.format(**fill),
        content=_raw(body),
        headers={"content-type": "application/json"},
    )
    problem = assert_problem(r, 400, "INVALID_ARGUMENT")
    assert problem["detail"].startswith(field) or f"; {field}" in problem["detail"], problem
    assert await tables() == before


@pytest.mark.parametrize("case", list(BAD_URLS))
async def test_a_path_or_query_value_is_read_as_ascii_or_refused(live, world, case):
    _, tables = world
    method, url, field = BAD_URLS[case]
    before = await tables()
    # A short timeout: a stream that is wrongly accepted would otherwise never end.
    r = await live.client.request(method, url, timeout=5)
    problem = assert_problem(r, 400, "INVALID_ARGUMENT")
    assert field in problem["detail"], problem
    assert await tables() == before


async def test_a_lease_token_beyond_any_activation_holds_no_lease(live, world):
    """The token is opaque: one that cannot be this job's lease is a lease that does not
    match (409), and its count never reaches the database; for an unknown job, 404."""
    fill, tables = world
    before = await tables()
    for path in ("/v2/jobs/{k}/completion", "/v2/jobs/{k}/failure"):
        r = await live.client.post(path.format(**fill), json={"jobLeaseToken": fill["t"]})
        assert "jobLeaseToken" in assert_problem(r, 409, "INVALID_STATE")["detail"]
    r = await live.client.post("/v2/jobs/42/completion", json={"jobLeaseToken": fill["t"]})
    assert_problem(r, 404, "NOT_FOUND")
    assert await tables() == before


async def test_integers_at_the_edges_of_64_bits_are_stored_as_sent(live):
    variables = {"top": 18446744073709551615, "bottom": -9223372036854775808, "f": 1.5e300}
    r = await live.client.post("/v2/jobs", json={"type": "t", "variables": variables})
    assert r.status_code == 201, r.text
    assert r.json()["variables"] == variables
    got = await live.client.get(f"/v2/jobs/{r.json()['jobKey']}")
    assert got.json()["variables"] == variables


async def test_an_integral_number_is_an_integer_wherever_one_is_expected(live):
    """JSON does not tell 58 from 58.0 (nor does JSON Schema): both are the integer 58."""
    c = live.client
    r = await c.post("/v2/jobs", json={"type": "t", "priority": 58.0, "retries": 2.0})
    assert r.status_code == 201, r.text
    assert (r.json()["priority"], r.json()["retries"]) == (58, 2)
    for fraction in ({"priority": 58.5}, {"priority": "58"}, {"priority": True}):
        assert_problem(await c.post("/v2/jobs", json={"type": "t", **fraction}), 400)


async def test_a_long_poll_of_exactly_one_hour_is_accepted(live):
    # Accepted (the bound is inclusive); -1 so that the test does not wait.
    body = {"type": "t", "maxJobs": 1, "timeout": 1000, "requestTimeout": 3_600_000}
    jobs = await live.client.post("/v2/jobs", json={"type": "t"})
    assert jobs.status_code == 201
    r = await live.client.post("/v2/jobs/activate", json=body)
    assert r.status_code == 200 and len(r.json()["jobs"]) == 1, r.text


async def test_a_body_in_another_media_type_is_415(live, store):
    for media in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        r = await live.client.post(
            "/v2/jobs", content=b'{"type": "t"}', headers={"content-type": media}
        )
        assert_problem(r, 415)
    ok = await live.client.post(
        "/v2/jobs",
        content=b'{"type": "t"}',
        headers={"content-type": "application/json; charset=utf-8"},
    )
    assert ok.status_code == 201, ok.text
    assert await store.fetchval("SELECT count(*) FROM jobs") == 1


# A key given twice in one object (issue 39 §2): taken with its last value, it is a way
# around a proxy in front that reads the first.  (method, path, body, the key named.)
TWICE: dict[str, tuple[str, str, str, str]] = {
    "tenantId twice in a create": ("POST", "/v2/jobs", '{"type": "t", "tenantId": "evil", "tenantId": "good"}', "tenantId"),
    "a variable twice": ("POST", "/v2/jobs", '{"type": "t", "variables": {"a": 1, "b": 2, "a": 3}}', "a"),
    "type twice in a batch job": ("POST", "/v2/jobs/batch", '{"jobs": [{"type": "t"}, {"type": "t", "type": "u"}]}', "type"),
    "jobs twice in a batch": ("POST", "/v2/jobs/batch", '{"jobs": [{"type": "t"}], "jobs": [{"type": "u"}]}', "jobs"),
    "activationCount twice": ("POST", "/v2/jobs/{k}/complete", '{"activationCount": 2, "activationCount": 1}', "activationCount"),
    "tenantIds twice in an activation": ("POST", "/v2/jobs/activate", '{"type": "t", "maxJobs": 1, "timeout": 1000, "requestTimeout": -1, "tenantIds": ["x"], "tenantIds": ["<default>"]}', "tenantIds"),
    "weight twice for a tenant": ("PUT", "/v2/tenants/acme", '{"weight": 1, "weight": 10000}', "weight"),
    "a Camunda result's key twice": ("POST", "/v2/jobs/{k}/completion", '{"result": {"a": 1, "a": 2}}', "a"),
    "a key that says ' at line '": ("POST", "/v2/jobs", '{"type": "t", "variables": {"x at line 9": 1, "x at line 9": 2}}', "x at line 9"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(TWICE))
async def test_a_key_given_twice_in_an_object_is_a_400_naming_it(live, world, case):
    fill, tables = world
    method, path, body, key = TWICE[case]
    before = await tables()
    r = await live.client.request(
        method,
        path.format(**fill),
        content=_raw(body.replace("{k}", fill["k"])),
        headers={"content-type": "application/json"},
    )
    problem = assert_problem(r, 400, "INVALID_ARGUMENT")
    assert f'the key "{key}" is given twice' in problem["detail"], problem
    assert await tables() == before


async def test_a_zero_with_any_exponent_is_zero(live):
    """0e99999999999999999999 is exactly 0: accepted (its exponent, too long for a
    decimal, answered 500 once)."""
    body = (
        b'{"type": "t", "variables": {"z": 0e99999999999999999999, "w": 0.0e-10000000000000000000}}'
    )
    r = await live.client.post(
        "/v2/jobs", content=body, headers={"content-type": "application/json"}
    )
    assert r.status_code == 201, r.text
    assert r.json()["variables"] == {"z": 0, "w": 0}


async def test_numbers_a_double_keeps_are_stored_as_sent(live):
    """What is accepted is stored as sent: the number read back is the number sent
    (compared as decimals), in the answer and in the job read again."""
    texts = ["1.5", "0.1", "5e-324", "1.7976931348623157e308", "1E+2", "1.50", "0.0", "-2.5e-7"]
    body = '{"type": "t", "variables": {"n": [' + ", ".join(texts) + "]}}"
    r = await live.client.post(
        "/v2/jobs", content=body.encode(), headers={"content-type": "application/json"}
    )
    assert r.status_code == 201, r.text
    got = await live.client.get(f"/v2/jobs/{r.json()['jobKey']}")
    for answer in (r, got):
        numbers = json.loads(answer.text, parse_float=Decimal)["variables"]["n"]
        assert numbers == [Decimal(t) for t in texts], numbers
