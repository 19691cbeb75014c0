"""Run Alembic programmatically (``jobfair migrate``, the server's start-up, tests)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import sysconfig
from pathlib import Path

from alembic.config import Config
from alembic.script import ScriptDirectory

from alembic import command


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
    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(ROOT / "alembic"))
    cfg.attributes["url"] = url
    return cfg


def upgrade(url: str) -> None:
    """Migrate to head.  Safe to call from inside a running event loop."""
    cfg = alembic_config(url)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        command.upgrade(cfg, "head")
        return
    # env.py calls asyncio.run(); give it a thread of its own.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(command.upgrade, cfg, "head").result()


@functools.cache
def head_revision() -> str | None:
    """This version's newest migration (read once: /readyz asks on every probe)."""
    script = ScriptDirectory.from_config(alembic_config("unused"))
    return script.get_current_head()


@functools.cache
def _revisions() -> frozenset[str]:
    script = ScriptDirectory.from_config(alembic_config("unused"))
    return frozenset(r.revision for r in script.walk_revisions())


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
