"""The ``jobfair`` command: ``serve``, ``migrate`` and ``keys``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import logging.config
import os
import re
import signal
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from pydantic import ValidationError

from app import demo, embedded, logs, migrations
from app.api.schemas import instant
from app.cli import commands
from app.config import Settings, is_loopback
from app.db import Database, StoreUnavailable, citus, maintenance
from app.db.bounds import RESTORE_COUNT_GAP, RESTORE_KEY_GAP
from app.db.pool import (
    CONNECT_ERRORS,
    connect_error,
    ping_url,
    revision_at,
    until_reachable,
    without_password,
)
from app.db.rows import KeyRow
from app.domain import JOB_TYPE_RE, TENANT_ID_RE, utcnow
from app.infra import supervisor
from app.keys import KEY_ID_RE, KeyService, Role, key_record

log = logging.getLogger("app.cli")  # also when run as ``python -m app.cli``

cli = typer.Typer(add_completion=False, no_args_is_help=True, help="Jobfair job activation service")

DataDir = Annotated[
    Path | None,
    typer.Option(
        help="the folder of the embedded PostgreSQL (its data folder is pgdata in it)",
        show_default="JOBFAIR_DATA_DIR, else .jobfair",
    ),
]
DatabaseUrl = Annotated[
    str | None,
    typer.Option(help="postgresql:// URL", show_default="JOBFAIR_DATABASE_URL, else embedded"),
]


# How long an idle keep-alive connection stays open.  Longer than the clients' own idle
# expiry (httpx 5 s, as in Camunda's Python SDK; Node's agent 4-5 s; Java clients up to
# 60 s): a server that closes first races a client reusing the connection at that moment,
# and a worker's complete call that loses that race fails (uvicorn's default is 5 s).
IDLE_CONNECTION_TIMEOUT_S = 75
# After SIGTERM, how long calls in flight may take to finish (uvicorn's graceful timeout).
# Long polls are not among them: they are answered at once, however long their
# requestTimeout; an orchestrator's grace before SIGKILL must exceed this (deploy/).
GRACEFUL_SHUTDOWN_S = 10
# Descriptors a server process needs beside one per waiter and per pooled connection:
# requests not waiting, connections between requests, the LISTEN connection, its logs.
DESCRIPTORS_BESIDE_WAITERS = 1024


def _unset(name: str) -> str:
    """What an option left out falls back to, as --help shows it."""
    default = Settings.model_fields[name].default
    return f"JOBFAIR_{name.upper()}, else {'embedded' if default is None else default}"


def _settings(**overrides: Any) -> Settings:
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return Settings(**given)
    except ValidationError as exc:
        lines = [_setting_error(error, given) for error in exc.errors()]
        typer.echo("invalid configuration:\n" + "\n".join(lines), err=True)
        raise typer.Exit(2) from None


def _setting_error(error: Any, given: dict[str, Any]) -> str:
    """``JOBFAIR_DB_POOL_SIZE: Input should be ... (got '0')``: named as the operator set
    it, the environment variable (and the option, if one was given)."""
    field = str(error["loc"][0]) if error["loc"] else "?"
    name = f"JOBFAIR_{field.upper()}"
    if field in given:
        name = f"--{field.replace('_', '-')} ({name})"
    # A URL's password must not reach the terminal (or a CI log).
    got = "" if field in ("database_url", "database_session_url") else f" (got {error['input']!r})"
    return f"  {name}: {error['msg']}{got}"


def resolve_database(settings: Settings, *, supervise: bool = False) -> str:
    """The configured URL, or the embedded server's (started now, stopped at exit, and
    with ``supervise`` started again whenever it dies)."""
    if settings.database_url:
        return settings.database_url
    if not embedded.available():
        typer.echo(
            "JOBFAIR_DATABASE_URL is not set, and this install has no embedded PostgreSQL "
            "(the container image never has): set it to postgresql://user:password@host:5432/db",
            err=True,
        )
        raise typer.Exit(2)
    log.info("starting embedded PostgreSQL in %s/pgdata", settings.data_dir)
    server, _ = embedded.start(settings.data_dir)
    if supervise:
        embedded.Watchdog(server).start()
    return embedded.ensure_database(server, "jobfair")


@cli.command()
def serve(
    host: Annotated[
        str | None, typer.Option(help="address to listen on", show_default=_unset("host"))
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="port to listen on", show_default=_unset("port"))
    ] = None,
    data_dir: DataDir = None,
    database_url: DatabaseUrl = None,
    workers: Annotated[
        int | None, typer.Option(help="server worker processes", show_default=_unset("workers"))
    ] = None,
    log_level: Annotated[
        str | None,
        typer.Option(help="level of every logger", show_default="JOBFAIR_LOG_LEVEL, else info"),
    ] = None,
    ssl_certfile: Annotated[
        Path | None,
        typer.Option(
            help="TLS certificate chain (PEM); serves HTTPS",
            show_default="JOBFAIR_SSL_CERTFILE, else none: HTTP",
        ),
    ] = None,
    ssl_keyfile: Annotated[
        Path | None,
        typer.Option(help="TLS private key (PEM)", show_default="JOBFAIR_SSL_KEYFILE, else none"),
    ] = None,
) -> None:
    """Start PostgreSQL if needed, migrate, and serve the API."""
    settings = _settings(
        host=host,
        port=port,
        data_dir=data_dir,
        database_url=database_url,
        workers=workers,
        log_level=log_level,
        ssl_certfile=ssl_certfile,
        ssl_keyfile=ssl_keyfile,
    )
    ssl_certfile, ssl_keyfile = settings.ssl_certfile, settings.ssl_keyfile
    if settings.auth_mode == "off" and not is_loopback(settings.host):
        typer.echo(
            f"refusing to serve on {settings.host} with JOBFAIR_AUTH=off: auth may be off "
            "only on loopback.  Unset JOBFAIR_AUTH (on any other address auth is required), "
            "make a key with `jobfair keys create --role admin` (same --data-dir or "
            "--database-url as serve), and send it as 'Authorization: Bearer <secret>'.",
            err=True,
        )
        raise typer.Exit(2)
    if (ssl_certfile is None) != (ssl_keyfile is None):
        typer.echo(
            "give --ssl-certfile and --ssl-keyfile (JOBFAIR_SSL_CERTFILE, JOBFAIR_SSL_KEYFILE) "
            "together",
            err=True,
        )
        raise typer.Exit(2)
    # The same configuration in every server process: uvicorn applies it in each.
    log_config = logs.config(settings.log_format, settings.log_level)
    logging.config.dictConfig(log_config)
    url = resolve_database(settings, supervise=True)
    if settings.migrate_on_start:
        _migrate_when_reachable(url, settings)
    else:
        _until_migrated(url, settings)
    # Worker processes read their settings from the environment.
    os.environ["JOBFAIR_DATABASE_URL"] = url
    os.environ["JOBFAIR_HOST"] = settings.host
    os.environ["JOBFAIR_PORT"] = str(settings.port)
    os.environ["JOBFAIR_AUTH"] = settings.auth_mode
    scheme = "https" if ssl_certfile else "http"

    def listening(bound_port: int) -> None:
        # Once every process listens: a URL printed earlier could be refused.
        log.info("Jobfair serving on %s", base_url(scheme, settings.host, bound_port))
        if settings.auth_mode == "required":
            log.info(
                "API keys are required.  Make the first with `jobfair keys create --role "
                "admin` (same --data-dir or --database-url); then more with it, over "
                "POST /v2/keys."
            )
        else:
            log.info("auth is off (loopback only): every caller may do everything")

    # uvicorn shuts down gracefully on SIGTERM/SIGINT and then re-raises the signal to the
    # handler that was installed before it; a graceful stop is a success, so exit 0 (and
    # let atexit stop the embedded PostgreSQL).
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_cleanly)
    supervisor.raise_descriptor_limit(
        settings.max_waiters + settings.db_pool_size + DESCRIPTORS_BESIDE_WAITERS
    )
    options: dict[str, Any] = {
        "loop": "uvloop",
        # httptools, with bounds on a request's time and size (app.infra.http).
        "http": "app.infra.http:ServeProtocol",
        "log_config": log_config,
        "log_level": settings.log_level,
        # Ours instead (JOBFAIR_ACCESS_LOG, app.api.tracing): with the request's id and
        # duration.
        "access_log": False,
        # Nothing here reads the client's address, so X-Forwarded-* need not be parsed
        # on every request.
        "proxy_headers": False,
        "timeout_graceful_shutdown": GRACEFUL_SHUTDOWN_S,
        "timeout_keep_alive": IDLE_CONNECTION_TIMEOUT_S,
    }
    if ssl_certfile is not None:
        options["ssl_certfile"] = str(ssl_certfile)
        options["ssl_keyfile"] = str(ssl_keyfile)
    if settings.workers == 1:
        # One process needs no shared metrics files; if PROMETHEUS_MULTIPROC_DIR is set
        # all the same, it writes there, so an earlier run's files go first.
        if os.environ.get(supervisor.MULTIPROC_ENV):
            supervisor.clear_metrics(os.environ[supervisor.MULTIPROC_ENV])
        supervisor.serve_one("app.asgi:app", settings.host, settings.port, options, listening)
    else:
        # A listening socket per process, not uvicorn's one shared socket (see supervisor).
        try:
            supervisor.refuse_if_taken(settings.host, settings.port)
        except OSError as exc:
            log.error("cannot listen on %s:%s: %s", settings.host, settings.port, exc)
            raise typer.Exit(1) from None
        supervisor.serve(
            "app.asgi:app", settings.host, settings.port, settings.workers, options, listening
        )


def base_url(scheme: str, host: str, port: int) -> str:
    """``http://[::1]:8080``: an IPv6 address in brackets, as a URL writes it."""
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def _migrate_when_reachable(url: str, settings: Settings) -> None:
    """Migrate once the database answers, waiting up to ``db_startup_wait_s`` for it: a
    server started during an outage (or with its database) comes up after it.  One that
    cannot be reached, or refuses us, is one line (which database, without its password,
    and the driver's reason) and exit code 1."""
    try:
        asyncio.run(until_reachable(lambda: ping_url(url), settings.db_startup_wait_s, "start-up"))
    except StoreUnavailable as exc:
        waited = f" (waited {settings.db_startup_wait_s} s)" if settings.db_startup_wait_s else ""
        _cannot_connect(url, exc.__cause__ or exc, waited)
    except CONNECT_ERRORS as exc:  # refused: a wrong password, no such database, a bad URL
        _cannot_connect(url, exc, "")
    revision, oldest_server = asyncio.run(revision_at(url))
    if revision != migrations.head_revision():  # at head, Alembic is not even imported
        if not migrations.known(revision):
            # Migrated by a newer version: never touched by this one.
            _refuse_unless_served(revision, oldest_server)
            return
        try:
            migrations.upgrade(url)
        except migrations.ContractBlocked as exc:
            typer.echo(f"jobfair: {exc}", err=True)
            raise typer.Exit(1) from None
    # On a Citus coordinator, the tables distributed as Jobfair needs them (idempotent).
    for line in asyncio.run(citus.distribute_at(url, settings.citus_shard_count)):
        log.info("citus: %s", line)


def _refuse_unless_served(revision: str | None, oldest_server: str | None) -> None:
    """Carry on, saying so, if this server serves the database's newer schema (a
    rolling upgrade migrated it first); else one line and exit code 1."""
    head = migrations.head_revision()
    if migrations.serves(revision, oldest_server):
        if revision != head:
            log.info(
                "the schema is at %s, newer than this server's %s, and still serves it "
                "(from %s on): serving without migrating",
                revision,
                head,
                oldest_server,
            )
        return
    typer.echo(
        f"the database's schema is at {revision}, newer than this server's {head}, and no "
        f"longer serves it (servers from {oldest_server or 'its own version'} on): "
        "run the newer version",
        err=True,
    )
    raise typer.Exit(1)


def _cannot_connect(url: str, exc: BaseException, waited: str) -> NoReturn:
    log.error(
        "cannot connect to the database %s%s: %s",
        without_password(url),
        waited,
        connect_error(exc),
    )
    raise typer.Exit(1)


def _until_migrated(url: str, settings: Settings) -> None:
    """Wait, up to ``db_startup_wait_s``, for the database to answer and for `jobfair
    migrate` (run apart: JOBFAIR_MIGRATE_ON_START=false) to bring it to this server's
    schema; a schema newer than this server knows fails at once."""
    head = migrations.head_revision()
    deadline = time.monotonic() + settings.db_startup_wait_s

    async def wait() -> tuple[str | None, str | None]:
        announced = False
        while True:
            left_s = max(0.0, deadline - time.monotonic())
            state = await until_reachable(lambda: revision_at(url), left_s, "start-up")
            revision = state[0]
            if revision == head or not migrations.known(revision) or left_s == 0:
                return state
            if not announced:
                typer.echo(
                    f"the schema is at {revision or 'nothing'}, this server needs {head}: "
                    f"waiting up to {left_s:.0f} s for `jobfair migrate`",
                    err=True,
                )
                announced = True
            await asyncio.sleep(min(1.0, left_s))

    try:
        revision, oldest_server = asyncio.run(wait())
    except StoreUnavailable as exc:
        waited = f" (waited {settings.db_startup_wait_s} s)" if settings.db_startup_wait_s else ""
        _cannot_connect(url, exc.__cause__ or exc, waited)
    if not migrations.known(revision):
        _refuse_unless_served(revision, oldest_server)
    elif revision != head:
        typer.echo(
            f"the database's schema is at {revision or 'nothing'}, this server needs {head}: "
            "run `jobfair migrate` (JOBFAIR_MIGRATE_ON_START=false leaves it to you)",
            err=True,
        )
        raise typer.Exit(1)
    _refuse_unless_distributed(url)


def _refuse_unless_distributed(url: str) -> None:
    """On a Citus coordinator whose tables are not distributed as Jobfair needs them
    (`jobfair migrate` distributes them), one line and exit code 1: a server on local
    tables of the coordinator would work, on one node, and nobody would know."""
    left = asyncio.run(citus.problems_at(url))
    if left:
        typer.echo(
            f"the database is a Citus coordinator, but {'; '.join(left)}: run `jobfair migrate`",
            err=True,
        )
        raise typer.Exit(1)


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


@cli.command()
def migrate(data_dir: DataDir = None, database_url: DatabaseUrl = None) -> None:
    """Migrate the database to the newest schema."""
    settings = _settings(data_dir=data_dir, database_url=database_url)
    logging.config.dictConfig(logs.config(settings.log_format, settings.log_level))
    url = resolve_database(settings)
    _migrate_when_reachable(url, settings)
    revision, _ = asyncio.run(revision_at(url))
    if migrations.known(revision):
        # Also at head: the indexes built CONCURRENTLY that an interrupted run left
        # invalid or unbuilt (cheap when every one is valid).
        asyncio.run(migrations.build_concurrent(url))
    typer.echo(f"schema at {revision}, indexes built ({without_password(url)})", err=True)


@cli.command()
def restored(
    data_dir: DataDir = None,
    database_url: DatabaseUrl = None,
    force: Annotated[
        bool, typer.Option("--force", help="fence even while Jobfair servers are connected")
    ] = False,
) -> None:
    """After restoring the database from a backup, before any server starts on it: fence
    off what the lost cluster did after the backup (docs/backup.md).  Job keys are drawn
    far past any it gave out, and every unfinished job's activationCount moves on, so no
    worker's late finish of an activation made after the backup completes a job."""
    settings = _settings(data_dir=data_dir, database_url=database_url)
    logging.config.dictConfig(logs.config(settings.log_format, settings.log_level))
    url = resolve_database(settings)
    at: str | None = "unread"
    with contextlib.suppress(Exception):  # unreachable: the migration's wait says so
        at = asyncio.run(revision_at(url))[0]
    if at is None:
        typer.echo(
            "jobfair: the database holds no Jobfair schema: it is not the restored one"
            " (for the embedded server, --data-dir is the folder that holds pgdata)",
            err=True,
        )
        raise typer.Exit(1)
    _migrate_when_reachable(url, settings)

    async def fence() -> tuple[int, int] | int:
        db = await Database.connect(url, size=1, min_size=1, acquire_timeout_s=10, wait_s=0)
        try:
            if not force and (connected := await maintenance.servers_connected(db)):
                return connected
            return await maintenance.fence_after_restore(db, RESTORE_KEY_GAP, RESTORE_COUNT_GAP)
        finally:
            await db.close()

    done = asyncio.run(fence())
    if isinstance(done, int):
        typer.echo(
            f"jobfair: {done} connection(s) of Jobfair servers are open to this database:"
            " stop them first (the fence must run before any server serves the restored"
            " database: docs/backup.md), or give --force",
            err=True,
        )
        raise typer.Exit(1)
    next_key, fenced = done
    typer.echo(
        f"new job keys from {next_key << 11} on; {fenced} unfinished jobs' activationCount "
        f"moved on by {RESTORE_COUNT_GAP}"
    )


keys_cli = typer.Typer(no_args_is_help=True, help="API keys (on the database directly)")
cli.add_typer(keys_cli, name="keys")


def _scope_option(raw: str, pattern: re.Pattern[str], what: str) -> list[str] | None:
    """``*`` (every one) or a comma-separated list, each checked as the API checks it."""
    if raw.strip() == "*":
        return None
    items = [item.strip() for item in raw.split(",")]
    for item in items:
        if not pattern.fullmatch(item):
            typer.echo(f"--{what}: {item!r} must match {pattern.pattern} (or give *)", err=True)
            raise typer.Exit(2)
    return items


def _run_keys(data_dir: Path | None, database_url: str | None, action: Any) -> Any:
    """Run ``action(keys)`` against the database (migrated first: this is how the first
    key of a new database is made, before any server ran on it)."""
    settings = _settings(data_dir=data_dir, database_url=database_url)
    # The audit line (key created, revoked: app.keys) goes to stderr.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("jobfair.audit").setLevel(logging.INFO)
    url = resolve_database(settings)
    _migrate_when_reachable(url, settings)

    async def run() -> Any:
        db = await Database.connect(url, size=1, min_size=1, acquire_timeout_s=10, wait_s=0)
        try:
            return await action(KeyService(db))
        finally:
            await db.close()

    return asyncio.run(run())


@keys_cli.command("create")
def keys_create(
    role: Annotated[Role, typer.Option(help="admin, producer or worker")],
    tenants: Annotated[str, typer.Option(help="comma-separated tenant ids, or *")] = "*",
    types: Annotated[str, typer.Option(help="comma-separated job types, or *")] = "*",
    name: Annotated[
        str | None, typer.Option(help="a name to know it by", show_default="none")
    ] = None,
    expires: Annotated[
        str | None,
        typer.Option(help="expiry, RFC 3339 (2027-01-31T00:00:00Z)", show_default="never"),
    ] = None,
    data_dir: DataDir = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Create a key; its secret is printed alone on the last line (and never again)."""
    tenant_scope = _scope_option(tenants, TENANT_ID_RE, "tenants")
    type_scope = _scope_option(types, JOB_TYPE_RE, "types")
    if role is Role.ADMIN and (tenant_scope is not None or type_scope is not None):
        typer.echo(
            "an admin key has every tenant and job type: leave out --tenants/--types", err=True
        )
        raise typer.Exit(2)
    if name is not None and (len(name) > 128 or "\x00" in name):
        typer.echo("--name: at most 128 characters, without NUL", err=True)
        raise typer.Exit(2)
    expires_at = None
    if expires is not None:
        try:
            expires_at = datetime.fromisoformat(instant("--expires")(expires))
        except ValueError as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(2) from None
        if expires_at <= utcnow():
            typer.echo("--expires must lie in the future", err=True)
            raise typer.Exit(2)

    async def create(keys: KeyService) -> tuple[KeyRow, str]:
        return await keys.create(role, tenant_scope, type_scope, name, expires_at, "cli")

    row, token = _run_keys(data_dir, database_url, create)
    record = key_record(row)
    typer.echo(
        f"key {row.key_id}: role {row.role}, tenants {_shown(record['tenants'])}, "
        f"types {_shown(record['types'])}, expires {record['expiresAt'] or 'never'}"
    )
    typer.echo("its secret, shown this once (send it as 'Authorization: Bearer <secret>'):")
    typer.echo(token)


def _shown(scope: Any) -> str:
    return scope if scope == "*" else ",".join(scope)


@keys_cli.command("list")
def keys_list(data_dir: DataDir = None, database_url: DatabaseUrl = None) -> None:
    """List keys (never their secrets), newest first, revoked ones too."""

    async def list_all(keys: KeyService) -> list[KeyRow]:
        return await keys.list()

    rows = _run_keys(data_dir, database_url, list_all)
    columns = ("keyId", "role", "tenants", "types", "name", "expiresAt", "lastUsedAt", "revokedAt")
    table: list[tuple[str, ...]] = [columns]
    for row in rows:
        record = key_record(row)
        table.append(
            tuple(
                _shown(record[c]) if c in ("tenants", "types") else str(record[c] or "-")
                for c in columns
            )
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(columns))]
    for r in table:
        typer.echo("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())


@keys_cli.command("revoke")
def keys_revoke(
    key_id: Annotated[str, typer.Argument(help="the key's id")],
    data_dir: DataDir = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Revoke a key: every server refuses it within a second."""

    if not KEY_ID_RE.fullmatch(key_id):
        typer.echo(f"a key id matches {KEY_ID_RE.pattern}, not {key_id!r}", err=True)
        raise typer.Exit(2)

    async def revoke(keys: KeyService) -> KeyRow | None:
        return await keys.revoke(key_id, "cli")

    if _run_keys(data_dir, database_url, revoke) is None:
        typer.echo(f"no key {key_id}", err=True)
        raise typer.Exit(1)
    typer.echo(f"revoked {key_id}")


# The commands over HTTP (app.cli.commands), the demo (app.demo), and --version.
commands.register(cli)
demo.register(cli)


def main() -> None:
    sys.exit(cli())


if __name__ == "__main__":
    main()
