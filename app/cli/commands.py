"""The operators' commands, over HTTP to a running server (``stats``, ``tenants``,
``job-types``, ``jobs``, ``workers``), added to the ``jobfair`` command with
``--version``.  Tables and progress bars are for people; ``--json`` prints the server's
own JSON for scripts.  Every failure is one line on stderr and exit status 1 (2 for a
bad command line)."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich import box
from rich.table import Table

from app import __version__
from app.cli.browse import TypeFilter, jobs_cli
from app.cli.client import (
    DEFAULT_URL,
    Json,
    Key,
    Url,
)
from app.cli.common import add_row, connected, duration, instant, print_json, shown, stdout
from app.cli.stats import stats
from app.cli.tenancy import job_types_cli, tenants_cli

# -- workers ----------------------------------------------------------------------------


def workers(
    job_type: TypeFilter = None,
    url: Url = DEFAULT_URL,
    key: Key = None,
    as_json: Json = False,
) -> None:
    """The workers (by their worker name) that activated jobs lately, per job type."""
    with connected(url, key) as server:
        answer = server.call("GET", "/v2/workers", params={"type": job_type})
    if as_json:
        print_json(answer)
        return
    now = datetime.now(UTC)
    table = Table(box=box.SIMPLE, pad_edge=False, collapse_padding=True)
    for name in ("type", "worker", "last seen", "ago"):
        table.add_column(name)
    for w in answer["items"]:
        seen = w.get("lastSeenAt")
        ago = None
        with contextlib.suppress(TypeError, ValueError):
            ago = (now - datetime.fromisoformat(seen)).total_seconds() * 1000
        add_row(table, w["type"], shown(w.get("worker")), instant(seen), duration(ago))
    stdout().print(table)


# -- the command tree -------------------------------------------------------------------


def version(value: bool) -> None:
    """The release, and the schema revision it migrates to (CHANGELOG.md says which
    revisions contract: docs/upgrading.md)."""
    if value:
        from app import migrations  # only here: the commands over HTTP need none of it

        typer.echo(f"jobfair {__version__} (schema {migrations.head_revision()})")
        raise typer.Exit()


def root(
    show_version: Annotated[
        bool | None,
        typer.Option(
            "--version", callback=version, is_eager=True, help="print the version and exit"
        ),
    ] = None,
) -> None:
    """Jobfair job activation service"""


def register(cli: typer.Typer) -> None:
    """Add these commands (and ``--version``) to the ``jobfair`` command."""
    cli.callback()(root)
    cli.command()(stats)
    cli.add_typer(tenants_cli, name="tenants")
    cli.add_typer(job_types_cli, name="job-types")
    cli.add_typer(jobs_cli, name="jobs")
    cli.command()(workers)
