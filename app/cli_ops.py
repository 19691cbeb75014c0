"""The operators' commands, over HTTP to a running server: ``stats``, ``tenants``,
``job-types``, ``jobs`` and ``bench`` (which runs the repository's benchmarks).

Tables and progress bars are for people (progress on stderr, so that stdout holds the
result); ``--json`` prints the server's own JSON for scripts.  Every failure is one line
on stderr and exit status 1 (2 for a bad command line).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from app import __version__
from app.cli_client import (
    DEFAULT_URL,
    CommandFailed,
    Json,
    Key,
    RouteMissing,
    Server,
    Url,
    segment,
)
from app.scheduler import FairnessBy

# -- shared -----------------------------------------------------------------------------


def stdout() -> Console:
    """Made per command (typer's test runner swaps sys.stdout for each).  Piped, the
    tables are as wide as they need (rich would cut them to 80 columns)."""
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=250)
    return console


def stderr() -> Console:
    return Console(stderr=True)


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


# -- stats ------------------------------------------------------------------------------


HELD_BY = {
    "tenantPaused": "tenant paused",
    "typePaused": "type paused",
    "tenantCap": "tenant's cap",
    "typeCap": "type's cap",
    "tenantRate": "tenant's rate limit",
    "typeRate": "type's rate limit",
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


# -- tenants and job types --------------------------------------------------------------

tenants_cli = typer.Typer(no_args_is_help=True, help="Tenants: weight, cap, pause")
job_types_cli = typer.Typer(no_args_is_help=True, help="Job types: cap, aging, pause")

TenantId = Annotated[str, typer.Argument(help="the tenant id", show_default=False)]
JobType = Annotated[str, typer.Argument(help="the job type", show_default=False)]
MaxActive = Annotated[
    int | None,
    typer.Option(
        "--max-active-jobs", help="cap on ACTIVATED jobs at once", show_default="unchanged"
    ),
]
NoCap = Annotated[bool, typer.Option("--no-cap", help="remove the cap")]
RatePerSecond = Annotated[
    float | None,
    typer.Option(
        "--rate-per-second",
        help="rate limit: activations a second, 0.001-1000000 (with --burst)",
        show_default="unchanged",
    ),
]
Burst = Annotated[
    float | None,
    typer.Option(
        "--burst", help="rate limit: activations at once, 1-1000000", show_default="unchanged"
    ),
]
NoRateLimit = Annotated[bool, typer.Option("--no-rate-limit", help="remove the rate limit")]


def _tenant_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(box=box.SIMPLE)
    for name in ("tenant", "weight", "max active", "paused", "rate limit"):
        table.add_column(name, justify="left" if name == "tenant" else "right")
    for r in rows:
        add_row(
            table,
            r["tenantId"],
            str(r["weight"]),
            shown(r["maxActiveJobs"]),
            _paused(r),
            _shown_rate(r),
        )
    return table


def _job_type_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(box=box.SIMPLE)
    names = ("type", "max active", "aging interval", "aging step", "paused", "rate limit")
    for name in (*names, "fair by"):
        table.add_column(name, justify="left" if name in ("type", "fair by") else "right")
    for r in rows:
        add_row(
            table,
            r["type"],
            shown(r["maxActiveJobs"]),
            duration(r["agingIntervalMs"]),
            str(r["agingStep"]),
            _paused(r),
            _shown_rate(r),
            r.get("fairnessBy", "-"),  # a server older than fairnessBy leaves it out
        )
    return table


def _paused(record: dict[str, Any]) -> str:
    # A server without pause (older than it) leaves the field out.
    return {True: "yes", False: "no"}.get(record.get("paused"), "-")  # type: ignore[arg-type]


def _current(server: Server, path: str) -> dict[str, Any]:
    """The configuration as the server has it (an unconfigured one is the defaults:
    answered as such, or a 404 that says so)."""
    try:
        return server.call("GET", path)  # type: ignore[no-any-return]
    except CommandFailed as exc:
        if exc.status == 404 and not isinstance(exc, RouteMissing):
            return {}
        raise


def _rate_limit(per_s: float | None, burst: float | None, no_limit: bool, current: Any) -> Any:
    """The ``rateLimit`` to PUT: the one given (a part not given kept from the current
    one), none with ``--no-rate-limit``, else the current one (a PUT replaces the whole
    configuration: leaving it out would remove it)."""
    if no_limit and (per_s is not None or burst is not None):
        raise fail("give --rate-per-second/--burst or --no-rate-limit, not both", 2)
    if no_limit:
        return None
    if per_s is None and burst is None:
        # The limit as shown, less what only a GET shows (the bucket's tokens).
        return None if not current else {k: current[k] for k in ("perSecond", "burst")}
    now = current or {}
    per_s = now.get("perSecond") if per_s is None else per_s
    burst = now.get("burst") if burst is None else burst
    if per_s is None or burst is None:
        raise fail("a new rate limit needs both --rate-per-second and --burst", 2)
    return {"perSecond": per_s, "burst": burst}


def _shown_rate(record: dict[str, Any]) -> str:
    limit = record.get("rateLimit")
    return "-" if not limit else f"{limit['perSecond']:g}/s,burst={limit['burst']:g}"


def _cap(max_active_jobs: int | None, no_cap: bool, current: Any) -> Any:
    if no_cap and max_active_jobs is not None:
        raise fail("give --max-active-jobs or --no-cap, not both", 2)
    if no_cap:
        return None
    return current if max_active_jobs is None else max_active_jobs


@tenants_cli.command("list")
def tenants_list(url: Url = DEFAULT_URL, key: Key = None, as_json: Json = False) -> None:
    """The configured tenants (any other has weight 1 and no cap)."""
    with connected(url, key) as server:
        answer = server.call("GET", "/v2/tenants")
    if as_json:
        print_json(answer)
    else:
        stdout().print(_tenant_table(answer["tenants"]))


@tenants_cli.command("set")
def tenants_set(
    tenant: TenantId,
    weight: Annotated[
        int | None, typer.Option(help="share of activations, 1-10000", show_default="unchanged")
    ] = None,
    max_active_jobs: MaxActive = None,
    no_cap: NoCap = False,
    rate_per_second: RatePerSecond = None,
    burst: Burst = None,
    no_rate_limit: NoRateLimit = False,
    url: Url = DEFAULT_URL,
    key: Key = None,
    as_json: Json = False,
) -> None:
    """Set a tenant's weight, cap or rate limit; what is not given stays as it is."""
    rate_given = rate_per_second is not None or burst is not None or no_rate_limit
    if weight is None and max_active_jobs is None and not no_cap and not rate_given:
        raise fail(
            "nothing to set: give --weight, --max-active-jobs, --no-cap, --rate-per-second,"
            " --burst or --no-rate-limit",
            2,
        )
    path = f"/v2/tenants/{segment(tenant)}"
    with connected(url, key) as server:
        current = _current(server, path)
        body = {
            "weight": current.get("weight", 1) if weight is None else weight,
            "maxActiveJobs": _cap(max_active_jobs, no_cap, current.get("maxActiveJobs")),
        }
        limit = _rate_limit(rate_per_second, burst, no_rate_limit, current.get("rateLimit"))
        if limit is not None or rate_given:
            body["rateLimit"] = limit  # left out for a server without rate limits
        answer = server.call("PUT", path, json=body)
    if as_json:
        print_json(answer)
    else:
        stdout().print(_tenant_table([answer]))


@tenants_cli.command("reset")
def tenants_reset(tenant: TenantId, url: Url = DEFAULT_URL, key: Key = None) -> None:
    """Forget a tenant's configuration: weight 1, no cap."""
    with connected(url, key) as server:
        server.call("DELETE", f"/v2/tenants/{segment(tenant)}")
    typer.echo(f"tenant {tenant}: back to the defaults")


@tenants_cli.command("pause")
def tenants_pause(
    tenant: TenantId, url: Url = DEFAULT_URL, key: Key = None, as_json: Json = False
) -> None:
    """Stop activating a tenant's jobs (they stay CREATED, and can still be made)."""
    _pause(url, key, f"/v2/tenants/{segment(tenant)}/pause", f"tenant {tenant}", as_json)


@tenants_cli.command("resume")
def tenants_resume(
    tenant: TenantId, url: Url = DEFAULT_URL, key: Key = None, as_json: Json = False
) -> None:
    """Activate a paused tenant's jobs again, in its fair turn."""
    _pause(url, key, f"/v2/tenants/{segment(tenant)}/resume", f"tenant {tenant}", as_json)


def _pause(url: str, key: str | None, path: str, what: str, as_json: bool) -> None:
    with connected(url, key) as server:
        answer = server.call("POST", path)
    if as_json:
        print_json(answer)
    else:
        typer.echo(f"{what}: {'paused' if answer.get('paused') else 'resumed'}")


@job_types_cli.command("list")
def job_types_list(url: Url = DEFAULT_URL, key: Key = None, as_json: Json = False) -> None:
    """The configured job types (any other has no cap and the server's aging)."""
    with connected(url, key) as server:
        answer = server.call("GET", "/v2/job-types")
    if as_json:
        print_json(answer)
    else:
        stdout().print(_job_type_table(answer["jobTypes"]))


@job_types_cli.command("set")
def job_types_set(
    job_type: JobType,
    max_active_jobs: MaxActive = None,
    no_cap: NoCap = False,
    aging_interval_ms: Annotated[
        int | None,
        typer.Option(help="a waiting job gains priority every this long", show_default="unchanged"),
    ] = None,
    aging_step: Annotated[
        int | None,
        typer.Option(help="priority gained per interval, 0-100", show_default="unchanged"),
    ] = None,
    rate_per_second: RatePerSecond = None,
    burst: Burst = None,
    no_rate_limit: NoRateLimit = False,
    fairness_by: Annotated[
        FairnessBy | None,
        typer.Option(
            help="what its tenants share: activations, workerTime (the seconds leases are"
            " held) or cost (the jobs' declared cost)",
            show_default="unchanged",
        ),
    ] = None,
    url: Url = DEFAULT_URL,
    key: Key = None,
    as_json: Json = False,
) -> None:
    """Set a job type's cap, aging, rate limit or what it is fair by; what is not given
    stays as it is.

    Aging is kept as the server shows it now: a type left at the server's default
    keeps today's value.
    """
    rate_given = rate_per_second is not None or burst is not None or no_rate_limit
    if (
        (max_active_jobs, aging_interval_ms, aging_step) == (None, None, None)
        and not no_cap
        and not rate_given
        and fairness_by is None
    ):
        raise fail(
            "nothing to set: give --max-active-jobs, --no-cap, --aging-interval-ms,"
            " --aging-step, --rate-per-second, --burst, --no-rate-limit or --fairness-by",
            2,
        )
    path = f"/v2/job-types/{segment(job_type)}"
    with connected(url, key) as server:
        current = _current(server, path)
        body = {
            "maxActiveJobs": _cap(max_active_jobs, no_cap, current.get("maxActiveJobs")),
            "agingIntervalMs": current.get("agingIntervalMs")
            if aging_interval_ms is None
            else aging_interval_ms,
            "agingStep": current.get("agingStep") if aging_step is None else aging_step,
        }
        limit = _rate_limit(rate_per_second, burst, no_rate_limit, current.get("rateLimit"))
        if limit is not None or rate_given:
            body["rateLimit"] = limit  # left out for a server without rate limits
        by = current.get("fairnessBy") if fairness_by is None else fairness_by.value
        if by is not None:  # left out for a server without it
            body["fairnessBy"] = by
        answer = server.call("PUT", path, json=body)
    if as_json:
        print_json(answer)
    else:
        stdout().print(_job_type_table([answer]))


@job_types_cli.command("pause")
def job_types_pause(
    job_type: JobType, url: Url = DEFAULT_URL, key: Key = None, as_json: Json = False
) -> None:
    """Stop activating jobs of a type (of every tenant)."""
    _pause(url, key, f"/v2/job-types/{segment(job_type)}/pause", f"job type {job_type}", as_json)


@job_types_cli.command("resume")
def job_types_resume(
    job_type: JobType, url: Url = DEFAULT_URL, key: Key = None, as_json: Json = False
) -> None:
    """Activate a paused job type's jobs again."""
    _pause(url, key, f"/v2/job-types/{segment(job_type)}/resume", f"job type {job_type}", as_json)


# -- jobs -------------------------------------------------------------------------------

jobs_cli = typer.Typer(
    no_args_is_help=True, help="Jobs: list, show (with history), why (it waits), retry, cancel"
)

JobKeyArg = Annotated[
    str, typer.Argument(help="the job key", show_default=False, metavar="JOB_KEY")
]
TypeFilter = Annotated[
    str | None, typer.Option("--type", help="of this job type", show_default="any")
]
TenantFilter = Annotated[
    str | None, typer.Option("--tenant", help="of this tenant", show_default="any")
]
After = Annotated[
    str | None,
    typer.Option(help="created at or after (RFC 3339)", show_default="no bound"),
]
Before = Annotated[
    str | None,
    typer.Option(help="created before (RFC 3339)", show_default="no bound"),
]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")]
BATCH_HELP = "jobs per request (the server bounds each batch)"


@jobs_cli.command("list")
def jobs_list(
    job_type: TypeFilter = None,
    tenant: TenantFilter = None,
    state: Annotated[
        str | None,
        typer.Option(
            help="CREATED, ACTIVATED, COMPLETED, FAILED, ERROR_THROWN or CANCELED",
            show_default="any",
        ),
    ] = None,
    created_after: After = None,
    created_before: Before = None,
    limit: Annotated[int, typer.Option(min=1, help="jobs per page")] = 50,
    cursor: Annotated[
        str | None,
        typer.Option(help="the page after the one that gave it", show_default="first page"),
    ] = None,
    url: Url = DEFAULT_URL,
    key: Key = None,
    as_json: Json = False,
) -> None:
    """Jobs, newest first, a page at a time (the next page's --cursor is printed)."""
    params = {
        "type": job_type,
        "tenantId": tenant,
        "state": state.upper() if state else None,
        "createdAfter": created_after,
        "createdBefore": created_before,
        "limit": limit,
        "cursor": cursor,
    }
    with connected(url, key) as server:
        answer = server.call("GET", "/v2/jobs", params=params)
    if as_json:
        print_json(answer)
        return
    table = Table(box=box.SIMPLE)
    for name in ("key", "type", "tenant", "state", "priority", "retries", "activations",
                 "worker", "created", "error"):  # fmt: skip
        table.add_column(name)
    for j in answer["items"]:
        add_row(
            table,
            j["jobKey"],
            j["type"],
            j["tenantId"],
            j["state"],
            str(j["priority"]),
            str(j["retries"]),
            str(j["activationCount"]),
            shown(j.get("worker")),
            instant(j["createdAt"]),
            _error(j),
        )
    stdout().print(table)
    if answer.get("nextCursor"):
        typer.echo(f"more: --cursor {answer['nextCursor']} (with the same filters)", err=True)


def _error(record: dict[str, Any]) -> str:
    code, message = record.get("errorCode"), record.get("errorMessage")
    text = ": ".join(x for x in (code, message) if x)
    return text if len(text) <= 60 else text[:59] + "…"


def reason_text(r: dict[str, Any]) -> str:
    """One reason of an explanation (GET /v2/jobs/{jobKey}/explain), in words."""
    what = r["reason"]
    if what == "delayed":
        cause = "its retry back-off" if r["by"] == "retryBackOff" else "its runAt"
        return f"delayed by {cause} until {instant(r['until'])}"
    if what in ("tenantCap", "typeCap"):
        return f"held by its {HELD_BY[what]}: {r['active']} of {r['limit']} active"
    if what in ("tenantRate", "typeRate"):
        return f"held by its {HELD_BY[what]}: next token at {instant(r['nextTokenAt'])}"
    if what in ("tenantPaused", "typePaused"):
        return f"held: {HELD_BY[what]}"
    if what == "behindInKey":
        return f"{r['ahead']:,} job{'s' * (r['ahead'] != 1)} ahead of it in its fairness key"
    if what == "otherKeysFirst":
        return f"its lane serves fairness key {r['nextKey']} first (its turn)"
    if what == "otherLanesFirst":
        return f"other tenants' turns first (its lane's virtual time is {r['vtimeLag']:g} ahead)"
    if what == "nobodyAsking":
        last = instant(r["lastAskedAt"]) if r["lastAskedAt"] else "not in a day"
        return f"nobody is asking: no worker asked for its type for {r['forS']:g} s (last: {last})"
    if what == "activated":
        return (
            f"running: activated by {r['worker'] or '(unnamed)'} at {instant(r['activatedAt'])},"
            f" lease until {instant(r['leaseUntil'])} (activation {r['activationCount']})"
        )
    ended = f"{what} at {instant(r.get('finishedAt'))}"
    error = ": ".join(x for x in (r.get("errorCode"), r.get("errorMessage")) if x)
    revive = r.get("revivedBy") or "nothing revives it"
    return f"{ended}{' (' + error + ')' if error else ''}; {revive}"


def explanation_lines(e: dict[str, Any]) -> list[str]:
    """An explanation as a person reads it: what, why, and the figures behind it."""
    lines = [
        f"job {e['jobKey']}: {e['state']} · type {e['type']} · tenant {e['tenantId']}"
        f" · key {e['fairnessKey']}"
    ]
    if e["state"] == "CREATED":
        yes = {True: "yes", False: "no"}
        lines.append(
            f"activatable now: {yes[e['activatableNow']]} · "
            f"the next activation of its lane takes it: {yes[e['nextInLane']]}"
        )
    lines += ["why:"] + [f"  - {reason_text(r)}" for r in e["reasons"]]
    if not e["reasons"]:
        lines.append("  - nothing holds it: it is taken on its lane's next turn")
    if (p := e.get("priority")) is not None:
        aging = ""
        if "nextStepAt" in p:
            aging = f"; aging lifts it next at {instant(p['nextStepAt'])}, to 100 at "
            aging += instant(p["topAt"])
        lines.append(f"priority {p['priority']}, effective {p['effective']} now{aging}")
    if (lane := e.get("lane")) is not None:
        lines.append(
            f"its lane: weight {lane['weight']}, realised {percent(lane['realizedShare'])}, "
            f"entitled {percent(lane['entitledShare'])} (window), "
            f"entitled now {percent(lane['configuredShare'])}"
        )
        if held := lane.get("heldInWindow"):
            parts = ", ".join(f"{HELD_BY.get(r, r)} {percent(f)}" for r, f in held.items())
            lines.append(f"its lane was held in the window: {parts}")
    if (q := e.get("queue")) is not None:
        lines.append(
            f"its key: {q['aheadInKey']:,}{'+' if q['aheadInKeyAtLeast'] else ''} ahead; "
            f"its lane: {q['readyInLane']:,}{'+' if q.get('readyInLaneAtLeast') else ''} ready"
            f" in {q['keysBacklogged']} key(s)"
        )
    if e["state"] == "CREATED":
        at = e["estimatedStartAt"]
        lines.append(
            f"estimated start (an estimate): {instant(at)}"
            if at
            else "estimated start: cannot be estimated (held, or its lane was not served)"
        )
    return lines


@jobs_cli.command("why")
def jobs_why(
    job_key: JobKeyArg, url: Url = DEFAULT_URL, key: Key = None, as_json: Json = False
) -> None:
    """Why a job is not running now: each reason with its figures.

    Delays, pauses, caps, rate limits, the jobs ahead of it, whose turn it is, whether
    anyone is asking for its type, and an estimate of when it starts.
    """
    with connected(url, key) as server:
        e = server.call("GET", f"/v2/jobs/{segment(job_key)}/explain")
    if as_json:
        print_json(e)
        return
    for line in explanation_lines(e):
        typer.echo(printable(line))


@jobs_cli.command("show")
def jobs_show(
    job_key: JobKeyArg, url: Url = DEFAULT_URL, key: Key = None, as_json: Json = False
) -> None:
    """A job, and its history.

    The history holds every activation, completion, failure, lease expiry and retry.
    """
    with connected(url, key) as server:
        job = server.call("GET", f"/v2/jobs/{segment(job_key)}")
        try:
            history = server.call("GET", f"/v2/jobs/{segment(job_key)}/history")
        except CommandFailed as exc:
            # The job is there, so a 404 or 405 here is a server without the history.
            if exc.status not in (404, 405):
                raise
            history = None
    if as_json:
        print_json({"job": job, "history": history})
        return
    console = stdout()
    fields = Table(box=None, show_header=False, pad_edge=False)
    fields.add_column(style="bold")
    fields.add_column(overflow="fold")
    for name, value in job.items():
        if name in ("variables", "customHeaders"):
            value = json.dumps(value, ensure_ascii=False)
        elif name.endswith("At") or name in ("deadline", "runAt"):
            value = instant(value)
        add_row(fields, name, shown(value))
    console.print(fields)
    if history is None:
        console.print("\nhistory: not kept by this server")
        return
    table = Table(title="history", title_justify="left", box=box.SIMPLE)
    for name in ("at", "event", "activation", "worker", "retries", "error"):
        table.add_column(name)
    for h in history["items"]:
        add_row(
            table,
            instant(h["at"]),
            h["event"],
            shown(h.get("activationCount")),
            shown(h.get("worker")),
            shown(h.get("retries")),
            _error(h),
        )
    console.print(table)
    if history.get("truncated"):
        console.print("(older entries were pruned: the history is bounded)")


@jobs_cli.command("retry")
def jobs_retry(
    job_key: Annotated[
        str | None,
        typer.Argument(help="the FAILED job's key", show_default="none", metavar="JOB_KEY"),
    ] = None,
    failed: Annotated[
        bool, typer.Option("--failed", help="every FAILED job matching the filters")
    ] = False,
    job_type: TypeFilter = None,
    tenant: TenantFilter = None,
    created_after: After = None,
    created_before: Before = None,
    retries: Annotated[int, typer.Option(min=1, help="attempts it gets")] = 1,
    batch: Annotated[int, typer.Option(min=1, help=BATCH_HELP)] = 1000,
    yes: Yes = False,
    url: Url = DEFAULT_URL,
    key: Key = None,
) -> None:
    """Give a FAILED job retries again, or with --failed every FAILED job.

    The job becomes CREATED, due now.  With --failed, every FAILED job of a type, a
    tenant or a time range, in batches, after asking (unless --yes).
    """
    if (job_key is None) == (not failed):
        raise fail("give a job key, or --failed (with --type, --tenant, ...) for many", 2)
    with connected(url, key) as server:
        if job_key is not None:
            if job_type or tenant or created_after or created_before:
                raise fail("the filters go with --failed, not with a job key", 2)
            server.call(
                "PATCH", f"/v2/jobs/{segment(job_key)}", json={"changeset": {"retries": retries}}
            )
            job = server.call("GET", f"/v2/jobs/{segment(job_key)}")
            typer.echo(f"job {job_key}: retries {job['retries']}, {job['state']}")
            return
        scope = _scope(job_type, tenant, created_after, created_before)
        body = {
            "type": job_type,
            "tenantId": tenant,
            "createdAfter": created_after,
            "createdBefore": created_before,
            "retries": retries,
            "limit": batch,
        }
        if not yes:
            counted = server.call(
                "POST", "/v2/jobs/retry", json=_present(body) | {"limit": 100_000, "dryRun": True}
            )
            n = f"{'more than ' if counted['more'] else ''}{counted['count']:,}"
            if counted["count"] == 0:
                typer.echo(f"no FAILED job{scope}")
                return
            plural = "s" * (counted["count"] != 1 or counted["more"])
            typer.confirm(f"give {n} FAILED job{plural}{scope} {retries} retries?", abort=True)
        count = _bulk(server, "/v2/jobs/retry", _present(body), "retrying FAILED jobs", None)
    typer.echo(f"retried {count} FAILED job{'s' * (count != 1)}{scope}")


@jobs_cli.command("cancel")
def jobs_cancel(
    job_key: Annotated[
        str | None,
        typer.Argument(help="the CREATED job's key", show_default="none", metavar="JOB_KEY"),
    ] = None,
    tenant: Annotated[
        str | None,
        typer.Option(
            "--tenant", help="cancel every CREATED job of this tenant", show_default="none"
        ),
    ] = None,
    job_type: Annotated[
        str | None,
        typer.Option("--type", help="with --tenant: of this type only", show_default="any"),
    ] = None,
    batch: Annotated[int, typer.Option(min=1, help=BATCH_HELP)] = 1000,
    yes: Yes = False,
    url: Url = DEFAULT_URL,
    key: Key = None,
) -> None:
    """Cancel a CREATED job, or with --tenant every CREATED job of a tenant.

    With --tenant (and --type for one type only), in batches, after asking (unless
    --yes).
    """
    if (job_key is None) == (tenant is None):
        raise fail("give a job key, or --tenant (and maybe --type) for many", 2)
    with connected(url, key) as server:
        if job_key is not None:
            if job_type:
                raise fail("--type goes with --tenant, not with a job key", 2)
            server.call("POST", f"/v2/jobs/{segment(job_key)}/cancel")
            typer.echo(f"job {job_key}: CANCELED")
            return
        assert tenant is not None
        scope = _scope(job_type, tenant, None, None)
        waiting = _created_count(server, tenant, job_type)
        if not yes:
            now = "" if waiting is None else f" ({waiting} now)"
            typer.confirm(f"cancel every CREATED job{scope}{now}?", abort=True)
        body = _present({"tenantId": tenant, "type": job_type, "limit": batch})
        count = _bulk(server, "/v2/jobs/cancel", body, "canceling CREATED jobs", waiting)
    typer.echo(f"canceled {count} CREATED job{'s' * (count != 1)}{scope}")


def _present(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if v is not None}


def _scope(job_type: str | None, tenant: str | None, after: str | None, before: str | None) -> str:
    parts = [
        f" of type {job_type}" if job_type else "",
        f" of tenant {tenant}" if tenant else "",
        f" created at or after {after}" if after else "",
        f" created before {before}" if before else "",
    ]
    return "".join(parts)


def _created_count(server: Server, tenant: str, job_type: str | None) -> int | None:
    """How many CREATED jobs the tenant has now, from the stats (for the bar; None if
    the key may not read them)."""
    try:
        stats = server.call("GET", "/v2/stats", params={"type": job_type})
    except CommandFailed:
        return None
    return sum(
        x["pending"] for t in stats["jobTypes"] for x in t["tenants"] if x["tenantId"] == tenant
    )


def _bulk(server: Server, path: str, body: dict[str, Any], what: str, total: int | None) -> int:
    """Call the bulk route until it says there are no more (each batch is its own
    transaction, so an interruption leaves the batches done, done)."""
    done = 0
    with progress_bar(stderr()) as bar:
        task = bar.add_task(what, total=total)
        try:
            while True:
                answer = server.call("POST", path, json=body)
                done += answer["count"]
                # Jobs made meanwhile can make it more than there were at the start.
                bar.update(task, completed=done, total=max(total, done) if total else None)
                if not answer["more"] or answer["count"] == 0:
                    break
        except KeyboardInterrupt:
            bar.stop()
            raise fail(f"interrupted after {done}", 130) from None
        except CommandFailed as exc:
            bar.stop()
            raise fail(f"{exc.message} (after {done} done)", exc.code) from None
    return done


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


# -- bench ------------------------------------------------------------------------------


def repository_root() -> Path:
    return Path(__file__).resolve().parent.parent


def bench(
    ctx: typer.Context,
    benches: Annotated[
        list[str] | None,
        typer.Argument(help="which (enqueue, drain, fairness, ...)", show_default="all"),
    ] = None,
) -> None:
    """Run the repository's benchmarks (minutes), with progress.

    Runs bench/run.py of the clone this is installed from; options after the names go
    to it: jobfair bench fairness --repeat 1; jobfair bench -- --help.
    """
    root = repository_root()
    if not (root / "bench" / "run.py").is_file():
        raise fail(
            f"the benchmarks live in a clone of the repository (bench/run.py), and there is "
            f"none beside this installation ({root}): clone it, install it with "
            "`pip install -e .`, and run `jobfair bench` from the clone",
            2,
        )
    given = [*(benches or []), *ctx.args]
    # The names come first; bench/run.py's options (and their values) follow.
    first_option = next((i for i, a in enumerate(given) if a.startswith("-")), len(given))
    names, extra = given[:first_option], given[first_option:]
    command = [sys.executable, "-u", "-m", "bench.run", *names, *extra]
    total = len(names) or _bench_count(root)
    out = sys.stdout  # the results; the bar is on stderr
    proc = subprocess.Popen(
        command, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        with progress_bar(stderr()) as bar:
            task = bar.add_task("benchmarks", total=total)
            assert proc.stdout is not None
            for line in proc.stdout:
                # bench.run heads each benchmark's table with "## name (N s)" once done.
                if line.startswith("## "):
                    bar.advance(task)
                    bar.update(task, description=f"benchmarks (done: {line[3:].split()[0]})")
                if bar.console.is_terminal and out.isatty():
                    # One terminal: above the bar (which a bare write would tear).
                    bar.console.print(
                        line.rstrip("\n"), markup=False, highlight=False, soft_wrap=True
                    )
                else:
                    out.write(line)
                    out.flush()
        code = proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait()
        raise fail("benchmarks interrupted", 130) from None
    if code != 0:
        raise fail(f"bench/run.py exited with status {code}", code)


def _bench_count(root: Path) -> int | None:
    """How many benchmarks ``bench.run`` runs by default (None if it cannot tell)."""
    text = (root / "bench" / "run.py").read_text()
    if "\nBENCHES" not in text:
        return None
    sys.path.insert(0, str(root))
    try:
        # By name: the repository's bench/ is not part of the package (nor of its types).
        return len(importlib.import_module("bench.run").BENCHES)
    except Exception:
        return None
    finally:
        sys.path.remove(str(root))


# -- the command tree -------------------------------------------------------------------


def version(value: bool) -> None:
    if value:
        typer.echo(f"jobfair {__version__}")
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
    cli.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(bench)
