"""A pg_auto_failover formation of the tests' own (Debian's ``postgresql-15-auto-failover``):
a monitor, a primary and a synchronous standby, each a ``pg_autoctl run`` of its own on a
loopback port, run by the ``postgres`` user in a temporary directory.

Each node's ``pg_autoctl run`` is a process group (a session) of its own, so that
``kill()`` takes its keeper down, then its PostgreSQL -- postmaster and backends -- at
once, as the loss of its machine would: killing the postmaster alone, the keeper starts
it again within a second, and nothing fails over.

The monitor's health checks are tightened (``MONITOR_SETTINGS``) from their defaults (a
check every 5 s, a node unhealthy 20 s after its keeper last reported, 30 s granted to a
lost primary to demote itself), which would put the failover tens of seconds after the
loss.  The steps the monitor takes are the same.  Tighter still (checks of 500 ms, a node
unhealthy after 1 s), a standby of this busy two-core machine was seen unhealthy when it
was not.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.chaos.external_pg import PG15, kill_postgres, postgres_owned_dir
from tests.fixtures import free_port

PG_AUTOCTL = Path("/usr/bin/pg_autoctl")
NOT_INSTALLED = (
    "pg_auto_failover is not installed (make chaos installs postgresql-15-auto-failover)"
)
DATABASE = "jobfair"
# The states of a node that takes writes: ``wait_primary`` while it has no healthy
# standby (a promoted standby's first state), ``primary`` with one.
PRIMARY_STATES = ("primary", "wait_primary")

MONITOR_SETTINGS = {
    "pgautofailover.health_check_period": "1s",
    "pgautofailover.health_check_timeout": "1s",
    "pgautofailover.health_check_max_retries": "1",
    "pgautofailover.health_check_retry_delay": "500ms",
    "pgautofailover.node_considered_unhealthy_timeout": "2s",
    "pgautofailover.primary_demote_timeout": "1s",
    "pgautofailover.startup_grace_period": "1s",
}


@dataclass
class Node:
    name: str
    pgdata: Path
    port: int
    log: Path
    proc: subprocess.Popen[bytes] | None = None


@dataclass
class Formation:
    root: Path
    monitor: Node
    nodes: list[Node] = field(default_factory=list)

    def _env(self) -> dict[str, str]:
        """pg_autoctl keeps its configuration and state under XDG directories: this
        formation's own, not the user's."""
        return {
            "PATH": f"{PG15}:{os.environ['PATH']}",
            "PG_CONFIG": str(PG15 / "pg_config"),
            "HOME": str(self.root),
            "XDG_CONFIG_HOME": str(self.root / "config"),
            "XDG_DATA_HOME": str(self.root / "share"),
            "XDG_RUNTIME_DIR": str(self.root / "run"),
            "LANG": "C.UTF-8",
        }

    def _user(self) -> dict[str, Any]:
        if os.geteuid() != 0:
            return {}
        user = pwd.getpwnam("postgres")
        return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}

    def autoctl(self, *args: str) -> str:
        """``pg_autoctl args``, to its end; its output (the log goes to stderr)."""
        done = subprocess.run(
            [str(PG_AUTOCTL), *args],
            env=self._env(),
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=120,
            **self._user(),
        )
        assert done.returncode == 0, f"pg_autoctl {' '.join(args)}:\n{done.stderr}"
        return done.stdout

    def run(self, node: Node) -> None:
        """``pg_autoctl run`` for the node, in a session of its own."""
        with open(node.log, "ab") as log:
            node.proc = subprocess.Popen(
                [str(PG_AUTOCTL), "run", "--pgdata", str(node.pgdata)],
                env=self._env(),
                cwd=self.root,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **self._user(),
            )

    def create_monitor(self) -> None:
        m = self.monitor
        self.autoctl(
            "create", "monitor", "--pgdata", str(m.pgdata), "--pgport", str(m.port),
            "--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl",
        )  # fmt: skip
        # Before it runs: read at start, no reload to wait for.  Loopback only.
        with open(m.pgdata / "postgresql.conf", "a") as conf:
            conf.write("listen_addresses = '127.0.0.1'\n")
            for name, value in MONITOR_SETTINGS.items():
                conf.write(f"{name} = '{value}'\n")
        self.autoctl("config", "set", "--pgdata", str(m.pgdata),
                     "postgresql.listen_addresses", "127.0.0.1")  # fmt: skip
        self.run(m)

    def add_node(self) -> Node:
        """A node created and running: the first becomes the primary, the next its
        standby, synchronous (replication quorum: a commit is acknowledged once the
        standby has it)."""
        name = f"node{len(self.nodes) + 1}"
        node = Node(name, self.root / name, free_port(), self.root / f"{name}.log")
        self.autoctl(
            "create", "postgres", "--pgdata", str(node.pgdata), "--pgport", str(node.port),
            "--pghost", "127.0.0.1", "--listen", "127.0.0.1", "--hostname", "127.0.0.1",
            "--name", name, "--dbname", DATABASE, "--monitor", self.monitor_uri(),
            "--auth", "trust", "--no-ssl", "--replication-quorum", "true",
            "--candidate-priority", "50",
        )  # fmt: skip
        self.nodes.append(node)
        self.run(node)
        return node

    def monitor_uri(self) -> str:
        return f"postgres://autoctl_node@127.0.0.1:{self.monitor.port}/pg_auto_failover"

    def state(self) -> list[dict[str, Any]]:
        """The monitor's view of each node (``pg_autoctl show state --json``)."""
        out = self.autoctl("show", "state", "--pgdata", str(self.monitor.pgdata), "--json")
        return json.loads(out) if out.strip() else []

    def until_states(self, wanted: dict[str, str], timeout_s: float = 60) -> None:
        """Until each named node has reached the state it was assigned, ``wanted``
        (polled: the monitor's state lives in another process)."""
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(AssertionError, json.JSONDecodeError):
                got = {n["nodename"]: (n["current_group_state"], n["assigned_group_state"])
                       for n in self.state()}  # fmt: skip
                if all(got.get(name) == (s, s) for name, s in wanted.items()):
                    return
            assert time.monotonic() < deadline, f"{wanted} not reached: {self.state()}"
            time.sleep(0.2)

    def uri(self) -> str:
        """The formation's multi-host URL, as pg_autoctl prints it for applications
        (``target_session_attrs=read-write``), with the user the tests connect as."""
        out = self.autoctl(
            "show", "uri", "--pgdata", str(self.monitor.pgdata), "--formation", "default"
        )
        uri = out.strip()
        assert uri.startswith("postgres://") and "target_session_attrs=read-write" in uri, uri
        return uri.replace("postgres://", "postgresql://postgres@", 1)

    def primary(self) -> Node:
        """The node the monitor has as primary (a lost one keeps the state it last
        reported, but is assigned another)."""
        (name,) = [
            n["nodename"]
            for n in self.state()
            if n["current_group_state"] == n["assigned_group_state"] in PRIMARY_STATES
        ]
        return next(n for n in self.nodes if n.name == name)

    def kill(self, node: Node) -> None:
        """SIGKILL to the node's keeper, its PostgreSQL and every backend, at once
        (``kill_postgres``).  The keeper is stopped first, or it would start PostgreSQL
        again; the postmaster is in its group, a backend in a group of its own."""
        assert node.proc is not None
        os.killpg(node.proc.pid, signal.SIGSTOP)
        kill_postgres(node.pgdata)
        os.killpg(node.proc.pid, signal.SIGKILL)
        node.proc.wait()

    def stop(self) -> None:
        for node in [*self.nodes, self.monitor]:
            if node.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.proc.pid, signal.SIGKILL)
                node.proc.wait()


@contextlib.contextmanager
def formation() -> Iterator[Formation]:
    """A monitor, a primary and its synchronous standby, both healthy (each has reached
    the state the monitor assigned it: ``primary`` and ``secondary``)."""
    root = postgres_owned_dir("jobfair-paf-")
    monitor = Node("monitor", root / "monitor", free_port(), root / "monitor.log")
    f = Formation(root, monitor)
    try:
        f.create_monitor()
        f.add_node()
        f.add_node()
        f.until_states({"node1": "primary", "node2": "secondary"})
        yield f
    finally:
        f.stop()
        shutil.rmtree(root, ignore_errors=True)
