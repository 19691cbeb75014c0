"""Run Alembic programmatically (``jobfair migrate``, the server's start-up, tests).

Alembic is imported only to migrate: importing it (and SQLAlchemy with it) took 0.5 s of
every process's start, each server process and every CLI command, where a server on a
migrated database only needs the revisions' names, read here from their files.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import re
import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING

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
    """Migrate to head.  Safe to call from inside a running event loop."""
    from alembic import command

    cfg = alembic_config(url)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        command.upgrade(cfg, "head")
        return
    # env.py calls asyncio.run(); give it a thread of its own.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(command.upgrade, cfg, "head").result()


# The lines alembic's template writes in every revision file (alembic/script.py.mako),
# with either quotes (ruff format makes them double).
_REVISION = re.compile(r"""^revision: str = ["']([^"']+)["']$""", re.MULTILINE)
_DOWN_REVISION = re.compile(
    r"""^down_revision: str \| None = (?:["']([^"']+)["']|None)$""", re.MULTILINE
)


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
