"""``jobfair demo``: the server it starts on an embedded PostgreSQL of its own, and the
command."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import httpx
import typer
from rich.console import Console

from app.console import stdout
from app.demo.measure import Run
from app.demo.scene import DemoFailed, Options, new_run, run_demo, summary

# -- the server it starts ---------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_taken(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


@contextlib.contextmanager
def demo_server(
    data_dir: Path, port: int, keep: bool, console: Console
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``jobfair serve`` on its own embedded PostgreSQL in ``data_dir``, on loopback
    without auth; stopped at the end (with its PostgreSQL) unless ``keep``.  It runs in
    its own session: Ctrl-C in the terminal reaches this process alone, which then
    stops the server itself (or, with --keep, leaves it running)."""
    url = f"http://127.0.0.1:{port}"
    log_path = data_dir / "demo-server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBFAIR_")}
    env["JOBFAIR_AUTH"] = "off"  # loopback only
    command = [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port",
               str(port), "--data-dir", str(data_dir), "--log-level", "warning"]  # fmt: skip
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        with console.status(f"starting a server on embedded PostgreSQL in {data_dir} ..."):
            _wait_ready(url, proc, log_path)
        # soft_wrap: a path or URL split over two lines could not be pasted.
        console.print(f"server: {url} (pid {proc.pid}, log {log_path})", soft_wrap=True)
        yield url, proc
    finally:
        if keep and proc.poll() is None:
            console.print(
                f"the server keeps running at {url} (pid {proc.pid}, data in {data_dir}); "
                f"stop it with: kill {proc.pid}",
                soft_wrap=True,
            )
        else:
            stop_server(proc)


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-15:]
            raise DemoFailed("the server did not start:\n" + "\n".join(tail))
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise DemoFailed(f"the server was not ready within 180 s (log: {log_path})")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (a graceful stop, which also stops its PostgreSQL), then SIGKILL."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# -- the command ------------------------------------------------------------------------


def demo(
    flood: Annotated[
        int, typer.Option(min=1, help="jobs the flood tenant makes at once")
    ] = 100_000,
    trickle_rate: Annotated[
        float, typer.Option(min=0.1, help="jobs a second the trickle tenant makes")
    ] = 5.0,
    flood_weight: Annotated[int, typer.Option(min=1, max=10_000, help="the flood's weight")] = 1,
    trickle_weight: Annotated[
        int, typer.Option(min=1, max=10_000, help="the trickle's weight")
    ] = 1,
    workers: Annotated[int, typer.Option(min=1, max=256, help="workers (asyncio tasks)")] = 8,
    batch: Annotated[
        int, typer.Option(min=1, max=1000, help="jobs a worker activates per call")
    ] = 32,
    work_ms: Annotated[
        float, typer.Option(min=0, help="a worker's time per job (simulated work), ms")
    ] = 0.0,
    duration: Annotated[
        float | None,
        typer.Option(
            min=1, help="stop after this many seconds", show_default="when the flood drains"
        ),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(min=1, max=65535, help="the server's port", show_default="a free one"),
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            help="embedded PostgreSQL data folder", show_default="a temporary one, removed after"
        ),
    ] = None,
    keep: Annotated[
        bool, typer.Option("--keep", help="leave the server running at the end")
    ] = False,
) -> None:
    """Watch fairness: a flood tenant's backlog and a trickle tenant served in turn.

    Starts a server on its own embedded PostgreSQL, makes the flood's jobs (in batches,
    through the API), then runs workers while the trickle makes a few jobs a second,
    until the flood has drained.  The live table shows each tenant's backlog, its share
    of the last seconds' activations against the share its weight entitles it to, and
    the trickle's waits; the last line states the measured shares and the trickle's
    worst wait (ready to activated).
    """
    options = Options(
        flood, trickle_rate, flood_weight, trickle_weight, workers, batch, work_ms, duration
    )
    console = stdout()
    port = port or free_port()
    if port_taken(port):
        typer.echo(f"port {port} is taken: give another --port", err=True)
        raise typer.Exit(2)
    temporary = data_dir is None
    root = Path(tempfile.mkdtemp(prefix="jobfair-demo-")) if data_dir is None else data_dir
    root = root.expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    run = new_run(options)
    try:
        with demo_server(root, port, keep, console) as (url, _):
            asyncio.run(_main(url, options, console, run))
    except DemoFailed as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        if run.started:
            for line in summary(run, options):
                console.print(line, highlight=False, soft_wrap=True)
        typer.echo("interrupted: everything the demo started is stopped", err=True)
        raise typer.Exit(130) from None
    finally:
        if temporary and not keep:
            shutil.rmtree(root, ignore_errors=True)
    for line in summary(run, options):
        console.print(line, highlight=False, soft_wrap=True)


async def _main(url: str, options: Options, console: Console, run: Run) -> None:
    # SIGTERM ends the demo as Ctrl-C does: everything it started is stopped.
    main = asyncio.current_task()
    assert main is not None
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, main.cancel)
    try:
        await run_demo(url, options, console, run)
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def register(cli: typer.Typer) -> None:
    cli.command()(demo)
