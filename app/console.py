"""The terminal, as the ``jobfair`` commands and the demo write to it: stdout for results,
stderr for progress."""

from __future__ import annotations

import os

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)


def stdout() -> Console:
    """Made per command (typer's test runner swaps sys.stdout for each).  Piped, the
    tables are as wide as they need (rich would cut them to 80 columns)."""
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=250)
    return console


def stderr() -> Console:
    return Console(stderr=True)


def progress_bar(console: Console) -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
