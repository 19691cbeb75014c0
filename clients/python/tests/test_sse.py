"""AsyncJobfair.stream over a fake transport (no server): whatever the chunk boundaries,
the stream reads as the same jobs.  A CR ending one chunk and its LF opening the next are
one line end; a UTF-8 character split between chunks is one character; and only CR, LF
and CRLF end a line (JSON carries U+2028 and U+0085 unescaped)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest
from jobfair_client import AsyncJobfair


def record(key: str, variables: dict[str, object]) -> str:
    job = {
        "jobKey": key,
        "type": "t",
        "tenantId": "<default>",
        "state": "ACTIVATED",
        "priority": 50,
        "effectivePriority": 50,
        "retries": 3,
        "activationCount": 1,
        "variables": variables,
    }
    return json.dumps(job, ensure_ascii=False)  # as the server (orjson) writes it


VARIABLES = {
    "17": {"text": "héllo — 日本 😀", "big": 123456789012345678901234567890},
    "18": {"separators": "line\u2028paragraph\u2029next\x85line", "form": "\x0b\x0c\x1c"},
    "19": {},
}

# What the server sends (sse-starlette): keep-alive comments, id, event: job, JSON data;
# and events the client must pass over (another event name, an event name without data).
LINES = [
    ": keep-alive",
    "",
    "id: 17",
    "event: job",
    "data: " + record("17", VARIABLES["17"]),
    "",
    ": keep-alive",
    "",
    "event: other",
    "data: not a job",
    "",
    "event: job",
    "",
    "event: job",
    "id: 18",
    "data:" + record("18", VARIABLES["18"]),
    "",
    "retry: 1000",
    "data: a message",
    "",
    "id: 19",
    "event: job",
    "data: " + record("19", VARIABLES["19"]),
    "",
]

STREAMS = {
    "CRLF": "".join(line + "\r\n" for line in LINES),
    "LF": "".join(line + "\n" for line in LINES),
    "CR": "".join(line + "\r" for line in LINES),
    "CRLF after a byte order mark": "\ufeff" + "".join(line + "\r\n" for line in LINES),
}


class Chunks(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes], before: Callable[[int], Awaitable[None]] | None = None):
        self.chunks = chunks
        self.before = before

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for i, chunk in enumerate(self.chunks):
            if self.before is not None:
                await self.before(i)
            yield chunk


def client(stream: httpx.AsyncByteStream) -> AsyncJobfair:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=stream)

    http = httpx.AsyncClient(base_url="http://jobfair.test", transport=httpx.MockTransport(answer))
    return AsyncJobfair("http://jobfair.test", http=http)


async def jobs_of(chunks: list[bytes]) -> list[tuple[str, dict[str, object]]]:
    async with client(Chunks(chunks)) as jf:
        return [(job.key, job.variables) async for job in jf.stream("t", credit=4)]


@pytest.mark.parametrize("name", STREAMS)
async def test_a_stream_reads_the_same_split_at_every_byte(name):
    data = STREAMS[name].encode()
    expected = list(VARIABLES.items())
    assert await jobs_of([data]) == expected
    for at in range(len(data) + 1):
        assert await jobs_of([data[:at], data[at:]]) == expected, f"split at byte {at}"
    assert await jobs_of([data[i : i + 1] for i in range(len(data))]) == expected


async def test_a_job_is_handed_over_as_soon_as_its_blank_line_arrives():
    # The LF completing the last CRLF comes with the next chunk, seconds later in a real
    # stream (the next keep-alive): the job must not wait for it.
    first = ("id: 17\r\nevent: job\r\ndata: " + record("17", {}) + "\r\n\r").encode()
    more = asyncio.Event()

    async def before(i: int) -> None:
        if i == 1:
            await more.wait()

    async with client(Chunks([first, b"\n"], before)) as jf:
        jobs = jf.stream("t", credit=4)
        job = await asyncio.wait_for(anext(jobs), timeout=2)
        assert job.key == "17"
        more.set()
        assert [j async for j in jobs] == []
