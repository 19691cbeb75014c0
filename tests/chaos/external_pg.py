"""PostgreSQL servers of the chaos tests' own: Debian's PostgreSQL 15 (``postgresql-15``,
``make chaos`` and ``make test`` install it), run by its unprivileged ``postgres`` user
-- as root, initdb and the server refuse to run.

Their directories come from ``tempfile``, not pytest's ``tmp_path``: that one lies under
a directory only its owner (root) may enter, where the ``postgres`` user could not
reach its data directory.  Each is named at random and removed at the end, and every
port is a free one, so that tests under pytest-xdist do not meet.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.fixtures import free_port

PG15 = Path("/usr/lib/postgresql/15/bin")
NOT_INSTALLED = "PostgreSQL 15 is not installed (make test and make chaos install postgresql-15)"


def as_postgres(command: list[str]) -> list[str]:
    """``command`` run as the ``postgres`` user when we are root, else as we are."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *command]
    return command


def postgres_owned_dir(prefix: str) -> Path:
    """A new temporary directory the ``postgres`` user owns (when we are root)."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(root, user.pw_uid, user.pw_gid)
    return root


def postmaster_pid(pgdata: Path) -> int:
    return int((pgdata / "postmaster.pid").read_text().split()[0])


def kill_postgres(pgdata: Path) -> int:
    """SIGKILL to the cluster's postmaster and every process it started, at once, as the
    loss of its host would stop them; the postmaster's pid.  (Its own, alone, would
    leave the backends serving their sessions a moment longer: each backend is a
    process group of its own, so that is what a group's kill would do, too.)  Stopped
    first, the postmaster starts no backend while its children are read."""
    pid = postmaster_pid(pgdata)
    os.kill(pid, signal.SIGSTOP)
    for child in _children(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
    os.kill(pid, signal.SIGKILL)
    return pid


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # "pid (comm) state ppid ...": comm may hold spaces, never a ")" at its end.
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


@dataclass
class External:
    """A PostgreSQL 15 cluster of its own, on a loopback port."""

    pgdata: Path
    port: int
    log: Path

    def _as_postgres(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = as_postgres([str(PG15 / args[0]), *args[1:]])
        return subprocess.run(command, check=check, capture_output=True, text=True, timeout=60)

    def pg_ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        options = f"-p {self.port} -k {self.pgdata.parent} -c listen_addresses=127.0.0.1"
        return self._as_postgres(
            "pg_ctl", "-D", str(self.pgdata), "-l", str(self.log), "-o", options, *args, check=check
        )

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def psql(self, sql: str) -> None:
        self._as_postgres(
            "psql",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            sql,
        )

    def start_until_up(self) -> None:
        """pg_ctl start, again while the killed postmaster's backends still hold its
        shared memory (they exit within moments of noticing it is gone)."""
        for _ in range(50):
            if self.pg_ctl("-w", "start", check=False).returncode == 0:
                return
            time.sleep(0.2)
        raise AssertionError(self.log.read_text())


@contextlib.contextmanager
def external_cluster(prefix: str = "jobfair-pg15-") -> Iterator[External]:
    """A new cluster, started (trust authentication, loopback only); stopped the way a
    crash stops it, and removed, at the end."""
    root = postgres_owned_dir(prefix)
    ext = External(root / "data", free_port(), root / "log")
    try:
        ext._as_postgres("initdb", "-D", str(ext.pgdata), "-U", "postgres", "--auth=trust")
        ext.pg_ctl("-w", "start")
        yield ext
    finally:
        ext.pg_ctl("-w", "-m", "immediate", "stop", check=False)
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def streaming_standby(primary: External) -> Iterator[External]:
    """A hot standby of ``primary`` (``pg_basebackup -R``: streaming replication), started
    on a port of its own; ``pg_ctl promote`` makes it a primary."""
    root = postgres_owned_dir("jobfair-pg15-standby-")
    standby = External(root / "data", free_port(), root / "log")
    try:
        standby._as_postgres(
            "pg_basebackup", "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
            "-D", str(standby.pgdata), "-R", "-X", "stream", "-c", "fast",
        )  # fmt: skip
        standby.pg_ctl("-w", "start")
        yield standby
    finally:
        standby.pg_ctl("-w", "-m", "immediate", "stop", check=False)
        shutil.rmtree(root, ignore_errors=True)
