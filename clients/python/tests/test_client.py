"""jobfair_client against a live Jobfair (embedded PostgreSQL, sweepers on their timers)."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

import pytest
from jobfair_client import (
    AsyncJobfair,
    AsyncWorker,
    Backoff,
    BusinessError,
    Conflict,
    InvalidArgument,
    Job,
    Jobfair,
    NewJob,
    NotFound,
    StaleActivation,
    Worker,
)

from tests.fixtures import quiet_settings


@pytest.fixture
def background():
    return True  # the lease sweep must run for the heartbeat test to mean anything


@pytest.fixture
def settings():
    return quiet_settings(lease_sweep_interval_ms=50, promote_interval_ms=50)


@pytest.fixture
async def jf(live):
    async with AsyncJobfair(live.url) as client:
        yield client


async def states(jf: AsyncJobfair, keys: list[str]) -> Counter[str]:
    return Counter([(await jf.get_job(k)).state for k in keys])


async def test_producer_api_and_typed_errors(jf):
    job = await jf.create_job("mail", tenant_id="acme", priority=70, variables={"to": "a@b"})
    assert isinstance(job, Job) and job.state == "CREATED" and job.priority == 70
    assert job.tenant_id == "acme" and job.variables == {"to": "a@b"}
    again = await jf.create_job("mail", tenant_id="acme", idempotency_key="k1")
    same = await jf.create_job("mail", tenant_id="acme", idempotency_key="k1")
    assert again.key == same.key
    keys = await jf.create_jobs([NewJob("mail", variables={"n": i}) for i in range(5)])
    assert len(keys) == 5 and (await jf.get_job(keys[3])).variables == {"n": 3}
    assert (await jf.get_job(keys[3])).fairness_key == "<default>"
    [keyed] = await jf.create_jobs([NewJob("mail", fairness_key="user:7")])
    assert (await jf.get_job(keyed)).fairness_key == "user:7"
    assert (await jf.get_job(keyed)).cost == 1
    [costly] = await jf.create_jobs([NewJob("mail", cost=2.5)])
    assert (await jf.get_job(costly)).cost == 2.5
    await jf.cancel_job(keys[0])
    assert (await jf.get_job(keys[0])).state == "CANCELED"
    with pytest.raises(Conflict):
        await jf.cancel_job(keys[0])
    with pytest.raises(NotFound) as missing:
        await jf.get_job("4242")
    assert missing.value.status == 404 and missing.value.type == "urn:jobfair:not-found"
    with pytest.raises(InvalidArgument):
        await jf.create_job("no spaces allowed")

    [active] = await jf.activate("mail", max_jobs=1, request_timeout_ms=-1)
    await jf.extend_lease(active, 120_000)
    await jf.complete(active, {"sent": True})
    with pytest.raises(StaleActivation):
        await jf.complete((active.key, active.activation_count + 1))
    with pytest.raises(Conflict):
        await jf.complete(active)
    done = await jf.get_job(active.key)
    assert done.state == "COMPLETED" and done.variables["sent"] is True


@pytest.mark.parametrize("mode", ["poll", "stream"])
async def test_four_handlers_drain_160_jobs_each_exactly_once(jf, mode):
    keys = await jf.create_jobs([NewJob("drain", tenant_id=f"t{i % 3}") for i in range(160)])
    seen: Counter[str] = Counter()
    running = 0
    peak = 0
    finished = asyncio.Event()

    async def handler(job: Job) -> dict[str, int]:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        seen[job.key] += 1
        await asyncio.sleep(0)
        running -= 1
        if sum(seen.values()) == 160:
            finished.set()
        return {"handled": 1}

    worker = AsyncWorker(jf, "drain", handler, concurrency=4, mode=mode, request_timeout_ms=1000)
    run = asyncio.create_task(worker.run())
    await asyncio.wait_for(finished.wait(), timeout=120)
    worker.stop()
    await run
    assert set(seen) == set(keys) and set(seen.values()) == {1}
    assert peak <= 4
    assert worker.stats.completed == 160 and worker.stats.conflicts == 0
    assert await states(jf, keys) == Counter({"COMPLETED": 160})


@pytest.mark.parametrize("mode", ["poll", "stream"])
async def test_completions_go_in_batches_each_with_its_own_verdict(jf, mode):
    n = 1_000
    keys = await jf.create_jobs([NewJob("batched", tenant_id=f"t{i % 5}") for i in range(n)])
    batches: list[int] = []
    send = jf.send_completions

    async def counted(items):  # the real call, its batch sizes recorded
        batches.append(len(items))
        return await send(items)

    jf.send_completions = counted  # type: ignore[method-assign]
    stolen: list[str] = []
    finished = asyncio.Event()
    seen: Counter[str] = Counter()

    async def handler(job: Job) -> dict[str, int] | None:
        seen[job.key] += 1
        if len(stolen) < 3 and seen.total() % 97 == 0:
            # Someone else finishes this job first: the worker's completion of it, in
            # a batch with others, must be refused alone.
            await jf.complete(job)
            stolen.append(job.key)
        if seen.total() == n:
            finished.set()
        return {"i": seen.total()}

    worker = AsyncWorker(jf, "batched", handler, concurrency=50, mode=mode, request_timeout_ms=1000)
    run = asyncio.create_task(worker.run())
    await asyncio.wait_for(finished.wait(), timeout=120)
    worker.stop()
    await run
    assert set(seen.values()) == {1} and len(seen) == n
    assert len(stolen) == 3
    assert worker.stats.completed == n - 3 and worker.stats.conflicts == 3
    assert sum(batches) == n and max(batches) > 1 and len(batches) < n / 5
    assert await states(jf, keys) == Counter({"COMPLETED": n})
    assert (await jf.get_job(keys[-1])).variables.get("i") is not None


async def test_complete_many_answers_each_job(jf):
    keys = await jf.create_jobs([NewJob("many") for _ in range(3)])
    jobs = await jf.activate("many", max_jobs=3, request_timeout_ms=-1)
    by_key = {j.key: j for j in jobs}
    first, second, third = (by_key[k] for k in keys)
    await jf.complete(second)
    verdicts = await jf.complete_many(
        [first, second, (third.key, third.activation_count + 1), ("999999", 1)],
        [{"ok": True}, None, None, None],
    )
    assert verdicts == [204, 409, 409, 404]
    assert (await jf.get_job(first.key)).variables == {"ok": True}
    assert (await jf.get_job(third.key)).state == "ACTIVATED"


async def test_a_result_that_is_not_json_fails_the_job_instead(jf):
    [key] = await jf.create_jobs([NewJob("nan", retries=2)])
    done = asyncio.Event()

    async def handler(job: Job) -> dict[str, float]:
        done.set()
        return {"x": float("nan")}

    worker = AsyncWorker(jf, "nan", handler, concurrency=1, request_timeout_ms=500)
    run = asyncio.create_task(worker.run())
    await asyncio.wait_for(done.wait(), timeout=30)
    worker.stop()
    await run
    job = await jf.get_job(key)
    assert worker.stats.failed == 1 and worker.stats.completed == 0
    assert job.retries == 1 and "JSON" in (job.error_message or "")


async def test_a_handler_exception_fails_the_job_and_it_is_retried(jf):
    job = await jf.create_job("flaky", retries=3)
    attempts: list[int] = []
    done = asyncio.Event()

    async def handler(j: Job) -> dict[str, bool]:
        attempts.append(j.activation_count)
        if j.activation_count == 1:
            raise RuntimeError("first try breaks")
        done.set()
        return {"ok": True}

    worker = AsyncWorker(
        jf, "flaky", handler, request_timeout_ms=500, fail_backoff=Backoff(base_ms=100, factor=2)
    )
    run = asyncio.create_task(worker.run())
    await asyncio.wait_for(done.wait(), timeout=30)
    worker.stop()
    await run
    after = await jf.get_job(job.key)
    assert attempts == [1, 2]
    assert after.state == "COMPLETED" and after.retries == 2
    assert after.error_message == "RuntimeError: first try breaks"
    assert worker.stats.failed == 1 and worker.stats.completed == 1


async def test_a_business_error_result_throws_a_job_error(jf):
    job = await jf.create_job("pay")
    called = asyncio.Event()

    async def handler(j: Job) -> BusinessError:
        called.set()
        return BusinessError("CARD_DECLINED", "insufficient funds", {"declined": True})

    worker = AsyncWorker(jf, "pay", handler, request_timeout_ms=500)
    run = asyncio.create_task(worker.run())
    await asyncio.wait_for(called.wait(), timeout=30)
    worker.stop()
    await run  # returns once in-flight jobs are finished
    assert worker.stats.errors_thrown == 1
    after = await jf.get_job(job.key)
    assert after.error_code == "CARD_DECLINED" and after.variables == {"declined": True}


async def test_a_slow_handler_keeps_its_lease_by_heartbeat(jf):
    """Lease 1.5 s, handler 4.5 s (three leases), lease sweep every 50 ms: without the
    heartbeat the job would be taken back and activated again (activationCount 2).  (A
    600 ms lease, beaten every 200 ms, lapsed twice on a machine loaded by two other test
    runs: one late beat was enough.)"""
    job = await jf.create_job("slow")
    started = asyncio.Event()
    done = asyncio.Event()

    async def handler(j: Job) -> dict[str, int]:
        started.set()
        await asyncio.sleep(4.5)
        done.set()
        return {"count": j.activation_count}

    worker = AsyncWorker(jf, "slow", handler, timeout_ms=1500, request_timeout_ms=500)
    rival_saw: list[Job] = []

    async def rival() -> None:  # would get the job if its lease lapsed
        while not done.is_set():
            rival_saw.extend(await jf.activate("slow", timeout_ms=60_000, request_timeout_ms=200))

    run = asyncio.create_task(worker.run())
    await asyncio.wait_for(started.wait(), timeout=30)
    await asyncio.gather(rival(), asyncio.wait_for(done.wait(), timeout=30))
    worker.stop()
    await run
    after = await jf.get_job(job.key)
    assert rival_saw == []
    assert after.state == "COMPLETED" and after.activation_count == 1
    assert after.variables == {"count": 1} and worker.stats.conflicts == 0


async def test_shutdown_mid_drain_loses_nothing(jf):
    keys = await jf.create_jobs([NewJob("shut") for _ in range(100)])
    handled: Counter[str] = Counter()
    twenty = asyncio.Event()
    all_done = asyncio.Event()

    async def handler(j: Job) -> None:
        await asyncio.sleep(0.02)
        handled[j.key] += 1
        if sum(handled.values()) >= 20:
            twenty.set()
        if sum(handled.values()) == 100:
            all_done.set()

    first = AsyncWorker(jf, "shut", handler, concurrency=4, request_timeout_ms=500)
    run = asyncio.create_task(first.run())
    await asyncio.wait_for(twenty.wait(), timeout=30)
    first.stop()
    await run
    after_stop = await states(jf, keys)
    assert after_stop["ACTIVATED"] == 0, after_stop  # nothing stranded with a dead worker
    assert after_stop["COMPLETED"] == first.stats.completed < 100

    second = AsyncWorker(jf, "shut", handler, concurrency=4, request_timeout_ms=500)
    run = asyncio.create_task(second.run())
    await asyncio.wait_for(all_done.wait(), timeout=60)
    second.stop()
    await run
    assert set(handled.values()) == {1} and len(handled) == 100
    assert await states(jf, keys) == Counter({"COMPLETED": 100})


async def test_shutdown_releases_a_job_whose_handler_outlives_the_grace(jf):
    job = await jf.create_job("stuck", retries=3)
    started = asyncio.Event()

    async def handler(j: Job) -> None:
        started.set()
        await asyncio.sleep(3600)

    worker = AsyncWorker(jf, "stuck", handler, request_timeout_ms=500, shutdown_grace_s=0.1)
    run = asyncio.create_task(worker.run())
    await asyncio.wait_for(started.wait(), timeout=30)
    worker.stop()
    await run
    after = await jf.get_job(job.key)
    assert after.state == "CREATED" and after.retries == 3 and worker.stats.released == 1


async def test_sync_client_and_threaded_worker(live):
    def produce() -> list[str]:
        with Jobfair(live.url) as client:
            return client.create_jobs([NewJob("sync") for _ in range(120)])

    keys = await asyncio.to_thread(produce)
    seen: Counter[str] = Counter()
    lock = threading.Lock()
    all_seen = threading.Event()

    def handler(j: Job) -> dict[str, str]:
        with lock:  # runs on one of the worker's threads
            seen[j.key] += 1
            if sum(seen.values()) == 120:
                all_seen.set()
        return {"thread": "yes"}

    client = Jobfair(live.url)
    worker = Worker(client, "sync", handler, concurrency=4, request_timeout_ms=500)
    thread = asyncio.create_task(asyncio.to_thread(worker.run))
    assert await asyncio.to_thread(all_seen.wait, 60)
    await asyncio.to_thread(worker.stop)
    await thread
    client.close()
    assert set(seen) == set(keys) and set(seen.values()) == {1}
    async with AsyncJobfair(live.url) as jf:
        assert await states(jf, keys) == Counter({"COMPLETED": 120})


async def test_one_refused_result_fails_its_job_alone_not_its_batch(jf):
    """The server checks a batch's whole body first: a result it refuses (a NUL in a
    string) must not leave the other jobs of the batch to their leases."""
    keys = await jf.create_jobs([NewJob("poison", retries=1) for _ in range(10)])
    bad = keys[0]
    arrived = asyncio.Event()
    seen = 0

    async def handler(job: Job) -> dict[str, object]:
        nonlocal seen
        seen += 1
        if seen == 10:
            arrived.set()
        await arrived.wait()  # all ten finish together: one batch
        return {"x": "a\x00b"} if job.key == bad else {"ok": 1}

    worker = AsyncWorker(jf, "poison", handler, concurrency=10, request_timeout_ms=500)
    run = asyncio.create_task(worker.run())
    await asyncio.wait_for(arrived.wait(), timeout=30)
    worker.stop()  # run() returns once the ten have their verdicts
    await run
    assert worker.stats.completed == 9 and worker.stats.failed == 1
    job = await jf.get_job(bad)
    assert job.state == "FAILED" and "refused" in (job.error_message or "")
    assert job.completed_at is None and job.finished_at is not None  # it did not complete
    assert await states(jf, keys[1:]) == Counter({"COMPLETED": 9})


async def test_configuration_round_trips_every_field_and_bad_values_are_invalid_arguments(jf):
    """The operators' records (issue 44): each field sent is what the server keeps and
    answers, a PUT sets the whole configuration, and a refused one changes nothing."""
    from dataclasses import replace

    from jobfair_client import JobTypeConfig, KeyConfig, RateLimit, TenantConfig

    assert (await jf.get_tenant("acme.eu")).configured is False
    tenant = TenantConfig(
        weight=3, max_active_jobs=10, min_active_jobs=2, rate_limit=RateLimit(5.0, 10.0)
    )
    got = await jf.put_tenant("acme.eu", tenant)
    assert replace(got, configured=False) == tenant and got.configured
    assert await jf.get_tenant("acme.eu") == got
    with pytest.raises(InvalidArgument, match="minActiveJobs"):
        await jf.put_tenant("acme.eu", replace(tenant, min_active_jobs=11))
    assert await jf.get_tenant("acme.eu") == got
    # The whole configuration: what is left at its default is cleared.
    cleared = await jf.put_tenant("acme.eu", TenantConfig(weight=2))
    assert (cleared.max_active_jobs, cleared.min_active_jobs, cleared.rate_limit) == (
        None,
        None,
        None,
    )

    # "." and ".." are valid names: sent as names, not as dot segments.
    for odd in (".", ".."):
        assert (await jf.put_tenant(odd, TenantConfig(weight=7))).weight == 7
        assert (await jf.get_tenant(odd)).weight == 7
        assert (await jf.put_key(odd, odd, KeyConfig(weight=5))).weight == 5
        assert (await jf.get_key(odd, odd)).weight == 5
    assert (await jf.get_tenant("acme.eu")).weight == 2

    key = await jf.put_key("acme.eu", "user:7", KeyConfig(weight=4, max_active_jobs=1))
    assert (key.weight, key.max_active_jobs, key.configured) == (4, 1, True)
    assert await jf.get_key("acme.eu", "user:7") == key
    default = await jf.put_key("acme.eu", "<default>", KeyConfig(max_active_jobs=3))
    assert default.max_active_jobs == 3

    fifo = JobTypeConfig(
        max_active_jobs=50,
        aging_interval_ms=1000,
        aging_step=5,
        fairness_by="cost",
        max_active_per_key=2,
        key_ordering="fifo",
    )
    got_type = await jf.put_job_type("billing/mail", fifo)  # a type may have a "/"
    assert replace(got_type, configured=False) == fifo
    assert await jf.get_job_type("billing/mail") == got_type
    with pytest.raises(InvalidArgument, match="keyOrdering"):
        await jf.put_job_type("billing/mail", replace(fifo, key_ordering="lifo"))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="maxActivePerKey"):
        await jf.put_job_type("billing/mail", replace(fifo, max_active_per_key=0))
    assert await jf.get_job_type("billing/mail") == got_type


async def test_the_blocking_client_configures_too(live):
    from jobfair_client import JobTypeConfig, KeyConfig, TenantConfig

    def configure() -> None:
        with Jobfair(live.url) as jf:
            assert jf.put_tenant("t", TenantConfig(min_active_jobs=1)).min_active_jobs == 1
            assert jf.get_tenant("t").min_active_jobs == 1
            assert jf.put_key("t", "k", KeyConfig(max_active_jobs=2)).max_active_jobs == 2
            assert jf.get_key("t", "k").max_active_jobs == 2
            fifo = JobTypeConfig(key_ordering="fifo")
            assert jf.put_job_type("x", fifo).key_ordering == "fifo"
            assert jf.get_job_type("x").key_ordering == "fifo"

    await asyncio.to_thread(configure)


async def test_creates_whose_answers_are_lost_are_made_once_each(live):
    """Issue 45 §4: a proxy resets the connection of every other create once the server
    has answered it (the jobs were made; the producer cannot know). With the client's own
    idempotency keys, every call succeeds and every job is made exactly once; without
    them (the old behaviour) a call fails though its job was made."""
    from tests.answer_dropper import AnswerDropper

    fast = Backoff(base_ms=1, max_ms=5)
    async with AnswerDropper.serving(live.url, every=2) as dropper:
        async with AsyncJobfair(dropper.url, backoff=fast) as jf:
            keys = [(await jf.create_job("idem", tenant_id="t")).key for _ in range(20)]
            for _ in range(5):
                keys += await jf.create_jobs([NewJob("idem", tenant_id="t") for _ in range(10)])
        assert dropper.dropped >= 10
        made = (await live.client.get("/v2/jobs", params={"type": "idem", "limit": 1000})).json()
        assert len(keys) == len(set(keys)) == 70
        assert sorted(j["jobKey"] for j in made["items"]) == sorted(keys)

        async with AsyncJobfair(dropper.url, backoff=fast, idempotent_creates=False) as bare:
            outcomes = []
            for _ in range(2):
                try:
                    outcomes.append((await bare.create_job("bare", tenant_id="t")).key)
                except Exception as exc:  # noqa: BLE001 - which one is the point
                    outcomes.append(type(exc).__name__)
    made = (await live.client.get("/v2/jobs", params={"type": "bare"})).json()["items"]
    # One of the two calls failed, and yet both jobs were made.
    assert len(made) == 2 and sum(o.isdigit() for o in outcomes) == 1, outcomes
