"""Two tenants, one queue: a flood of 1,000 jobs, then a trickle of 10.

Run against a Jobfair (`make serve`):  python clients/examples/two_tenants.py [URL]
With a FIFO queue the trickle's jobs would wait behind the whole flood; Jobfair's fair
share hands them out within the first few dozen activations.
"""

from __future__ import annotations

import asyncio
import sys
import uuid

from jobfair_client import AsyncJobfair, AsyncWorker, Job, NewJob

FLOOD, TRICKLE = 1000, 10


async def main(url: str) -> None:
    job_type = f"demo-{uuid.uuid4().hex[:8]}"
    async with AsyncJobfair(url) as jf:
        await jf.create_jobs([NewJob(job_type, tenant_id="flood") for _ in range(FLOOD)])
        await jf.create_jobs([NewJob(job_type, tenant_id="trickle") for _ in range(TRICKLE)])
        print(f"queued {FLOOD} jobs of tenant 'flood', then {TRICKLE} of tenant 'trickle'")

        order: list[str] = []
        done = asyncio.Event()

        async def handle(job: Job) -> None:
            order.append(job.tenant_id)
            if len(order) == FLOOD + TRICKLE:
                done.set()

        worker = AsyncWorker(jf, job_type, handle, concurrency=4, request_timeout_ms=1000)
        running = asyncio.create_task(worker.run())
        await done.wait()
        worker.stop()
        await running

    positions = [i + 1 for i, tenant in enumerate(order) if tenant == "trickle"]
    print(f"trickle jobs were handled at positions {positions} of {len(order)}")
    print(f"TRICKLE_DONE_BY={positions[-1]} (a FIFO queue would need {FLOOD + TRICKLE})")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080"))
