"""A TCP relay in front of a PostgreSQL server that can fall silent, as the server's host
does when it is lost without a word (powered off, or cut off by the network): every
connection stays open and nothing more comes back on it, and a new connection is
accepted and never answered.  A server killed on this machine is not like that: its
kernel resets every connection at once, and refuses new ones.
"""

from __future__ import annotations

import asyncio
import contextlib

CHUNK_BYTES = 64 * 1024


class SilentHost:
    """Relays 127.0.0.1:``port`` to ``target``: a port on 127.0.0.1, or a Unix socket."""

    def __init__(self, target: int | str) -> None:
        self.target = target
        self.port = 0
        self.silent = False
        self._server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task[None]] = set()
        self._held: list[asyncio.StreamWriter] = []  # clients' connections
        self._upstream: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def silence(self) -> None:
        """From now on nothing is relayed, either way, and no client's connection is
        closed.  The server's side is (it is gone with its host: its sessions end)."""
        self.silent = True
        for pump in self._pumps:
            pump.cancel()
        for writer in self._upstream:
            writer.transport.abort()

    async def close(self) -> None:
        self.silence()
        if self._server is not None:
            self._server.close()
        for writer in self._held:
            writer.transport.abort()
        await asyncio.gather(*self._pumps, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._held.append(writer)
        if self.silent:
            return
        try:
            if isinstance(self.target, str):
                up_reader, up_writer = await asyncio.open_unix_connection(self.target)
            else:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.transport.abort()
            return
        self._upstream.append(up_writer)
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            pump = asyncio.create_task(self._pump(source, sink, (writer, up_writer)))
            self._pumps.add(pump)
            pump.add_done_callback(self._pumps.discard)

    async def _pump(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        both: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await source.read(CHUNK_BYTES):
                sink.write(data)
                await sink.drain()
        # The connection ended while the host could still speak: end both sides, as
        # the server's kernel would.
        for w in both:
            w.transport.abort()
