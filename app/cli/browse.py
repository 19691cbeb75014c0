"""``jobfair jobs``: a job browser's list, show, why, bulk retry and cancel."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table

from app.cli.client import (
    DEFAULT_URL,
    CommandFailed,
    Json,
    Key,
    Server,
    Url,
    segment,
)
from app.cli.common import (
    add_row,
    connected,
    fail,
    instant,
    percent,
    print_json,
    printable,
    progress_bar,
    shown,
    stderr,
    stdout,
)
from app.cli.stats import HELD_BY

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
    if what in ("tenantCap", "typeCap", "keyCap", "perKeyCap"):
        return f"held by its {HELD_BY[what]}: {r['active']} of {r['limit']} active"
    if what in ("tenantRate", "typeRate"):
        return f"held by its {HELD_BY[what]}: next token at {instant(r['nextTokenAt'])}"
    if what in ("tenantPaused", "typePaused"):
        return f"held: {HELD_BY[what]}"
    if what == "belowMinimum":
        return (
            f"its tenant is below its minimum ({r['active']} of {r['minimum']} active):"
            " served before the weighted share"
        )
    if what == "keyHead":
        state = r["headState"]
        return f"its FIFO fairness key waits for its head, job {r['head']} ({state}), to end"
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
