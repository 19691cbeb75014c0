"""Run Alembic programmatically (``jobfair migrate``, the server's start-up, tests)."""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path

from alembic.config import Config
from alembic.script import ScriptDirectory

from alembic import command

ROOT = Path(__file__).resolve().parent.parent


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
