"""``jobfair stats``: the shares, holds and backlogs of each lane, once or watched."""

from __future__ import annotations

import contextlib
import json
import time
from datetime import datetime
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from app.cli.client import (
    DEFAULT_URL,
    CommandFailed,
    Json,
    Key,
    Server,
    Url,
)
from app.cli.common import add_row, connected, duration, percent, print_json, stdout

# -- stats ------------------------------------------------------------------------------


HELD_BY = {
    "tenantPaused": "tenant paused",
    "typePaused": "type paused",
    "tenantCap": "tenant's cap",
    "typeCap": "type's cap",
    "tenantRate": "tenant's rate limit",
    "typeRate": "type's rate limit",
    "keyCap": "fairness key's cap",
    "perKeyCap": "type's cap per fairness key",
}


def hold_notes(lane: dict[str, Any]) -> list[str]:
    """What holds a lane back now, with its figures, and what held it in the window."""
    notes = []
    for h in lane.get("heldBy") or []:
        what = HELD_BY.get(h["reason"], h["reason"])
        if "limit" in h:
            notes.append(f"held now: {what} ({h['active']}/{h['limit']} active)")
        elif "nextTokenInMs" in h:
            notes.append(f"held now: {what} (next token in {duration(h['nextTokenInMs'])})")
        else:
            notes.append(f"held now: {what}")
    minimum = lane.get("minActiveJobs")
    if minimum:  # a guaranteed minimum (ADR 042)
        active = lane.get("tenantActive") or 0
        served = ": served first" if active < minimum else ""
        notes.append(f"minimum {active}/{minimum} active{served}")
    for k in lane.get("keys") or []:
        if k.get("head") is not None and k.get("headState") != "CREATED":
            # A FIFO key waits for its head to end (ADR 041).
            head = f"job {k['head']} ({k['headState']})"
            notes.append(f"key {k['fairnessKey']} waits for its head, {head}")
        elif k.get("held"):  # a fairness key at its cap (ADR 040)
            caps = [c for c in (k.get("maxActiveJobs"), k.get("maxActivePerKey")) if c is not None]
            figures = f" ({k['active']}/{min(caps)} active)" if caps else ""
            notes.append(f"key {k['fairnessKey']} at its cap{figures}")
    held = lane.get("heldInWindow") or {}
    if held:
        ranked = sorted(held.items(), key=lambda x: -x[1])
        parts = ", ".join(f"{HELD_BY.get(r, r)} {percent(f)}" for r, f in ranked)
        notes.append(f"held in the window: {parts}")
    return notes


def idle_note(job_type: dict[str, Any]) -> str | None:
    """ "no activation of this type for N" when its lanes wait while nothing is served."""
    idle = job_type.get("noActivationForMs")
    if idle is None or idle < 5000 or not job_type.get("ready"):
        return None
    bound = "at least " if job_type.get("noActivationSinceStart") else ""
    return f"no activation of this type for {bound}{duration(idle)}"


def stats_tables(stats: dict[str, Any]) -> list[RenderableType]:
    """A table per job type, a row per tenant (its lane), and the type's totals.

    Shares (docs/metrics.md): "realised" is the lane's part of its type's activations in
    the window; "entitled" what its weight gave it of those same activations, given who
    was backlogged and held when (the window's average); "entitled now" its weight over
    the weights of the type's lanes with ready jobs now, unpaused."""
    if not stats["jobTypes"]:
        return [Text("no jobs waiting or active")]
    window = duration(stats.get("windowMs")) if stats.get("windowMs") else "window"
    tables: list[RenderableType] = []
    for t in stats["jobTypes"]:
        title = Text(t["type"] + ("  (paused)" if t.get("paused") else ""))
        if (idle := idle_note(t)) is not None:
            title.append(f"  {idle}", style="yellow")
        table = Table(
            title=title, title_justify="left", box=box.SIMPLE, pad_edge=False, collapse_padding=True
        )
        longest = max(len(x["tenantId"]) for x in t["tenants"])
        table.add_column("tenant", no_wrap=True, min_width=min(max(longest, 6), 20))
        for name in ("weight", "ready", "delayed", "active", "oldest", "last min"):
            table.add_column(name, justify="right", no_wrap=True, min_width=len(name))
        for name in ("realised", "entitled", "entitled now"):
            table.add_column(name, justify="right", no_wrap=True, min_width=len(name))
        table.add_column("notes", overflow="fold")
        for x in t["tenants"]:
            notes = ["paused"] if x.get("paused") else []
            notes += hold_notes(x)
            add_row(
                table,
                x["tenantId"],
                str(x.get("weight", 1)),
                str(x["ready"]),
                str(x["delayed"]),
                str(x["active"]),
                duration(x["oldestPendingAgeMs"]),
                str(x["activatedLastMinute"]),
                percent(x["realizedShare"]),
                percent(x.get("entitledShare", x["configuredShare"])),
                percent(x["configuredShare"]) if x["ready"] else "-",
                "; ".join(notes),
            )
        table.add_section()
        add_row(
            table,
            "(all)",
            "",
            str(t["ready"]),
            str(t["delayed"]),
            str(t["active"]),
            duration(t["oldestPendingAgeMs"]),
            str(sum(x["activatedLastMinute"] for x in t["tenants"])),
            "",
            "",
            "",
            "paused" if t.get("paused") else "",
            style="dim",
        )
        table.caption = (
            f"realised, entitled: of the activations in the last {window}; "
            "entitled now: weight over the weights with ready jobs"
        )
        table.caption_justify = "left"
        tables.append(table)
    return tables


def stats(
    job_type: Annotated[
        str | None, typer.Option("--type", help="one job type only", show_default="every type")
    ] = None,
    watch: Annotated[bool, typer.Option("--watch", help="redraw until Ctrl-C")] = False,
    interval_s: Annotated[
        float, typer.Option("--interval", min=0.2, help="seconds between redraws (--watch)")
    ] = 2.0,
    url: Url = DEFAULT_URL,
    key: Key = None,
    as_json: Json = False,
) -> None:
    """Backlog and fairness per job type and tenant.

    Per tenant: its weight, ready, delayed and active jobs, the oldest ready job's age,
    the activations of the last minute, their share (realised) against the share its
    weight entitled it to of them (entitled; a lane held back or out of jobs is entitled
    to what it took) and its weight over the weights with ready jobs now (entitled now).
    What holds a lane back (cap, rate limit, pause) is noted, now and over the minute,
    so that it is not taken for a starved one.
    """
    params = {"type": job_type}
    with connected(url, key) as server:
        if not watch:
            answer = server.call("GET", "/v2/stats", params=params)
            if as_json:
                print_json(answer)
            else:
                stdout().print(*stats_tables(answer))
            return
        with contextlib.suppress(KeyboardInterrupt):
            if as_json:
                _watch_json(server, params, interval_s)
            elif stdout().is_terminal:
                _watch_tables(server, params, interval_s)
            else:
                _watch_frames(server, params, interval_s)


def _watch_json(server: Server, params: dict[str, Any], interval_s: float) -> None:
    """One JSON document a line (the failures, which it waits out, on stderr)."""
    while True:
        try:
            typer.echo(json.dumps(server.call("GET", "/v2/stats", params=params)))
        except CommandFailed as exc:
            typer.echo(exc.message, err=True)
        time.sleep(interval_s)


def _watch_frames(server: Server, params: dict[str, Any], interval_s: float) -> None:
    """Not a terminal (a file, a pipe): a plain frame per refresh, each headed by its
    instant and flushed, so that what was written is there however the watch ends."""
    console = stdout()
    while True:
        at = datetime.now().strftime("%H:%M:%S")
        try:
            body = stats_tables(server.call("GET", "/v2/stats", params=params))
        except CommandFailed as exc:
            body = [Text(exc.message)]
        console.print(Text(f"--- {server.url}  {at}"), *body)
        console.file.flush()
        time.sleep(interval_s)


def _watch_tables(server: Server, params: dict[str, Any], interval_s: float) -> None:
    """The tables, redrawn; a server that is away for a while is shown as such and
    waited for, as a person watching would want (a restart should not end the watch)."""
    console = stdout()
    with Live(console=console, auto_refresh=False, screen=False) as live:
        while True:
            at = datetime.now().strftime("%H:%M:%S")
            head = Text(f"{server.url}  {at}  (every {interval_s:g} s, Ctrl-C to stop)")
            try:
                body = stats_tables(server.call("GET", "/v2/stats", params=params))
            except CommandFailed as exc:
                body = [Text(exc.message, style="red")]
            live.update(Group(head, *body), refresh=True)
            time.sleep(interval_s)
