"""A TCP proxy in front of PostgreSQL for the network scenarios: it adds latency, and it
cuts connections -- one, or all at once -- as a failing network or a restarted firewall
does (the socket is reset, whatever is in flight, a transaction's statements or its
COMMIT, is lost).

Servers are given ``proxy.url`` instead of the database's own; the test reads the
outcome over the database's own URL, past the proxy.  Upstream is the URL's host and
port: a TCP address, or, for a host that is a directory (the embedded server listens on
a Unix socket only), the socket ``<dir>/.s.PGSQL.<port>`` in it.

    async with PgProxy.serving(db_url) as proxy:
        spawn_server(JOBFAIR_DATABASE_URL=proxy.url)
        proxy.latency_s = 0.2      # every piece, each way, from now on
        proxy.cut_one(rng)         # reset one connection
        proxy.cut_all()            # reset every connection
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit


@dataclass(eq=False)  # by identity: a set of links
class _Link:
    """One client connection and its upstream one, piped both ways."""

    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        self.client.close()
        self.upstream.close()

    def reset(self) -> None:
        # abort(): a reset, not an orderly close -- what a dead network leaves.
        self.client.transport.abort()
        self.upstream.transport.abort()
        for t in self.tasks:
            t.cancel()


class PgProxy:
    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self.latency_s = 0.0
        self.links: set[_Link] = set()
        self.accepted = 0
        self.cuts = 0  # connections reset by cut_one / cut_all
        self._server: asyncio.Server | None = None
        parts = urlsplit(database_url)
        query = dict(parse_qsl(parts.query))
        self._host = query.pop("host", None) or parts.hostname or "127.0.0.1"
        self._port = int(query.pop("port", None) or parts.port or 5432)
        self._query = query
        self._parts = parts

    @classmethod
    @contextlib.asynccontextmanager
    async def serving(cls, database_url: str) -> AsyncIterator[PgProxy]:
        proxy = cls(database_url)
        await proxy.start()
        try:
            yield proxy
        finally:
            await proxy.stop()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in list(self.links):
            link.reset()
        if self._server is not None:
            await self._server.wait_closed()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        """The database's URL with the proxy as its host (no TLS: it would hide nothing
        from a proxy that only copies bytes, and the embedded server has none)."""
        user = self._parts.username or "postgres"
        query = urlencode({**self._query, "sslmode": "disable"})
        return urlunsplit(
            ("postgresql", f"{user}@127.0.0.1:{self.port}", self._parts.path, query, "")
        )

    def cut_one(self, rng: random.Random) -> bool:
        """Reset one connection, chosen with ``rng``; False if there was none."""
        if not self.links:
            return False
        link = rng.choice(sorted(self.links, key=id))
        self._cut(link)
        return True

    def cut_all(self) -> int:
        """Reset every connection open now; how many there were."""
        links = list(self.links)
        for link in links:
            self._cut(link)
        return len(links)

    def _cut(self, link: _Link) -> None:
        self.links.discard(link)
        link.reset()
        self.cuts += 1

    async def _open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._host.startswith("/"):
            return await asyncio.open_unix_connection(f"{self._host}/.s.PGSQL.{self._port}")
        return await asyncio.open_connection(self._host, self._port)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            up_reader, up_writer = await self._open_upstream()
        except OSError:
            writer.transport.abort()  # the database away: so is the proxy's far side
            return
        link = _Link(writer, up_writer)
        self.links.add(link)
        link.tasks = [
            asyncio.create_task(self._pipe(reader, up_writer)),
            asyncio.create_task(self._pipe(up_reader, writer)),
        ]
        await asyncio.wait(link.tasks, return_when=asyncio.FIRST_COMPLETED)
        if link in self.links:  # one side closed (not a cut): close the other as well
            self.links.discard(link)
            link.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy until EOF, each piece held back ``latency_s`` (read when it arrives, so a
        slow link still carries many pieces at once, in order)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    return
                await asyncio.sleep(max(0.0, due - loop.time()))
                writer.write(data)
                await writer.drain()

        delivering = asyncio.create_task(deliver())
        try:
            while data := await reader.read(65536):
                queue.put_nowait((loop.time() + self.latency_s, data))
            queue.put_nowait((0.0, b""))
            await delivering  # what was read before the end still goes through
        except OSError:
            pass
        finally:
            delivering.cancel()
            await asyncio.gather(delivering, return_exceptions=True)
