"""Run Alembic programmatically (``jobfair migrate``, the server's start-up, tests)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import sysconfig
from pathlib import Path

from alembic.config import Config
from alembic.script import ScriptDirectory
from alembic.util import CommandError

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


def head_revision() -> str | None:
    script = ScriptDirectory.from_config(alembic_config("unused"))
    return script.get_current_head()


def known(revision: str | None) -> bool:
    """Whether ``revision`` is one of this version's migrations (None, an empty database,
    is behind them all); False: the database was migrated by a newer version."""
    if revision is None:
        return True
    script = ScriptDirectory.from_config(alembic_config("unused"))
    try:
        return script.get_revision(revision) is not None
    except CommandError:  # "Can't locate revision"
        return False
