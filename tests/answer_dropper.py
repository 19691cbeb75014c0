"""An HTTP/1.1 proxy in front of a live Jobfair that loses answers to creates (issue 45
§4): it forwards every request, and for every ``every``-th create (``POST /v2/jobs`` or
``POST /v2/jobs/batch``) resets the client's connection once the server has answered --
the jobs were made, and the client cannot know it.  What a producer sees when a load
balancer, a proxy or the network drops a connection at the wrong moment.

    async with AnswerDropper.serving(live.url, every=2) as dropper:
        client = AsyncJobfair(dropper.url)   # every other create's answer is lost
        ...
        assert dropper.dropped > 0

The clients' own suites (TypeScript, Java) reach it at JOBFAIR_DROPPING_URL
(tests/acceptance/test_client_suites.py).  Requests are read by Content-Length (every
client here sends one); each is forwarded on a pooled connection of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx

CREATES = {"/v2/jobs", "/v2/jobs/batch"}
HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"host"}


class AnswerDropper:
    def __init__(self, upstream_url: str, every: int = 2) -> None:
        self.upstream_url = upstream_url.rstrip("/")
        self.every = every
        self.creates = 0  # create requests forwarded
        self.dropped = 0  # of them, answers lost
        self.url = ""
        self._server: asyncio.Server | None = None
        self._http = httpx.AsyncClient(base_url=self.upstream_url, timeout=60)

    @classmethod
    @contextlib.asynccontextmanager
    async def serving(cls, upstream_url: str, every: int = 2) -> AsyncIterator[AnswerDropper]:
        dropper = cls(upstream_url, every)
        dropper._server = await asyncio.start_server(dropper._serve, "127.0.0.1", 0)
        port = dropper._server.sockets[0].getsockname()[1]
        dropper.url = f"http://127.0.0.1:{port}"
        try:
            yield dropper
        finally:
            dropper._server.close()
            await dropper._http.aclose()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = [tuple(h.split(":", 1)) for h in lines[1:] if h]
                length = next(
                    (int(v) for k, v in headers if k.strip().lower() == "content-length"), 0
                )
                body = await reader.readexactly(length) if length else b""
                forwarded = {
                    k.strip(): v.strip()
                    for k, v in headers
                    if k.strip().lower().encode() not in HOP_BY_HOP
                }
                answer = await self._http.request(
                    method, target, content=body or None, headers=forwarded
                )
                if method == "POST" and target.split("?")[0] in CREATES:
                    self.creates += 1
                    if self.creates % self.every == 0:
                        self.dropped += 1
                        writer.transport.abort()  # made, and the client cannot know it
                        return
                out = [f"HTTP/1.1 {answer.status_code} {answer.reason_phrase}".encode()]
                for k, v in answer.headers.raw:
                    if k.lower() not in HOP_BY_HOP:
                        out.append(k + b": " + v)
                out.append(b"content-length: " + str(len(answer.content)).encode())
                writer.write(b"\r\n".join(out) + b"\r\n\r\n" + answer.content)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()
