"""The database: a pool of warmed connections behind one error boundary.

Everything the driver raises because the database cannot take a call now -- refused,
reset or missing socket, a connection lost in the middle of a call, a server starting
up or shutting down, no connection slots, a statement cancelled or timed out, every
pooled connection busy -- leaves this module as ``StoreUnavailable`` (``unavailable``
is the one place that knows which driver errors those are).  A failure while a commit
may have gone through is ``OutcomeUnknown``.  The HTTP layer answers both 503; the
background loops back off.  Anything else is a bug or the caller's input, and passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import asyncpg
import orjson

from app.db import citus, claims, finishing, job_rows, lanes, operating
from app.db.base import transaction_on
from app.db.bounds import HISTORY_SETTING
from app.db.connect import connect
from app.domain import utcnow
from app.errors import OutcomeUnknown, StoreUnavailable

log = logging.getLogger(__name__)

R = TypeVar("R")

# The driver's errors for a database that is not up (yet): refused, reset or missing
# socket (OSError), a connection lost in the middle of a call (class 08), a server
# starting up or shutting down (57P01-57P03), and every host of a multi-host URL up but
# none of the kind ``target_session_attrs`` asks for (no primary: a failover or a
# switchover under way).  Start-up waits these out (until_reachable).
_NOT_UP_YET: tuple[type[Exception], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.TargetServerAttributeNotMatched,
)
# And those for a database that cannot take a call right now: besides the above, no
# connection slots left (53300) and a statement cancelled (57014) or timed out.  Not
# waited out at start-up: a pool asking for more connections than the server allows
# fails at once, for the operator to see (a replacement process would fail the same way).
_UNAVAILABLE: tuple[type[Exception], ...] = (
    *_NOT_UP_YET,
    asyncpg.TooManyConnectionsError,
    asyncpg.QueryCanceledError,
)
# What connecting raises when the database refuses us (a password, a database that does
# not exist, too many connections) or the URL is wrong: not waited for at start-up.
CONNECT_ERRORS: tuple[type[Exception], ...] = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    ValueError,
)
UNAVAILABLE_LOG_EVERY_S = 5.0
STARTUP_RETRY_MAX_S = 2.0


def unavailable(exc: BaseException) -> StoreUnavailable | None:
    """``exc`` as the storage error it stands for, or None if it is not one: the call's
    own fault (a refused value, a constraint) or a bug.  Besides the database being
    away, asyncpg refusing to use a connection that died under it (InterfaceError
    "connection is closed", InternalClientError "another operation is in progress")
    counts: nothing was sent on it."""
    if isinstance(exc, StoreUnavailable):
        return exc
    if isinstance(exc, (*_UNAVAILABLE, asyncpg.InterfaceError, asyncpg.InternalClientError)):
        return _unavailable_now()
    if node_unreachable(exc):
        return _unavailable_now()
    return None


def node_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` is Citus saying a worker node could not be reached mid-statement
    (an internal error, XX000, naming the connection: "failure on connection marked as
    essential", "connection to the remote node ... failed", libpq's "server closed the
    connection unexpectedly" relayed; or an I/O error, 58030,
    sending a part's rows to a node: "failed to COPY to shard ... on host:port"): the
    database unavailable for this call, as a PostgreSQL that went away is, not a bug."""
    text = str(exc)
    if isinstance(exc, asyncpg.PostgresIOError):
        return text.startswith("failed to COPY to shard")
    if not isinstance(exc, asyncpg.InternalServerError):
        return False
    return any(lost in text for lost in _NODE_LOST)


# What Citus's internal errors (XX000) say when a worker node went away: its own words,
# and libpq's about the connection to the node, relayed (the coordinator's own loss is a
# connection error of ours, not an answer).
_NODE_LOST = (
    "connection marked as essential",
    "remote node",
    "server closed the connection unexpectedly",
    "SSL SYSCALL error",
    "SSL connection has been closed unexpectedly",
    "could not receive data from server",
    "could not send data to server",
    "no connection to the server",
    "connection not open",
    "Connection refused",
)


def _unavailable_now() -> StoreUnavailable:
    """The answer a caller gets: it names no host or port (the log says what failed)."""
    return StoreUnavailable("the database is unavailable; retry later", retry_after_s=1)


async def until_reachable(attempt: Callable[[], Awaitable[R]], wait_s: float, what: str) -> R:
    """``attempt()``, repeated with back-off while the database cannot be reached, for
    at most ``wait_s``; logged once when it starts waiting and once when it is through.
    A process started during an outage then comes up when the database does.  Raises
    StoreUnavailable when the wait ran out, from the driver's last error: the caller says
    what failed, once (``connect_error``, ``without_password``)."""
    deadline = time.monotonic() + wait_s
    delay_s = 0.1
    waited = False
    while True:
        try:
            result = await attempt()
        except _NOT_UP_YET as exc:
            error = unavailable(exc)
            assert error is not None
            if time.monotonic() + delay_s > deadline:
                raise error from exc
            if not waited:
                log.warning(
                    "%s: database unreachable (%s); waiting up to %.0f s",
                    what,
                    connect_error(exc),
                    wait_s,
                )
                waited = True
            await asyncio.sleep(delay_s * (0.5 + random.random()))
            delay_s = min(delay_s * 2, STARTUP_RETRY_MAX_S)
            continue
        if waited:
            log.info("%s: database reachable", what)
        return result


def connect_error(exc: BaseException) -> str:
    """The driver's reason a connection failed, on one line."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def without_password(url: str) -> str:
    """``url`` with its password, in its user part or a ``password=`` parameter, as ***,
    for a log line or a message."""
    scheme, sep, rest = url.partition("://")
    if sep:
        end = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
        netloc, tail = rest[:end], rest[end:]
        if "@" in netloc:
            userinfo, host = netloc.rsplit("@", 1)
            if ":" in userinfo:
                netloc = userinfo.split(":", 1)[0] + ":***@" + host
        url = f"{scheme}://{netloc}{tail}"
    return re.sub(r"(?i)(password=)[^&\s]*", r"\1***", url)


async def ping_url(url: str) -> None:
    """One connection, one ``SELECT 1``: whether the database at ``url`` answers."""
    conn = await connect(url)
    try:
        await conn.fetchval("SELECT 1")
    finally:
        await conn.close()


async def revision_at(url: str) -> tuple[str | None, str | None]:
    """One connection: the migration the database at ``url`` is at (None: never migrated),
    and the oldest server revision it serves (operators.schema_revision)."""
    conn = await connect(url)
    try:
        return await operating.schema_revision(conn)
    finally:
        await conn.close()


class _Shared:
    """What every connection of a pool shares: whether its database is a Citus
    coordinator with Jobfair's tables distributed, found by the pool's first connection,
    and then its ShardMap, which every connection carries as ``shard_map`` (None: one
    PostgreSQL) for the storage modules (app.db.citus.split); and the pool's
    ClaimHints and KeysBefore0008, carried as ``claim_hints`` (ADR 036) and
    ``keys_before_0008`` (ADR 045)."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self.known = False
        self.map: citus.ShardMap | None = None
        self.claim_hints = claims.ClaimHints()
        self.keys_before_0008 = job_rows.KeysBefore0008()

    async def of(self, conn: asyncpg.Connection) -> citus.ShardMap | None:
        async with self._lock:
            if not self.known:
                self.map = await citus.shard_map(conn)
                self.known = True
        return self.map


async def _init_connection(conn: asyncpg.Connection, found: _Shared | None = None) -> None:
    await conn.set_type_codec(
        "jsonb", encoder=_encode_jsonb, decoder=orjson.loads, schema="pg_catalog"
    )
    conn.shard_map = None if found is None else await found.of(conn)
    conn.claim_hints = None if found is None else found.claim_hints
    conn.keys_before_0008 = None if found is None else found.keys_before_0008
    if conn.shard_map is not None:
        # Citus cannot run the generic plan of a statement that passes a parameter to an
        # SQL function (jobfair_key_shard($1): "parameters in SQL functions"), and prunes
        # to the shards a custom plan names: each call is planned with its values.
        await conn.execute("SET plan_cache_mode = force_custom_plan")
        # Citus hides its shards from catalog reads with a filter on pg_class
        # (citus_table_visible), and asyncpg's type introspection, run on each connection
        # for the array types of its first statements, then took 330 ms a time: a new
        # connection took 2.4 s to warm, and a pool growing under load answered 503s.
        # The coordinator holds no shard; without the filter, 3 ms (docs/scaling.md).
        await conn.execute("SET citus.override_table_visibility = off")
    calls = _warm_up_calls() if conn.shard_map is None else _citus_warm_up_calls()
    for call in calls:
        await conn.fetch(*call)


def _citus_warm_up_calls() -> list[tuple[Any, ...]]:
    """_warm_up_calls as Citus runs them (each naming no shard: it touches none)."""
    now = utcnow()
    insert = dict(job_rows.insert_args([], now), shards=[0], reentry_types=[], reentry_vtimes=[])
    charge: dict[str, list[Any]] = {name: [] for name in lanes.CHARGE_ARRAYS}
    claim = dict(job_type="", tenants=[], keys=[], counts=[], now=now, workers=[], deadlines=[])
    claim |= dict(aging_step=0, aging_interval_ms=1, via_stream=False, starts=[], shards=[0])
    claim |= dict(hint_priorities=[], since=[])
    read = dict(job_type="", limit=1, exclude=[])
    lead = dict(job_type="", now=now, workers=[], deadlines=[], via_stream=False, starts=[])
    lead |= dict(default_aging_step=0, default_aging_interval_ms=1)
    return [
        job_rows.SQL.citus["insert_jobs"].bind(**insert),
        job_rows.SQL.citus["get_job"].bind(job_key=-1),
        lanes.SQL.citus["read_type_head"].bind(job_type=""),
        lanes.SQL.citus["read_lanes_across"].bind(**read, tenant_ids=None),
        lanes.SQL.citus["read_lanes_across"].bind(**read, tenant_ids=[]),
        lanes.SQL.citus["read_keys"].bind(
            job_type="", tenants=[], wants=[], exclude_tenants=[], exclude_keys=[], shards=[0]
        ),
        claims.SQL.citus["claim"].bind(**claim),
        claims.SQL.citus["claim_by_worker_time"].bind(**claim),
        lanes.SQL.citus["charge_lanes"].bind(job_type="", **charge, shards=[0]),
        claims.SQL.citus["claim_lead_of_tenants"].bind(**lead, tenant_ids=[], shards=[0]),
        claims.SQL.citus["claim_lead_of_tenants_by_worker_time"].bind(
            **lead, tenant_ids=[], shards=[0]
        ),
        finishing.SQL.citus["complete_jobs"].bind(
            job_keys=[], activation_counts=[], variables=[], now=now, shards=[0]
        ),
    ]


def _warm_up_calls() -> list[tuple[Any, ...]]:
    """The statements of a job's path (create, activate, complete), each with arguments
    that match nothing, so it writes nothing, as a driver call takes them.  Run once on
    every new pool connection, they leave it with the statements prepared and their
    generic plans built: otherwise the first calls on a fresh connection pay for parsing
    and planning each statement, and a connection opened under load held up every pickup
    behind it (ADR 010)."""
    now = utcnow()
    insert = job_rows.insert_args([], now)
    charge: dict[str, list[Any]] = {name: [] for name in lanes.CHARGE_ARRAYS}
    read = dict(job_type="", limit=1, exclude=[], **charge)
    claim = dict(job_type="", tenants=[], keys=[], counts=[], now=now, workers=[], deadlines=[])
    claim |= dict(aging_step=0, aging_interval_ms=1, via_stream=False, starts=[])
    claim |= dict(hint_priorities=[], since=[])
    lead = dict(job_type="", now=now, workers=[], deadlines=[], via_stream=False, starts=[])
    lead |= dict(default_aging_step=0, default_aging_interval_ms=1)
    return [
        job_rows.SQL["insert_jobs"].bind(**insert, keys_before_0008=True),
        job_rows.SQL["insert_job_quiet"].bind(**insert, keys_before_0008=True),
        job_rows.SQL["get_job"].bind(job_key=-1),
        lanes.SQL["read_lanes"].bind(**read),
        # The same with a tenant filter: a worker that names its tenants (as Camunda's
        # clients do) reads with these.
        lanes.SQL["read_lanes_of_tenants"].bind(**read, tenant_ids=[]),
        lanes.SQL["read_keys"].bind(
            job_type="", tenants=[], wants=[], exclude_tenants=[], exclude_keys=[]
        ),
        claims.SQL["claim"].bind(**claim),
        claims.SQL["claim_by_worker_time"].bind(**claim),
        claims.SQL["claim_lead"].bind(**lead),
        claims.SQL["claim_lead_of_tenants"].bind(**lead, tenant_ids=[]),
        claims.SQL["claim_lead_by_worker_time"].bind(**lead),
        claims.SQL["claim_lead_of_tenants_by_worker_time"].bind(**lead, tenant_ids=[]),
        lanes.SQL["charge_lanes"].bind(job_type="", **charge),
        finishing.SQL["complete_jobs"].bind(
            job_keys=[], activation_counts=[], variables=[], now=now
        ),
    ]


async def _reset_connection(conn: asyncpg.Connection) -> None:
    """Replaces asyncpg's default reset (a round trip on every release).  Pool
    connections keep no session state: advisory locks here are transaction-scoped, and
    LISTEN and the leader lock live on dedicated connections.  Only an interrupted
    transaction needs undoing."""
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")


def _encode_jsonb(value: Any) -> str:
    # Callers pass already-serialized JSON text (validated and size-checked at the edge).
    return value if isinstance(value, str) else orjson.dumps(value).decode()


_WRITE = re.compile(r"\b(INSERT|DELETE|MERGE)\b|(?<!FOR )(?<!KEY )\bUPDATE\b", re.IGNORECASE)


@functools.lru_cache(maxsize=1024)
def _writes(query: str) -> bool:
    """Whether a statement may change rows (a SELECT ... FOR UPDATE does not)."""
    return _WRITE.search(query) is not None


class _Connection(asyncpg.Connection):  # type: ignore[misc]
    """An asyncpg connection that marks the failure of a statement that could have
    committed (a COMMIT, or a write outside a transaction) with ``may_have_committed``:
    if the connection died then, the call's outcome is unknown (``OutcomeUnknown``).  A
    failure anywhere else in a transaction rolled it back, and the call can be sent
    again as it was.  (The mark is on the exception: a pool's proxy of a connection that
    died is detached from it at once.)"""

    # On a Citus coordinator, its ShardMap (set when the pool opens the connection).
    shard_map: citus.ShardMap | None = None
    # The pool's ClaimHints (ADR 036) and KeysBefore0008 (ADR 045).
    claim_hints: claims.ClaimHints | None = None
    keys_before_0008: job_rows.KeysBefore0008 | None = None

    def _may_commit(self, query: str) -> bool:
        if self.is_in_transaction():
            return query.lstrip()[:6].upper() == "COMMIT"
        return _writes(query)

    async def execute(self, query: str, *args: Any, **kwargs: Any) -> str:
        may_commit = self._may_commit(query)
        try:
            return await super().execute(query, *args, **kwargs)  # type: ignore[no-any-return]
        except Exception as exc:
            _mark(exc, may_commit)
            raise

    async def _execute(self, query: str, *args: Any, **kwargs: Any) -> Any:
        may_commit = self._may_commit(query)
        try:
            return await super()._execute(query, *args, **kwargs)
        except Exception as exc:
            _mark(exc, may_commit)
            raise


def _mark(exc: Exception, may_commit: bool) -> None:
    """A statement that could have committed failed because the database, or on Citus a
    worker node (a COMMIT sent on to it), went away: its outcome is unknown."""
    if isinstance(exc, _UNAVAILABLE) or node_unreachable(exc):
        exc.may_have_committed = may_commit  # type: ignore[attr-defined]


def _broken(conn: asyncpg.Connection, exc: Exception) -> bool:
    """Whether asyncpg refused a call because its connection is closed or left in a
    state it cannot use (after the server died under it: InterfaceError "connection is
    closed", from ``Transaction.__aexit__`` too; InternalClientError "cannot switch to
    state N; another operation is in progress"), rather than because of the call."""
    if isinstance(exc, asyncpg.InternalClientError):
        return True
    try:
        return bool(conn.is_closed())
    except asyncpg.InterfaceError:  # the pool's proxy, detached from a connection that died
        return True


class Database:
    """The pool, waiting at most ``timeout_s`` for a connection: an exhausted pool is back
    pressure (503), not an unbounded queue.  So is a database that cannot be reached: the
    call is answered 503 with ``Retry-After``, and the pool reconnects by itself on a
    later call once the database is back.

    Statements run on it directly (each on a connection of its own, autocommit), or on
    the connection ``connection()`` or ``transaction()`` lends (see ``app.db.base``)."""

    def __init__(self, pool: asyncpg.Pool, timeout_s: float, found: _Shared | None = None) -> None:
        self._pool = pool
        self._citus = found
        self.timeout_s = timeout_s
        self._unavailable_logged = -UNAVAILABLE_LOG_EVERY_S
        self.waiting = 0  # calls waiting for a connection (none was idle), for /metrics

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        size: int,
        min_size: int | None = None,
        acquire_timeout_s: float = 5.0,
        statement_timeout_s: float = 60.0,
        wait_s: float = 0.0,
        history: bool = True,
    ) -> Database:
        """A pool of ``size`` connections, ``min_size`` of them (default: all) opened now
        and kept open, so that load arriving later finds them connected and warm.  An
        unreachable database is waited for up to ``wait_s`` (``until_reachable``), and
        a statement for at most ``statement_timeout_s``.
        ``history``: whether its statements write jobs' attempt history (app.db.history,
        read there from the connection's ``jobfair.history`` setting)."""
        found = _Shared()
        pool = await until_reachable(
            lambda: cls._create_pool(url, size, min_size, history, statement_timeout_s, found),
            wait_s,
            "pool",
        )
        db = cls(pool, acquire_timeout_s, found)
        if not found.known:  # no connection opened yet (min_size 0)
            async with db.connection():
                pass
        return db

    @property
    def claim_hints(self) -> claims.ClaimHints | None:
        """Where claims start their heads (ADR 036); every connection the pool lends
        carries it too."""
        return None if self._citus is None else self._citus.claim_hints

    @property
    def keys_before_0008(self) -> job_rows.KeysBefore0008 | None:
        """The pool's (ADR 045), which every connection it lends carries too."""
        return None if self._citus is None else self._citus.keys_before_0008

    @property
    def shard_map(self) -> citus.ShardMap | None:
        """On a Citus coordinator, which Citus shard holds each shard value (None: one
        PostgreSQL); every connection the pool lends carries it too."""
        return None if self._citus is None else self._citus.map

    @staticmethod
    async def _create_pool(
        url: str,
        size: int,
        min_size: int | None,
        history: bool = True,
        statement_timeout_s: float = 60.0,
        found: _Shared | None = None,
    ) -> asyncpg.Pool:
        return await asyncpg.create_pool(
            url,
            # Each host of a multi-host URL in turn, each with a time of its own.
            connect=connect,
            min_size=size if min_size is None else min(min_size, size),
            max_size=size,
            init=functools.partial(_init_connection, found=found),
            reset=_reset_connection,
            connection_class=_Connection,
            # The hot statements are written to be plan-robust (primary-key probes via
            # ANY(ARRAY(...)), index range scans), so a generic plan is as good as a custom
            # one and saves planning every claim.  JIT only adds latency here.
            server_settings={
                "plan_cache_mode": "force_generic_plan",
                "jit": "off",
                HISTORY_SETTING: "on" if history else "off",
            },
            command_timeout=statement_timeout_s,
        )

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection for a sequence of statements (and transactions) of one
        operation; every driver failure on it leaves as StoreUnavailable."""
        try:
            if self._pool.get_idle_size():
                # Nothing to wait for, so no timeout: arming one costs CPU on every call
                # of the hot path.
                conn = await self._pool.acquire()
            else:
                self.waiting += 1
                try:
                    conn = await self._pool.acquire(timeout=self.timeout_s)
                finally:
                    self.waiting -= 1
        except TimeoutError:
            raise StoreUnavailable("all database connections are busy", retry_after_s=1) from None
        except (*_UNAVAILABLE, asyncpg.InternalClientError) as exc:
            raise self._unavailable(exc) from exc
        try:
            yield conn
        except _UNAVAILABLE as exc:
            if isinstance(exc, TimeoutError):
                # Unanswered for the whole statement timeout: its host may be gone
                # without a word.  Not kept (asyncpg would wait on its cancel request,
                # to that same host): the pool opens a fresh one, through the URL.
                with contextlib.suppress(asyncpg.InterfaceError):
                    conn.terminate()
            raise self._gone(exc) from exc
        except asyncpg.PostgresError as exc:
            if not node_unreachable(exc):  # on Citus, a worker node gone mid-statement
                raise
            raise self._gone(exc) from exc
        except (asyncpg.InterfaceError, asyncpg.InternalClientError) as exc:
            if not _broken(conn, exc):
                raise  # a statement called wrongly: a bug
            # Nothing was sent on it (the failure is asyncpg refusing to): the call is
            # safe to repeat.  Not reused: the pool opens a fresh connection instead.
            with contextlib.suppress(asyncpg.InterfaceError):  # a proxy already detached
                conn.terminate()
            raise self._unavailable(exc) from exc
        finally:
            await self._pool.release(conn)

    @contextlib.asynccontextmanager
    async def transaction(self, first: str | None = None) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection inside a transaction, committed when the block ends and
        rolled back if it raises.  ``first``: a statement without parameters (locks) to
        run first, sent with the BEGIN in one round trip (the simple protocol takes
        both); asyncpg's own transaction sends its BEGIN alone."""
        async with self.connection() as conn, transaction_on(conn, first):
            yield conn

    def _gone(self, exc: Exception) -> StoreUnavailable:
        """What a call whose database went away under it raises: OutcomeUnknown if the
        statement that failed could have committed, else the database unavailable."""
        if getattr(exc, "may_have_committed", False):
            self._log_unavailable(exc)
            return OutcomeUnknown(
                "the database went away while this call's changes were being "
                "committed: they may or may not have been made",
            )
        return self._unavailable(exc)

    def _unavailable(self, exc: Exception) -> StoreUnavailable:
        """The client's answer names no host or port; the log says what failed (at most
        every few seconds: an outage fails every call)."""
        self._log_unavailable(exc)
        return _unavailable_now()

    def _log_unavailable(self, exc: Exception) -> None:
        now = time.monotonic()
        if now - self._unavailable_logged >= UNAVAILABLE_LOG_EVERY_S:
            self._unavailable_logged = now
            log.warning("database unavailable: %r", exc)

    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        async with self.connection() as conn:
            return await conn.fetch(query, *args)  # type: ignore[no-any-return]

    async def fetchrow(self, query: str, *args: Any) -> asyncpg.Record | None:
        async with self.connection() as conn:
            return await conn.fetchrow(query, *args)

    async def fetchval(self, query: str, *args: Any) -> Any:
        async with self.connection() as conn:
            return await conn.fetchval(query, *args)

    async def execute(self, query: str, *args: Any) -> str:
        async with self.connection() as conn:
            return await conn.execute(query, *args)  # type: ignore[no-any-return]

    def get_size(self) -> int:
        return self._pool.get_size()  # type: ignore[no-any-return]

    def get_idle_size(self) -> int:
        return self._pool.get_idle_size()  # type: ignore[no-any-return]

    def get_max_size(self) -> int:
        return self._pool.get_max_size()  # type: ignore[no-any-return]

    async def close(self) -> None:
        await self._pool.close()
