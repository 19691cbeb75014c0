"""A Citus cluster of this machine's own for `make citus`: a coordinator and two worker
nodes, each a Debian PostgreSQL 15 cluster (run as the ``postgres`` user, as
tests/chaos/external_pg.py runs one) with ``shared_preload_libraries = 'citus'``, the
extension created in the database ``jobfair`` on each, the coordinator's host set and
the workers added.  Every node is on a free loopback port with trust authentication, so
the coordinator reaches the workers as ``postgres`` without a password.

``python -m tests.citus.cluster`` starts one and prints its coordinator's URL (Ctrl-C
stops it): to try ``jobfair migrate`` and ``jobfair serve`` against it by hand.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from app.db.citus import DISTRIBUTED, REFERENCE
from tests.chaos.external_pg import PG15, External, postgres_owned_dir
from tests.fixtures import free_port

DATABASE = "jobfair"
# The schema's own records, which emptying a test's database keeps.
KEPT = {"alembic_version", "schema_compat"}
NOT_INSTALLED = (
    "Citus is not installed for PostgreSQL 15: `make citus CITUS_SRC=/path/to/citus` builds "
    "it from a source tree (tools/citus/install.sh)"
)


def installed() -> bool:
    return (PG15.parent / "lib" / "citus.so").exists()


@dataclass
class Node(External):
    """One PostgreSQL 15 of the cluster, with Citus preloaded."""

    def pg_ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        options = (
            f"-p {self.port} -k {self.pgdata.parent} -c listen_addresses=127.0.0.1"
            " -c shared_preload_libraries=citus -c max_connections=300"
            " -c citus.max_client_connections=250"
        )
        return self._as_postgres(
            "pg_ctl", "-D", str(self.pgdata), "-l", str(self.log), "-o", options, *args, check=check
        )  # fmt: skip

    def sql(self, statement: str, database: str = DATABASE) -> str:
        """Run ``statement`` with psql on this node; its output, unaligned."""
        done = self._as_postgres(
            "psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", database,
            "-v", "ON_ERROR_STOP=1", "-At", "-c", statement,
        )  # fmt: skip
        return done.stdout.strip()

    def url(self, database: str = DATABASE) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"


@dataclass
class Cluster:
    coordinator: Node
    workers: list[Node]

    @property
    def nodes(self) -> list[Node]:
        return [self.coordinator, *self.workers]

    def url(self) -> str:
        """Where Jobfair connects: the coordinator's database."""
        return self.coordinator.url()

    def empty(self) -> None:
        """Every table of Jobfair's emptied, the schema's own records kept: a test's fresh
        database, on the same distributed tables."""
        tables = [t for t in (*DISTRIBUTED, *REFERENCE) if t not in KEPT]
        self.coordinator.sql(f"TRUNCATE {', '.join(tables)}")


def _node(root: Path, name: str) -> Node:
    node = Node(root / name, free_port(), root / f"{name}.log")
    node._as_postgres("initdb", "-D", str(node.pgdata), "-U", "postgres", "--auth=trust")
    node.pg_ctl("-w", "start")
    node.sql(f"CREATE DATABASE {DATABASE}", database="postgres")
    node.sql("CREATE EXTENSION citus")
    return node


@contextlib.contextmanager
def citus_cluster(workers: int = 2) -> Iterator[Cluster]:
    """A coordinator and ``workers`` worker nodes, started and joined; stopped (as a
    crash stops them) and removed at the end."""
    root = postgres_owned_dir("jobfair-citus-")
    nodes: list[Node] = []
    try:
        nodes.append(_node(root, "coordinator"))
        for i in range(workers):
            nodes.append(_node(root, f"worker{i + 1}"))
        coordinator = nodes[0]
        coordinator.sql(f"SELECT citus_set_coordinator_host('127.0.0.1', {coordinator.port})")
        for node in nodes[1:]:
            coordinator.sql(f"SELECT citus_add_node('127.0.0.1', {node.port})")
        yield Cluster(coordinator, nodes[1:])
    finally:
        for node in nodes:
            node.pg_ctl("-w", "-m", "immediate", "stop", check=False)
        shutil.rmtree(root, ignore_errors=True)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the nodes as Ctrl-C does


def main() -> None:
    if not installed():
        raise SystemExit(NOT_INSTALLED)
    signal.signal(signal.SIGTERM, _interrupt)
    with citus_cluster() as cluster:
        print(cluster.url(), flush=True)
        for node in cluster.workers:
            print(f"  worker {node.url()}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()


if __name__ == "__main__":
    main()
