"""The HTTP calls of API.md, once, over an async (``AsyncJobfair``) or a blocking
(``Jobfair``) transport.

Each operation is described as a ``Call`` (method, path, body, whether it is safe to send
twice); the two clients differ only in how they send it.  Back pressure (503/429 with
``Retry-After``) and connection failures are retried with jittered exponential back-off;
no other 4xx is retried.  A request that may have had its effect (a read error after
sending, or the server's 503 ``urn:jobfair:outcome-unknown``: its database went away at
commit) is retried only when sending it twice is harmless: reads, finish calls (fenced
by ``activationCount``) and creations that carry an idempotency key.
"""

from __future__ import annotations

import asyncio
import random
import ssl
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal
from urllib.parse import quote
from uuid import uuid4

import httpx

from jobfair_client import codec, tracing
from jobfair_client.config import JobTypeConfig, KeyConfig, TenantConfig
from jobfair_client.errors import JobfairError, OutcomeUnknown, ProblemError, problem
from jobfair_client.models import Job, NewJob
from jobfair_client.sse import SseReader
from jobfair_client.transport import FastTransport


@dataclass(frozen=True, slots=True)
class Backoff:
    """Jittered exponential back-off: ``base_ms * factor**attempt``, at most ``max_ms``,
    drawn uniformly from the upper half of that (so retries spread out)."""

    base_ms: int = 200
    factor: float = 2.0
    max_ms: int = 30_000

    def exact_ms(self, attempt: int) -> int:
        """Without jitter: the back-off before retry number ``attempt + 1``."""
        return int(min(self.max_ms, self.base_ms * self.factor**attempt))

    def delay_s(self, attempt: int, retry_after_s: float | None = None) -> float:
        ceiling = min(self.max_ms, self.base_ms * self.factor**attempt) / 1000
        delay = random.uniform(ceiling / 2, ceiling)
        if retry_after_s:
            # Never sooner than the server asked, spread over the next fifth after it.
            delay = max(delay, retry_after_s * random.uniform(1.0, 1.2))
        return delay


@dataclass(frozen=True, slots=True)
class Call:
    """One request.  ``body`` is a JSON value, or bytes already encoded."""

    method: str
    path: str
    body: Any = None
    params: dict[str, Any] | None = None
    idempotent: bool = True
    timeout_s: float | None = None
    # Sent with the current span's trace context (jobfair_client.tracing): creates, and a
    # worker's finishes from inside its handler's span.
    traced: bool = False


def _keyed(job: NewJob, auto_keys: bool) -> NewJob:
    """``job`` with an idempotency key of the client's own if it has none (and
    ``auto_keys``): a create whose answer is lost (a 503 outcome-unknown, a connection cut
    after sending) is then sent again safely, made once (API.md "Idempotency")."""
    if job.idempotency_key is not None or not auto_keys:
        return job
    return replace(job, idempotency_key=f"auto-{uuid4().hex}")


def _seg(name: str) -> str:
    """A tenant, key or type as one path segment (the names "." and "..", which are
    valid, spelled so that no URL library takes them for dot segments)."""
    seg = quote(name, safe="")
    return seg.replace(".", "%2E") if seg in (".", "..") else seg


def _finish(job: Job | tuple[str, int]) -> tuple[str, int]:
    return (job.key, job.activation_count) if isinstance(job, Job) else job


class _Calls:
    """What each operation sends.  ``job`` arguments take a ``Job`` or ``(key, count)``."""

    @staticmethod
    def put_tenant(tenant_id: str, config: TenantConfig) -> Call:
        return Call("PUT", f"/v2/tenants/{_seg(tenant_id)}", config.to_json())

    @staticmethod
    def put_key(tenant_id: str, fairness_key: str, config: KeyConfig) -> Call:
        path = f"/v2/tenants/{_seg(tenant_id)}/keys/{_seg(fairness_key)}"
        return Call("PUT", path, config.to_json())

    @staticmethod
    def put_job_type(job_type: str, config: JobTypeConfig) -> Call:
        return Call("PUT", f"/v2/job-types/{_seg(job_type)}", config.to_json())

    @staticmethod
    def create_job(job: NewJob, auto_keys: bool = True) -> Call:
        job = _keyed(job, auto_keys)
        safe = job.idempotency_key is not None
        return Call("POST", "/v2/jobs", job.to_json(), idempotent=safe, traced=True)

    @staticmethod
    def create_jobs(jobs: Sequence[NewJob], auto_keys: bool = True) -> Call:
        jobs = [_keyed(j, auto_keys) for j in jobs]
        safe = all(j.idempotency_key is not None for j in jobs)
        body = {"jobs": [j.to_json() for j in jobs]}
        return Call("POST", "/v2/jobs/batch", body, idempotent=safe, traced=True)

    @staticmethod
    def activate(
        job_type: str,
        max_jobs: int,
        timeout_ms: int,
        request_timeout_ms: int | None,
        worker: str | None,
        tenant_ids: Sequence[str] | None,
        fetch_variables: Sequence[str] | None,
    ) -> Call:
        body: dict[str, Any] = {"type": job_type, "maxJobs": max_jobs, "timeout": timeout_ms}
        if request_timeout_ms is not None:
            body["requestTimeout"] = request_timeout_ms
        if worker is not None:
            body["worker"] = worker
        if tenant_ids:
            body["tenantIds"] = list(tenant_ids)
        if fetch_variables:
            body["fetchVariables"] = list(fetch_variables)
        # The server holds the request up to requestTimeout (default 20 s): wait longer.
        wait_s = (
            60.0 if not request_timeout_ms or request_timeout_ms <= 0 else request_timeout_ms / 1000
        )
        return Call("POST", "/v2/jobs/activate", body, timeout_s=wait_s + 30)

    @staticmethod
    def complete(job: Job | tuple[str, int], variables: dict[str, Any] | None) -> Call:
        key, count = _finish(job)
        body: dict[str, Any] = {"activationCount": count}
        if variables is not None:
            body["variables"] = variables
        return Call("POST", f"/v2/jobs/{key}/complete", body, traced=True)

    @staticmethod
    def complete_many(encoded_items: Sequence[bytes]) -> Call:
        """``POST /v2/jobs/complete`` of items each encoded by ``completion_item``."""
        return Call("POST", "/v2/jobs/complete", b'{"jobs":[' + b",".join(encoded_items) + b"]}")

    @staticmethod
    def fail(
        job: Job | tuple[str, int],
        retries: int | None,
        error_message: str | None,
        retry_backoff_ms: int,
        variables: dict[str, Any] | None,
    ) -> Call:
        key, count = _finish(job)
        body: dict[str, Any] = {"activationCount": count, "retryBackOff": retry_backoff_ms}
        if retries is not None:
            body["retries"] = retries
        if error_message is not None:
            body["errorMessage"] = error_message[:10_000]
        if variables is not None:
            body["variables"] = variables
        return Call("POST", f"/v2/jobs/{key}/fail", body, traced=True)

    @staticmethod
    def throw_error(
        job: Job | tuple[str, int],
        code: str,
        message: str | None,
        variables: dict[str, Any] | None,
    ) -> Call:
        key, count = _finish(job)
        body: dict[str, Any] = {"activationCount": count, "errorCode": code}
        if message is not None:
            body["errorMessage"] = message[:10_000]
        if variables is not None:
            body["variables"] = variables
        return Call("POST", f"/v2/jobs/{key}/error", body, traced=True)

    @staticmethod
    def extend_lease(job: Job | tuple[str, int], timeout_ms: int) -> Call:
        key, count = _finish(job)
        return Call(
            "PATCH",
            f"/v2/jobs/{key}",
            {"activationCount": count, "changeset": {"timeout": timeout_ms}},
        )

    @staticmethod
    def update(key: str, retries: int | None, priority: int | None) -> Call:
        changes = {k: v for k, v in (("retries", retries), ("priority", priority)) if v is not None}
        return Call("PATCH", f"/v2/jobs/{key}", {"changeset": changes})

    @staticmethod
    def stream_params(
        job_type: str,
        credit: int,
        timeout_ms: int,
        worker: str | None,
        tenant_ids: Sequence[str] | None,
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"type": job_type, "maxJobs": credit, "timeout": timeout_ms}
        if worker is not None:
            params["worker"] = worker
        if tenant_ids:
            params["tenantIds"] = ",".join(tenant_ids)
        return params


# What ``verify`` takes: True (the system's CAs), a CA bundle's path (PEM), an SSLContext.
Verify = bool | str | ssl.SSLContext


def _ssl(verify: Verify) -> bool | ssl.SSLContext:
    """httpx's ``verify``: a CA bundle's path becomes a context trusting it alone (httpx
    0.28 deprecates passing the path)."""
    return ssl.create_default_context(cafile=verify) if isinstance(verify, str) else verify


def _headers(api_key: str | None) -> dict[str, str]:
    headers = {"User-Agent": "jobfair-client-python/0.1"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def completion_item(job: Job | tuple[str, int], variables: dict[str, Any] | None) -> bytes:
    """One job of a batched completion, encoded (so that a batch can be sized by it)."""
    key, count = _finish(job)
    item: dict[str, Any] = {"jobKey": key, "activationCount": count}
    if variables is not None:
        item["variables"] = variables
    return codec.dumps(item)


def _answer(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        try:
            body = codec.loads(response.content)
        except ValueError:
            body = response.text
        raise problem(response.status_code, body, response.headers.get("Retry-After"))
    if response.status_code == 204 or not response.content:
        return None
    return codec.loads(response.content)


def _should_retry(exc: Exception, call: Call) -> float | None:
    """None: give up.  Else the server's Retry-After (0 when it gave none)."""
    if isinstance(exc, OutcomeUnknown):
        return 0.0 if call.idempotent else None
    if isinstance(exc, ProblemError):
        return (exc.retry_after_s or 0.0) if exc.status in (429, 503) else None
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        return 0.0  # never reached the server
    if isinstance(exc, httpx.TransportError) and call.idempotent:
        return 0.0
    return None


def _request_args(call: Call) -> dict[str, Any]:
    timeout = call.timeout_s if call.timeout_s is not None else httpx.USE_CLIENT_DEFAULT
    args: dict[str, Any] = {"method": call.method, "url": call.path, "timeout": timeout}
    if call.params is not None:
        args["params"] = call.params
    if call.body is not None:
        body = call.body
        args["content"] = body if isinstance(body, bytes) else codec.dumps(body)
        args["headers"] = codec.CONTENT_TYPE
    if call.traced and (trace := tracing.headers()):
        args["headers"] = {**args.get("headers", {}), **trace}
    return args


def _items(
    jobs: Sequence[Job | tuple[str, int]], variables: Sequence[dict[str, Any] | None] | None
) -> list[bytes]:
    if variables is None:
        return [completion_item(j, None) for j in jobs]
    if len(variables) != len(jobs):
        raise ValueError("one variables entry (or None) per job")
    return [completion_item(j, v) for j, v in zip(jobs, variables, strict=True)]


def _verdicts(answer: Any, expected: int) -> list[int]:
    """The statuses of a batch's answer, one per job sent (JobfairError otherwise)."""
    try:
        verdicts = [int(r["status"]) for r in answer["results"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise JobfairError(f"a batch's answer is not a list of verdicts: {exc!r}") from exc
    if len(verdicts) != expected:
        raise JobfairError(f"{len(verdicts)} verdicts for {expected} jobs")
    return verdicts


class _Attempts:
    """The retry policy of one call, for either client: how long to wait before sending
    it again, or the failure re-raised when it must not be (or no longer be) retried."""

    def __init__(self, client: AsyncJobfair | Jobfair, call: Call) -> None:
        self.client = client
        self.call = call
        self.failed = 0

    def wait_before_next(self, exc: Exception) -> float:
        retry_after = _should_retry(exc, self.call)
        self.failed += 1
        if retry_after is None or self.failed >= self.client.max_attempts:
            raise exc
        self.client.retried += 1
        return self.client.backoff.delay_s(self.failed - 1, retry_after)


class AsyncJobfair:
    """``async with AsyncJobfair("http://127.0.0.1:8080", api_key=...) as jf: ...``"""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        max_attempts: int = 6,
        backoff: Backoff | None = None,
        timeout_s: float = 30.0,
        http: httpx.AsyncClient | None = None,
        verify: Verify = True,
        transport: Literal["fast", "httpcore"] = "fast",
        idempotent_creates: bool = True,
    ) -> None:
        """``transport``: "fast" (``jobfair_client.transport``) or "httpcore", httpx's own
        (for proxies or HTTP/2); ignored when ``http`` brings a client.
        ``idempotent_creates``: every job created without an ``idempotency_key`` is given
        one of the client's own, so that a create whose outcome is unknown is retried
        and made once; False sends such jobs without one (never retried then)."""
        self.idempotent_creates = idempotent_creates
        self.max_attempts = max_attempts
        self.backoff = backoff or Backoff()
        self.retried = 0  # requests sent again after back pressure or a connection error
        if http is None:
            options: dict[str, Any] = {}
            if transport == "fast":
                options["transport"] = FastTransport(verify=_ssl(verify), max_connections=200)
            else:
                options["verify"] = _ssl(verify)
                options["limits"] = httpx.Limits(max_connections=200, max_keepalive_connections=50)
            http = httpx.AsyncClient(
                base_url=base_url.rstrip("/"),
                headers=_headers(api_key),
                timeout=timeout_s,
                **options,
            )
        self._http = http

    async def __aenter__(self) -> AsyncJobfair:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def send(self, call: Call) -> Any:
        attempts = _Attempts(self, call)
        while True:
            try:
                return _answer(await self._http.request(**_request_args(call)))
            except (ProblemError, httpx.TransportError) as exc:
                await asyncio.sleep(attempts.wait_before_next(exc))

    # -- producing ---------------------------------------------------------------------

    async def create_job(self, job_type: str, **fields: Any) -> Job:
        """``create_job("send-email", tenant_id="acme", variables={...})``"""
        call = _Calls.create_job(NewJob(job_type, **fields), self.idempotent_creates)
        return Job.from_json(await self.send(call))

    async def create_jobs(self, jobs: Sequence[NewJob]) -> list[str]:
        """Up to 10,000 jobs in one round trip, all or nothing; their keys in order."""
        answer = await self.send(_Calls.create_jobs(jobs, self.idempotent_creates))
        return list(answer["jobKeys"])

    async def get_job(self, key: str) -> Job:
        return Job.from_json(await self.send(Call("GET", f"/v2/jobs/{key}")))

    async def cancel_job(self, key: str) -> None:
        await self.send(Call("POST", f"/v2/jobs/{key}/cancel"))

    async def update_job(
        self, key: str, *, retries: int | None = None, priority: int | None = None
    ) -> None:
        await self.send(_Calls.update(key, retries, priority))

    # -- configuring (operators) ---------------------------------------------------------

    async def put_tenant(self, tenant_id: str, config: TenantConfig) -> TenantConfig:
        """Set the tenant's whole configuration (weight, cap, minimum, rate limit)."""
        return TenantConfig.from_json(await self.send(_Calls.put_tenant(tenant_id, config)))

    async def get_tenant(self, tenant_id: str) -> TenantConfig:
        """Its configuration (the defaults, ``configured`` False, if it has none)."""
        return TenantConfig.from_json(
            await self.send(Call("GET", f"/v2/tenants/{_seg(tenant_id)}"))
        )

    async def put_key(self, tenant_id: str, fairness_key: str, config: KeyConfig) -> KeyConfig:
        """Set a fairness key's weight and cap ("<default>": the jobs sent without one)."""
        return KeyConfig.from_json(await self.send(_Calls.put_key(tenant_id, fairness_key, config)))

    async def get_key(self, tenant_id: str, fairness_key: str) -> KeyConfig:
        path = f"/v2/tenants/{_seg(tenant_id)}/keys/{_seg(fairness_key)}"
        return KeyConfig.from_json(await self.send(Call("GET", path)))

    async def put_job_type(self, job_type: str, config: JobTypeConfig) -> JobTypeConfig:
        """Set the type's whole configuration (cap, aging, rate limit, fairness, per-key
        cap, key ordering)."""
        return JobTypeConfig.from_json(await self.send(_Calls.put_job_type(job_type, config)))

    async def get_job_type(self, job_type: str) -> JobTypeConfig:
        path = f"/v2/job-types/{_seg(job_type)}"
        return JobTypeConfig.from_json(await self.send(Call("GET", path)))

    # -- working -----------------------------------------------------------------------

    async def activate(
        self,
        job_type: str,
        *,
        max_jobs: int = 1,
        timeout_ms: int = 60_000,
        request_timeout_ms: int | None = None,
        worker: str | None = None,
        tenant_ids: Sequence[str] | None = None,
        fetch_variables: Sequence[str] | None = None,
    ) -> list[Job]:
        call = _Calls.activate(
            job_type, max_jobs, timeout_ms, request_timeout_ms, worker, tenant_ids, fetch_variables
        )
        answer = await self.send(call)
        return [Job.from_json(j) for j in answer["jobs"]]

    async def complete(
        self, job: Job | tuple[str, int], variables: dict[str, Any] | None = None
    ) -> None:
        await self.send(_Calls.complete(job, variables))

    async def complete_many(
        self,
        jobs: Sequence[Job | tuple[str, int]],
        variables: Sequence[dict[str, Any] | None] | None = None,
    ) -> list[int]:
        """Complete up to 1,000 jobs in one round trip, each fenced by its activation
        count; ``variables[i]`` (if given) are job i's.  One verdict per job, in order:
        204 completed, 404 unknown, 409 not (or no longer) this activation's."""
        return await self.send_completions(_items(jobs, variables))

    async def send_completions(self, encoded_items: Sequence[bytes]) -> list[int]:
        """``complete_many`` of items already encoded by ``completion_item``."""
        if not encoded_items:
            return []
        return _verdicts(await self.send(_Calls.complete_many(encoded_items)), len(encoded_items))

    async def fail(
        self,
        job: Job | tuple[str, int],
        *,
        retries: int | None = None,
        error_message: str | None = None,
        retry_backoff_ms: int = 0,
        variables: dict[str, Any] | None = None,
    ) -> None:
        await self.send(_Calls.fail(job, retries, error_message, retry_backoff_ms, variables))

    async def throw_error(
        self,
        job: Job | tuple[str, int],
        code: str,
        message: str | None = None,
        variables: dict[str, Any] | None = None,
    ) -> None:
        await self.send(_Calls.throw_error(job, code, message, variables))

    async def extend_lease(self, job: Job | tuple[str, int], timeout_ms: int) -> None:
        """Heartbeat: the lease now ends ``timeout_ms`` from now."""
        await self.send(_Calls.extend_lease(job, timeout_ms))

    async def stream(
        self,
        job_type: str,
        *,
        credit: int,
        timeout_ms: int = 60_000,
        worker: str | None = None,
        tenant_ids: Sequence[str] | None = None,
    ) -> AsyncIterator[Job]:
        """Jobs pushed over SSE; at most ``credit`` of them unfinished at once.  Closing
        the iterator closes the stream (the server releases undelivered jobs)."""
        params = _Calls.stream_params(job_type, credit, timeout_ms, worker, tenant_ids)
        timeout = httpx.Timeout(30.0, read=None)
        async with self._http.stream("GET", "/v2/jobs/stream", params=params, timeout=timeout) as r:
            if r.status_code >= 400:
                await r.aread()
                _answer(r)
            events = SseReader()
            async for chunk in r.aiter_bytes():
                for event, data in events.feed(chunk):
                    if event == "job":
                        yield Job.from_json(codec.loads(data))


class Jobfair:
    """The blocking client: ``with Jobfair("http://127.0.0.1:8080") as jf: ...``"""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        max_attempts: int = 6,
        backoff: Backoff | None = None,
        timeout_s: float = 30.0,
        verify: Verify = True,
        idempotent_creates: bool = True,
    ) -> None:
        self.idempotent_creates = idempotent_creates
        self.base_url = base_url
        self.api_key = api_key
        self.verify = verify
        self.max_attempts = max_attempts
        self.backoff = backoff or Backoff()
        self.retried = 0
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers=_headers(api_key),
            timeout=timeout_s,
            verify=_ssl(verify),
        )

    def __enter__(self) -> Jobfair:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def send(self, call: Call) -> Any:
        attempts = _Attempts(self, call)
        while True:
            try:
                return _answer(self._http.request(**_request_args(call)))
            except (ProblemError, httpx.TransportError) as exc:
                time.sleep(attempts.wait_before_next(exc))

    def create_job(self, job_type: str, **fields: Any) -> Job:
        call = _Calls.create_job(NewJob(job_type, **fields), self.idempotent_creates)
        return Job.from_json(self.send(call))

    def create_jobs(self, jobs: Sequence[NewJob]) -> list[str]:
        return list(self.send(_Calls.create_jobs(jobs, self.idempotent_creates))["jobKeys"])

    def get_job(self, key: str) -> Job:
        return Job.from_json(self.send(Call("GET", f"/v2/jobs/{key}")))

    def cancel_job(self, key: str) -> None:
        self.send(Call("POST", f"/v2/jobs/{key}/cancel"))

    def update_job(
        self, key: str, *, retries: int | None = None, priority: int | None = None
    ) -> None:
        self.send(_Calls.update(key, retries, priority))

    def put_tenant(self, tenant_id: str, config: TenantConfig) -> TenantConfig:
        return TenantConfig.from_json(self.send(_Calls.put_tenant(tenant_id, config)))

    def get_tenant(self, tenant_id: str) -> TenantConfig:
        return TenantConfig.from_json(self.send(Call("GET", f"/v2/tenants/{_seg(tenant_id)}")))

    def put_key(self, tenant_id: str, fairness_key: str, config: KeyConfig) -> KeyConfig:
        return KeyConfig.from_json(self.send(_Calls.put_key(tenant_id, fairness_key, config)))

    def get_key(self, tenant_id: str, fairness_key: str) -> KeyConfig:
        path = f"/v2/tenants/{_seg(tenant_id)}/keys/{_seg(fairness_key)}"
        return KeyConfig.from_json(self.send(Call("GET", path)))

    def put_job_type(self, job_type: str, config: JobTypeConfig) -> JobTypeConfig:
        return JobTypeConfig.from_json(self.send(_Calls.put_job_type(job_type, config)))

    def get_job_type(self, job_type: str) -> JobTypeConfig:
        return JobTypeConfig.from_json(self.send(Call("GET", f"/v2/job-types/{_seg(job_type)}")))

    def activate(
        self,
        job_type: str,
        *,
        max_jobs: int = 1,
        timeout_ms: int = 60_000,
        request_timeout_ms: int | None = None,
        worker: str | None = None,
        tenant_ids: Sequence[str] | None = None,
        fetch_variables: Sequence[str] | None = None,
    ) -> list[Job]:
        call = _Calls.activate(
            job_type, max_jobs, timeout_ms, request_timeout_ms, worker, tenant_ids, fetch_variables
        )
        return [Job.from_json(j) for j in self.send(call)["jobs"]]

    def complete(self, job: Job | tuple[str, int], variables: dict[str, Any] | None = None) -> None:
        self.send(_Calls.complete(job, variables))

    def complete_many(
        self,
        jobs: Sequence[Job | tuple[str, int]],
        variables: Sequence[dict[str, Any] | None] | None = None,
    ) -> list[int]:
        """As ``AsyncJobfair.complete_many``."""
        items = _items(jobs, variables)
        if not items:
            return []
        return _verdicts(self.send(_Calls.complete_many(items)), len(items))

    def fail(
        self,
        job: Job | tuple[str, int],
        *,
        retries: int | None = None,
        error_message: str | None = None,
        retry_backoff_ms: int = 0,
        variables: dict[str, Any] | None = None,
    ) -> None:
        self.send(_Calls.fail(job, retries, error_message, retry_backoff_ms, variables))

    def throw_error(
        self,
        job: Job | tuple[str, int],
        code: str,
        message: str | None = None,
        variables: dict[str, Any] | None = None,
    ) -> None:
        self.send(_Calls.throw_error(job, code, message, variables))

    def extend_lease(self, job: Job | tuple[str, int], timeout_ms: int) -> None:
        self.send(_Calls.extend_lease(job, timeout_ms))
