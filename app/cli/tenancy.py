"""``jobfair tenants`` and ``jobfair job-types``: weights, caps, rate limits, aging, pause."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table

from app.cli.client import (
    DEFAULT_URL,
    CommandFailed,
    Json,
    Key,
    RouteMissing,
    Server,
    Url,
    segment,
)
from app.cli.common import add_row, connected, duration, fail, print_json, shown, stdout
from app.scheduler import FairnessBy

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
    for name in ("tenant", "weight", "max active", "paused", "rate limit", "min active"):
        table.add_column(name, justify="left" if name == "tenant" else "right")
    for r in rows:
        add_row(
            table,
            r["tenantId"],
            str(r["weight"]),
            shown(r["maxActiveJobs"]),
            _paused(r),
            _shown_rate(r),
            shown(r.get("minActiveJobs")),  # a server older than minimums leaves it out
        )
    return table


def _job_type_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(box=box.SIMPLE)
    names = ("type", "max active", "aging interval", "aging step", "paused", "rate limit")
    for name in (*names, "fair by", "per key", "key order"):
        left = name in ("type", "fair by", "key order")
        table.add_column(name, justify="left" if left else "right")
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
            shown(r.get("maxActivePerKey")),
            r.get("keyOrdering") or "priority",
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
    min_active_jobs: Annotated[
        int | None,
        typer.Option(
            "--min-active-jobs",
            help="guaranteed minimum: below it, its ready jobs are served before the"
            " weighted share (at most its cap)",
            show_default="unchanged",
        ),
    ] = None,
    no_minimum: Annotated[bool, typer.Option("--no-minimum", help="remove the minimum")] = False,
    url: Url = DEFAULT_URL,
    key: Key = None,
    as_json: Json = False,
) -> None:
    """Set a tenant's weight, cap, minimum or rate limit; what is not given stays as it
    is."""
    rate_given = rate_per_second is not None or burst is not None or no_rate_limit
    minimum_given = min_active_jobs is not None or no_minimum
    if weight is None and max_active_jobs is None and not no_cap and not rate_given:
        if not minimum_given:
            raise fail(
                "nothing to set: give --weight, --max-active-jobs, --no-cap,"
                " --min-active-jobs, --no-minimum, --rate-per-second, --burst or"
                " --no-rate-limit",
                2,
            )
    if no_minimum and min_active_jobs is not None:
        raise fail("give --min-active-jobs or --no-minimum, not both", 2)
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
        minimum = _cap(min_active_jobs, no_minimum, current.get("minActiveJobs"))
        if minimum is not None or minimum_given:  # left out for a server without it
            body["minActiveJobs"] = minimum
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
    max_active_per_key: Annotated[
        int | None,
        typer.Option(
            "--max-active-per-key",
            help="cap on each fairness key's ACTIVATED jobs of the type",
            show_default="unchanged",
        ),
    ] = None,
    no_per_key_cap: Annotated[
        bool, typer.Option("--no-per-key-cap", help="remove the cap per fairness key")
    ] = False,
    fifo_keys: Annotated[
        bool | None,
        typer.Option(
            "--fifo-keys/--no-fifo-keys",
            help="each fairness key's jobs one at a time, in creation order (keyOrdering"
            " fifo), or by priority again",
            show_default="unchanged",
        ),
    ] = None,
    url: Url = DEFAULT_URL,
    key: Key = None,
    as_json: Json = False,
) -> None:
    """Set a job type's cap, aging, rate limit, what it is fair by, its cap per
    fairness key or its keys' order; what is not given stays as it is.

    Aging is kept as the server shows it now: a type left at the server's default
    keeps today's value.
    """
    rate_given = rate_per_second is not None or burst is not None or no_rate_limit
    if (
        (max_active_jobs, aging_interval_ms, aging_step) == (None, None, None)
        and not no_cap
        and not rate_given
        and fairness_by is None
        and max_active_per_key is None
        and not no_per_key_cap
        and fifo_keys is None
    ):
        raise fail(
            "nothing to set: give --max-active-jobs, --no-cap, --aging-interval-ms,"
            " --aging-step, --rate-per-second, --burst, --no-rate-limit, --fairness-by,"
            " --max-active-per-key, --no-per-key-cap, --fifo-keys or --no-fifo-keys",
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
        if no_per_key_cap and max_active_per_key is not None:
            raise fail("give --max-active-per-key or --no-per-key-cap, not both", 2)
        per_key = _cap(max_active_per_key, no_per_key_cap, current.get("maxActivePerKey"))
        if per_key is not None or no_per_key_cap:  # left out for a server without it
            body["maxActivePerKey"] = per_key
        ordering = current.get("keyOrdering")
        if fifo_keys is not None:
            ordering = "fifo" if fifo_keys else None
        if ordering is not None or fifo_keys is not None:  # left out for a server without it
            body["keyOrdering"] = ordering
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
