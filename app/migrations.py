"""Run Alembic programmatically (``jobfair migrate``, the server's start-up, tests).

Alembic is imported only to migrate: importing it (and SQLAlchemy with it) took 0.5 s of
every process's start, each server process and every CLI command, where a server on a
migrated database only needs the revisions' names, read here from their files.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import re
import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from alembic.config import Config


def _scripts_root() -> Path:
    """The folder of ``alembic.ini`` and ``alembic/``: the source tree around the package
    (a checkout, an editable install), else the copy an installed wheel put in
    ``<prefix>/share/jobfair`` (pyproject's data-files)."""
    source = Path(__file__).resolve().parent.parent
    if (source / "alembic.ini").is_file():
        return source
    return Path(sysconfig.get_path("data")) / "share" / "jobfair"


ROOT = _scripts_root()


def alembic_config(url: str) -> Config:
    from alembic.config import Config

    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(ROOT / "alembic"))
    cfg.attributes["url"] = url
    return cfg


def upgrade(url: str) -> None:
    """Migrate to head, then build the CONCURRENT indexes.  Safe to call from inside a
    running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        _upgrade(url)
        return
    # env.py calls asyncio.run(); give it a thread of its own.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(_upgrade, url).result()


def _upgrade(url: str) -> None:
    from alembic import command

    asyncio.run(_refuse_to_contract_under_older_servers(url))
    command.upgrade(alembic_config(url), "head")
    asyncio.run(build_concurrent(url))


# Every connection of a server (and of the CLI) names this version's head revision, as
# application_name "jobfair/<revision>" (app.db.connect): pg_stat_activity then shows which
# versions are connected to a database.
APPLICATION_PREFIX = "jobfair/"
# Set to 1 to contract the schema whatever servers are connected (docs/upgrading.md).
FORCE_ENV = "JOBFAIR_MIGRATE_FORCE"


def application_name() -> str:
    return f"{APPLICATION_PREFIX}{head_revision()}"


class ContractBlocked(RuntimeError):
    """A migration would contract the schema while servers it no longer serves are
    connected to the database."""


async def _refuse_to_contract_under_older_servers(url: str) -> None:
    """Before migrating: if a pending migration contracts the schema (declares an
    ``oldest_server`` above the database's), refuse while a connection of a server older
    than that bound is open (``servers_left_behind``), unless JOBFAIR_MIGRATE_FORCE=1.
    Expanding migrations never wait: older servers serve on through them."""
    if os.environ.get(FORCE_ENV) == "1":
        return
    from app.db.connect import connect

    conn = await connect(url)
    try:
        at = oldest = None
        if await conn.fetchval("SELECT to_regclass('alembic_version') IS NOT NULL"):
            at = await conn.fetchval("SELECT version_num FROM alembic_version")
        if await conn.fetchval("SELECT to_regclass('schema_compat') IS NOT NULL"):
            oldest = await conn.fetchval("SELECT oldest_server FROM schema_compat")
        bound = contract_bound(at, oldest)
        if bound is None:
            return
        left = await servers_left_behind(conn, bound)
    finally:
        await conn.close()
    if left:
        named = ", ".join(f"{n} connection(s) of {r}" for r, n in sorted(left.items()))
        raise ContractBlocked(
            f"migrating to {head_revision()} contracts the schema: it serves servers from"
            f" {bound} on, and servers of older versions are connected ({named}). Stop"
            f" them first (docs/upgrading.md), or set {FORCE_ENV}=1"
        )


def contract_bound(at: str | None, oldest: str | None) -> str | None:
    """The ``oldest_server`` the pending migrations (those after ``at``) raise the
    schema's bound to, if one raises it above ``oldest``; None: they only expand (or the
    database is empty: no server can be on it)."""
    if at is None or oldest is None:
        return None
    chain = _chain()
    pending, revision = [], head_revision()
    while revision is not None and revision != at:
        pending.append(revision)
        revision = chain.get(revision)
    raised = [b for r in pending if (b := _bounds().get(r)) is not None and b > oldest]
    return max(raised, default=None)


async def servers_left_behind(conn: Any, bound: str) -> dict[str, int]:
    """Per revision older than ``bound``: how many connections of servers of it are open
    to this database now (their application_name, "jobfair/<revision>")."""
    rows = await conn.fetch(
        "SELECT substr(application_name, $1) AS revision, count(*) AS n FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        "   AND application_name LIKE $2 GROUP BY 1",
        len(APPLICATION_PREFIX) + 1,
        APPLICATION_PREFIX + "%",
    )
    return {r["revision"]: r["n"] for r in rows if r["revision"] < bound}


# Indexes on tables that grow with jobs, built after the migrations with CREATE INDEX
# CONCURRENTLY (which cannot run in a migration's transaction): the servers go on writing
# while they are built.  A statement using one works without it, only slower, so a server
# may start before it exists.  An index left INVALID by an interrupted build is dropped
# and built again.  The migration lock's key 1, held for the session, makes concurrent
# ``jobfair migrate`` runs build them one after the other.
CONCURRENT = {
    # alembic 0016: the key caps' counts (jobfair_lock_and_count_keys).
    "jobs_active_key_idx": (
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_active_key_idx"
        " ON jobs (tenant_id, fairness_key, job_type) WHERE state = 'ACTIVATED'"
    ),
    # alembic 0016: whether any key has a cap of its own (every finish asks).
    "key_weights_capped_idx": (
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS key_weights_capped_idx"
        " ON key_weights (tenant_id) WHERE max_active_jobs IS NOT NULL"
    ),
    # alembic 0016: the held keys, released by a type's change and the leader's sweep.
    "lane_keys_held_idx": (
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS lane_keys_held_idx"
        " ON lane_keys (job_type) WHERE held"
    ),
    # alembic 0017: each fairness key's jobs waiting (CREATED, SCHEDULED, FAILED) in key
    # order, whose first is the key's head in a FIFO type (its claims and counts, ADR
    # 041).  Its predicate is spelled IS TRUE, and so are the statements that read it: no
    # other statement's "state = 'CREATED'" implies it, so none is planned on it (the
    # lanes' ready probes were, before it was).
    "jobs_waiting_key_idx": (
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_waiting_key_idx"
        " ON jobs (job_type, tenant_id, fairness_key, job_key)"
        " WHERE (state IN ('CREATED', 'SCHEDULED', 'FAILED')) IS TRUE"
    ),
    # alembic 0018: the tenants with a minimum (the lane reads of a type read their lanes
    # on top of the others, ADR 042; every lead claim asks whether there is one).
    "tenants_min_idx": (
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS tenants_min_idx"
        " ON tenants (tenant_id) WHERE min_active_jobs > 0"
    ),
}
# The migration that adds what each index covers: a database at an older one (a build
# run beside a rolling upgrade that has not reached it) builds only the indexes it can.
CONCURRENT_SINCE = {
    "jobs_active_key_idx": "0016",
    "key_weights_capped_idx": "0016",
    "lane_keys_held_idx": "0016",
    "jobs_waiting_key_idx": "0017",
    "tenants_min_idx": "0018",
}


async def build_concurrent(url: str) -> None:
    from app.db.connect import connect
    from app.db.locks import MIGRATION_LOCK_CLASS

    conn = await connect(url)
    try:
        # Tried, not waited for: a build CONCURRENTLY waits for every transaction open
        # when it starts, and a session waiting for the lock would be one (a deadlock).
        try_lock = f"SELECT pg_try_advisory_lock({MIGRATION_LOCK_CLASS}, 1)"
        while not await conn.fetchval(try_lock):  # noqa: ASYNC110 (another session's lock: no event)
            await asyncio.sleep(0.2)
        at = await conn.fetchval("SELECT version_num FROM alembic_version")
        for name, create in CONCURRENT.items():
            if at is None or CONCURRENT_SINCE[name] > at:
                continue
            valid = await conn.fetchval(
                "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                " WHERE c.relname = $1 AND pg_table_is_visible(c.oid)",
                name,
            )
            if valid is False:
                await conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
            if valid is not True:
                await conn.execute(create)
    finally:
        await conn.close()  # the session lock goes with it


# The lines alembic's template writes in every revision file (alembic/script.py.mako),
# with either quotes (ruff format makes them double).
_REVISION = re.compile(r"""^revision: str = ["']([^"']+)["']$""", re.MULTILINE)
_DOWN_REVISION = re.compile(
    r"""^down_revision: str \| None = (?:["']([^"']+)["']|None)$""", re.MULTILINE
)


_OLDEST_SERVER = re.compile(r"""^oldest_server = ["']([^"']+)["']$""", re.MULTILINE)


@functools.cache
def _bounds() -> dict[str, str]:
    """Each revision's declared ``oldest_server`` (alembic 0009 on)."""
    bounds = {}
    for path in sorted((ROOT / "alembic" / "versions").glob("*.py")):
        text = path.read_text()
        revision, bound = _REVISION.search(text), _OLDEST_SERVER.search(text)
        if revision is not None and bound is not None:
            bounds[revision.group(1)] = bound.group(1)
    return bounds


@functools.cache
def _chain() -> dict[str, str | None]:
    """Each of this version's revisions and the one it follows (read once: /readyz asks
    on every probe).  tests/integration/test_migrations.py checks it against Alembic's."""
    chain: dict[str, str | None] = {}
    for path in sorted((ROOT / "alembic" / "versions").glob("*.py")):
        text = path.read_text()
        revision, down = _REVISION.search(text), _DOWN_REVISION.search(text)
        if revision is None or down is None:
            raise RuntimeError(f"{path}: no revision and down_revision lines as alembic writes")
        chain[revision.group(1)] = down.group(1)
    return chain


def head_revision() -> str | None:
    """This version's newest migration: the one no other follows."""
    chain = _chain()
    heads = set(chain) - set(chain.values())
    if len(heads) > 1:
        raise RuntimeError(f"migrations with several heads: {sorted(heads)}")
    return next(iter(heads), None)


def _revisions() -> frozenset[str]:
    return frozenset(_chain())


def serves(revision: str | None, oldest_server: str | None) -> bool:
    """Whether this server can serve a database at ``revision``: at this version's head,
    or migrated past it by a newer version whose schema still serves servers as old as
    ``oldest_server`` (alembic 0009), one of this version's own revisions.  A database
    behind the head needs ``jobfair migrate`` first."""
    if revision == head_revision():
        return True
    return not known(revision) and oldest_server is not None and known(oldest_server)


def known(revision: str | None) -> bool:
    """Whether ``revision`` is one of this version's migrations (None, an empty database,
    is behind them all); False: the database was migrated by a newer version."""
    return revision is None or revision in _revisions()
