"""``jobfair serve --workers N``: N processes, each accepting on a socket of its own."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from urllib.parse import urlsplit

import httpx
import psutil
import pytest

from tests.fixtures import ServerProcess, wait_ready


def _workers(server: ServerProcess) -> list[psutil.Process]:
    workers = []
    for child in psutil.Process(server.proc.pid).children():
        try:
            if "spawn_main" in " ".join(child.cmdline()):
                workers.append(child)
        except psutil.ZombieProcess:  # one that died, not yet reaped by the supervisor
            pass
    return workers


async def _until(condition, timeout_s: float = 30) -> None:
    """Polls a condition of other processes (no event to wait on)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


async def _ready(server: ServerProcess) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        await wait_ready(c, server)


def _stop(server: ServerProcess) -> None:
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=30) == 0


async def test_connections_are_spread_over_the_server_processes(spawn_server):
    """Connections opened while one process is busy (here: stopped) still get spread:
    with one shared socket the free process accepted every one of them (as the first
    process to start took a drain's 32 connections), and kept them while they were kept
    alive.  With a socket per process the busy one's share waits for it."""
    server = spawn_server(JOBFAIR_WORKERS="2")
    await _ready(server)
    busy, free = _workers(server)
    u = urlsplit(server.url)
    busy.suspend()
    try:
        streams = [await asyncio.open_connection(u.hostname, u.port) for _ in range(32)]
        for _, writer in streams:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        answers = [asyncio.create_task(reader.readline()) for reader, _ in streams]
        # What the free process answers while the other cannot: all 32 with a shared
        # socket (it accepts every connection), about half with a socket each.
        await asyncio.wait(answers, timeout=2)
    finally:
        busy.resume()
    for answer in answers:
        assert (await answer).startswith(b"HTTP/1.1 200")
    per_process = [
        sum(
            1
            for c in p.net_connections(kind="tcp")
            if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == u.port
        )
        for p in (busy, free)
    ]
    for _, writer in streams:
        writer.close()
    assert sum(per_process) == 32
    assert min(per_process) >= 4, per_process  # a fair split fails this ~1 in 10^6
    _stop(server)


def _exited(process: psutil.Process) -> bool:
    """Exited, whether or not its parent has reaped it yet."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _listening_sockets(process: psutil.Process, port: int) -> set[str]:
    return {
        os.readlink(f"/proc/{process.pid}/fd/{c.fd}")
        for c in process.net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    }


async def test_each_server_process_listens_on_a_socket_of_its_own(spawn_server):
    server = spawn_server(JOBFAIR_WORKERS="2")
    await _ready(server)
    port = urlsplit(server.url).port
    first, second = (_listening_sockets(p, port) for p in _workers(server))
    assert len(first) == len(second) == 1
    assert first != second  # "socket:[inode]": not one socket shared
    _stop(server)


async def test_a_server_process_that_dies_is_replaced(spawn_server):
    server = spawn_server(JOBFAIR_WORKERS="2")
    await _ready(server)
    first = {p.pid for p in _workers(server)}
    assert len(first) == 2
    victim = first.pop()
    os.kill(victim, signal.SIGKILL)
    await _until(lambda: {p.pid for p in _workers(server)} - first - {victim})
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        await wait_ready(c, server)
        for _ in range(20):  # new connections, spread over the survivor and the new one
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as fresh:
                assert (await fresh.get("/readyz")).status_code == 200
    assert len(_workers(server)) == 2
    _stop(server)


async def test_sigterm_stops_every_server_process(spawn_server):
    server = spawn_server(JOBFAIR_WORKERS="2")
    await _ready(server)
    workers = _workers(server)
    _stop(server)
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive


async def test_server_processes_stop_when_their_supervisor_is_killed(spawn_server):
    server = spawn_server(JOBFAIR_WORKERS="2")
    await _ready(server)
    workers = _workers(server)
    server.proc.kill()
    server.proc.wait()
    gone, alive = psutil.wait_procs(workers, timeout=20)
    assert not alive  # else they would hold the port and the database


async def test_a_port_in_use_is_refused(spawn_server, db_url):
    server = spawn_server(JOBFAIR_WORKERS="2")
    await _ready(server)
    port = str(urlsplit(server.url).port)
    env = {**os.environ, "JOBFAIR_DATABASE_URL": db_url, "JOBFAIR_WORKERS": "2"}
    second = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "app.cli", "serve", "--port", port],
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(second.communicate(), timeout=60)
    assert second.returncode == 1
    assert b"cannot listen on" in stderr
    _stop(server)


async def test_a_process_whose_app_fails_to_start_stops_the_server(spawn_server, store):
    """Exit code 3, as one process would, not a loop of replacements failing the same way.
    Here each process's pool asks for more connections than PostgreSQL allows."""
    allowed = int(await store.fetchval("SHOW max_connections"))
    server = spawn_server(JOBFAIR_WORKERS="2", JOBFAIR_DB_POOL_SIZE=str(allowed + 1))
    assert await asyncio.to_thread(server.proc.wait, 60) == 3
    assert b"failed to start; stopping" in server.log.read_bytes()


async def test_no_process_listens_until_every_process_has_started(spawn_server, store):
    """A connection made while a process is still starting would wait in its backlog
    (~1 s of pool warm-up) while the others are free.  The processes listen together
    once every app has started.  Here their start-up is held on a lock (their pools'
    warm-up touches ``jobs``), then one of them is stopped while the other finishes."""
    async with store.connection() as conn:
        async with conn.transaction():
            await conn.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
            server = spawn_server(JOBFAIR_WORKERS="2", JOBFAIR_DB_POOL_SIZE="2")
            u = urlsplit(server.url)
            waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            # Each pool's first connection warms up before the others open: two waiting
            # on the lock are one of each process.
            while await store.fetchval(waiting) < 2:
                assert server.proc.poll() is None, server.log.read_text()
                await asyncio.sleep(0.1)
            with pytest.raises(ConnectionRefusedError):
                await asyncio.open_connection(u.hostname, u.port)
            held, other = _workers(server)
            held.suspend()
    try:
        await _until(lambda: b"has started" in server.log.read_bytes())
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection(u.hostname, u.port)
    finally:
        held.resume()
    await _ready(server)
    assert b"all 2 server processes have started: listening" in server.log.read_bytes()
    port = u.port
    assert all(len(_listening_sockets(p, port)) == 1 for p in (held, other))
    _stop(server)


async def test_a_second_signal_while_stopping_kills_the_processes_and_waits_for_them(
    spawn_server,
):
    """The supervisor's exit is followed by the embedded PostgreSQL's stop, so it must
    not return while a server process still runs: a second SIGTERM while it waits for a
    slow process kills that process, and the supervisor exits only when it is gone.
    Here the slow process is a stopped one (SIGSTOP), which cannot act on SIGTERM."""
    server = spawn_server(JOBFAIR_WORKERS="2")
    await _ready(server)
    slow, other = _workers(server)
    slow.suspend()
    try:
        server.proc.send_signal(signal.SIGTERM)
        await _until(lambda: _exited(other))
        server.proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(server.proc.wait, 30)
        assert not psutil.pid_exists(slow.pid)
    finally:
        if psutil.pid_exists(slow.pid):
            slow.kill()
