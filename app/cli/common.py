"""What the operators' commands share: the consoles (progress on stderr, so that stdout
holds the result), one-line failures, how durations, shares and instants read."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import typer
from rich.table import Table
from rich.text import Text

from app.cli.client import (
    CommandFailed,
    Server,
)
from app.console import progress_bar, stderr, stdout


def fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(printable(message), err=True)  # a problem's detail may quote what was sent
    return typer.Exit(code)


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with every control character written as ``\\xNN``: a worker's name, an
    error message or a tenant id comes from whoever called the API, and an escape
    sequence in it would otherwise reach the operator's terminal (colours, its title,
    on some terminals the clipboard)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


@contextlib.contextmanager
def connected(url: str, key: str | None) -> Iterator[Server]:
    """The server at ``url``; a failure on the way is printed as its one line."""
    try:
        with Server(url, key) as server:
            yield server
    except CommandFailed as exc:
        raise fail(exc.message, exc.code) from None


def print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, ensure_ascii=False))


def duration(ms: float | None) -> str:
    """``850ms``, ``12.3s``, ``4m05s``, ``2h03m``, ``3d04h``: short, and one token."""
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{ms:.0f}ms"
    s = ms / 1000
    if s < 60:
        return f"{s:.1f}s"
    m, s = divmod(int(s), 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def percent(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.1f}%"


def instant(value: str | None) -> str:
    """An RFC 3339 instant to the second (the server gives microseconds)."""
    if not value:
        return "-"
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        return value
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def shown(value: Any) -> str:
    return "-" if value is None else str(value)


def add_row(table: Table, *cells: str, style: str | None = None) -> None:
    """A row of plain text: tenant ids, types and messages are not rich markup, nor
    terminal control (printable)."""
    table.add_row(*(Text(printable(c)) for c in cells), style=style)


__all__ = [
    "add_row",
    "connected",
    "duration",
    "fail",
    "instant",
    "percent",
    "print_json",
    "printable",
    "progress_bar",
    "shown",
    "stderr",
    "stdout",
]
