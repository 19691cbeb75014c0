"""What a job's storage costs PostgreSQL, per candidate design (issue 43): ``python -m
bench.storage_designs``.

Each design is the same job life written three ways, in plain SQL on the embedded
PostgreSQL (no server, no fairness: the storage alone): create (500 jobs a statement),
activate (50 a statement, a tenant's lane at a time, as a worker with 50 in flight
does), complete (the same 50 in one statement) and prune (retention of everything
finished).  Per design it reports PostgreSQL's CPU per job for each phase (every
PostgreSQL process, autovacuum and WAL writer included, as bench.peers measures it), the
WAL written per job and the dead row versions the drain left.  ``--pin`` holds the xmin
horizon (an idle transaction with an XID) through the drain, as a long report or a
forgotten session would, and reports the drain's cost under it.

- ``update``: the design as it is (alembic 0015): one jobs row per job, moved between
  partial indexes by an UPDATE at activation and at completion; a history row written
  at completion; retention DELETEs both.
- ``move``: finished jobs leave: the completion DELETEs the job's row and INSERTs it
  into ``done``, partitioned by completion day, with no history row (the done row is the
  story of a job that completed on its first try); retention drops a partition.
- ``append``: nothing is updated on the happy path: the job's body is inserted once
  (partitioned by creation day), its ready entry appended to ``ready`` (lane, sequence),
  a claim advances its lane's cursor past the entries it took and inserts their leases,
  a completion deletes the lease and appends a ``done`` row; retention truncates and
  drops partitions.  Retries, expiries and priorities (a ready entry appended again, a
  cursor per priority) are left out: this measures the happy path's floor.

Prints a table, then the JSON document (also bench/results/storage_designs.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from bench.harness import ROOT, Postgres, machine_speed, median, speed_line, table
from bench.peers.common import Meter

DESIGNS = ("update", "move", "append")
TENANTS = 10
CREATE_BATCH = 500
CLAIM_BATCH = 50

# The hot table of the designs that keep one: its columns and the indexes the queue reads.
_HOT_COLUMNS = """
    job_key bigint NOT NULL, job_type text NOT NULL, tenant_id text NOT NULL,
    fairness_key text NOT NULL DEFAULT '', state text NOT NULL, priority smallint NOT NULL,
    retries int NOT NULL, activation_count int NOT NULL DEFAULT 0, worker text,
    deadline timestamptz, queued_at timestamptz NOT NULL, variables jsonb NOT NULL,
    created_at timestamptz NOT NULL, activated_at timestamptz"""
_HOT_INDEXES = """
CREATE INDEX jobs_ready_idx ON jobs (job_type, tenant_id, fairness_key, priority DESC,
    queued_at, job_key) WHERE state = 'CREATED';
CREATE INDEX jobs_lease_idx ON jobs (deadline) WHERE state = 'ACTIVATED';
CREATE INDEX jobs_active_tenant_idx ON jobs (tenant_id) WHERE state = 'ACTIVATED';
CREATE INDEX jobs_active_type_idx ON jobs (job_type) WHERE state = 'ACTIVATED';
"""

SCHEMA = {
    "update": f"""
CREATE TABLE jobs ({_HOT_COLUMNS}, completed_at timestamptz,
    PRIMARY KEY (job_key)) WITH (fillfactor = 90, autovacuum_vacuum_scale_factor = 0.01);
{_HOT_INDEXES}CREATE INDEX jobs_terminal_idx ON jobs (completed_at)
    WHERE state IN ('COMPLETED', 'FAILED');
CREATE INDEX jobs_done_tenant_idx ON jobs (tenant_id, state, job_key)
    WHERE state IN ('COMPLETED', 'FAILED');
CREATE TABLE job_events (
    job_key bigint NOT NULL, activation_count int NOT NULL, step smallint NOT NULL,
    event text NOT NULL, at timestamptz NOT NULL, started_at timestamptz, worker text,
    PRIMARY KEY (job_key, activation_count, step));
""",
    "move": f"""
CREATE TABLE jobs ({_HOT_COLUMNS},
    PRIMARY KEY (job_key)) WITH (fillfactor = 90, autovacuum_vacuum_scale_factor = 0.01);
{_HOT_INDEXES}CREATE TABLE done (
    job_key bigint NOT NULL, job_type text NOT NULL, tenant_id text NOT NULL,
    fairness_key text NOT NULL, state text NOT NULL, priority smallint NOT NULL,
    retries int NOT NULL, activation_count int NOT NULL, worker text,
    variables jsonb NOT NULL, created_at timestamptz NOT NULL,
    activated_at timestamptz, completed_at timestamptz NOT NULL
) PARTITION BY RANGE (completed_at);
CREATE TABLE done_today PARTITION OF done
    FOR VALUES FROM (now() - interval '1 day') TO (now() + interval '1 day');
CREATE INDEX ON done (job_key);
CREATE INDEX ON done (tenant_id, state, job_key);
""",
    "append": """
CREATE TABLE jobs (
    job_key bigint NOT NULL, job_type text NOT NULL, tenant_id text NOT NULL,
    fairness_key text NOT NULL DEFAULT '', priority smallint NOT NULL, retries int NOT NULL,
    variables jsonb NOT NULL, created_at timestamptz NOT NULL
) PARTITION BY RANGE (created_at);
CREATE TABLE jobs_today PARTITION OF jobs
    FOR VALUES FROM (now() - interval '1 day') TO (now() + interval '1 day');
CREATE INDEX ON jobs (job_key);
CREATE TABLE ready (
    job_type text NOT NULL, tenant_id text NOT NULL, seq bigint NOT NULL,
    job_key bigint NOT NULL, PRIMARY KEY (job_type, tenant_id, seq));
CREATE SEQUENCE ready_seq;
CREATE TABLE cursors (
    job_type text NOT NULL, tenant_id text NOT NULL, seq bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (job_type, tenant_id)) WITH (fillfactor = 50);
CREATE TABLE leases (
    job_key bigint PRIMARY KEY, activation_count int NOT NULL, job_type text NOT NULL,
    tenant_id text NOT NULL, worker text, deadline timestamptz NOT NULL,
    activated_at timestamptz NOT NULL) WITH (fillfactor = 90);
CREATE INDEX ON leases (deadline);
CREATE INDEX ON leases (tenant_id);
CREATE INDEX ON leases (job_type);
CREATE TABLE done (
    job_key bigint NOT NULL, tenant_id text NOT NULL, state text NOT NULL,
    activation_count int NOT NULL, worker text, activated_at timestamptz,
    completed_at timestamptz NOT NULL
) PARTITION BY RANGE (completed_at);
CREATE TABLE done_today PARTITION OF done
    FOR VALUES FROM (now() - interval '1 day') TO (now() + interval '1 day');
CREATE INDEX ON done (job_key);
CREATE INDEX ON done (tenant_id, state, job_key);
""",
}

# $1 tenant ids, $2 job keys, $3 variables (text), one entry per job.
CREATE = {
    "update": """
INSERT INTO jobs (job_key, job_type, tenant_id, state, priority, retries, queued_at,
                  variables, created_at)
SELECT k, 'bench', t, 'CREATED', 50, 3, now(), v::jsonb, now()
FROM unnest($1::text[], $2::bigint[], $3::text[]) AS x(t, k, v)""",
    "append": """
WITH body AS (
    INSERT INTO jobs (job_key, job_type, tenant_id, priority, retries, variables, created_at)
    SELECT k, 'bench', t, 50, 3, v::jsonb, now()
    FROM unnest($1::text[], $2::bigint[], $3::text[]) AS x(t, k, v)
    RETURNING job_key, tenant_id)
INSERT INTO ready (job_type, tenant_id, seq, job_key)
SELECT 'bench', tenant_id, nextval('ready_seq'), job_key FROM body ORDER BY job_key""",
}
CREATE["move"] = CREATE["update"]

# $1 tenant, $2 how many, $3 worker: the claimed jobs' keys, activation counts, variables.
CLAIM = {
    "update": """
WITH picked AS (
    SELECT job_key FROM jobs
    WHERE state = 'CREATED' AND job_type = 'bench' AND tenant_id = $1 AND fairness_key = ''
    ORDER BY priority DESC, queued_at, job_key LIMIT $2 FOR UPDATE SKIP LOCKED)
UPDATE jobs j SET state = 'ACTIVATED', activation_count = j.activation_count + 1,
    worker = $3, deadline = now() + interval '60 s', activated_at = now()
FROM picked p WHERE j.job_key = p.job_key
RETURNING j.job_key, j.activation_count, j.variables""",
    "append": """
WITH cur AS (
    SELECT seq FROM cursors WHERE job_type = 'bench' AND tenant_id = $1 FOR UPDATE),
picked AS (
    SELECT r.job_key, r.seq FROM ready r, cur
    WHERE r.job_type = 'bench' AND r.tenant_id = $1 AND r.seq > cur.seq
    ORDER BY r.seq LIMIT $2),
moved AS (
    UPDATE cursors c SET seq = (SELECT max(seq) FROM picked)
    WHERE c.job_type = 'bench' AND c.tenant_id = $1 AND EXISTS (SELECT 1 FROM picked)),
leased AS (
    INSERT INTO leases (job_key, activation_count, job_type, tenant_id, worker, deadline,
                        activated_at)
    SELECT job_key, 1, 'bench', $1, $3, now() + interval '60 s', now() FROM picked
    RETURNING job_key, activation_count)
SELECT l.job_key, l.activation_count, j.variables
FROM leased l JOIN jobs j ON j.job_key = l.job_key""",
}
CLAIM["move"] = CLAIM["update"]

# $1 job keys, $2 activation counts.
COMPLETE = {
    "update": """
WITH input AS (SELECT * FROM unnest($1::bigint[], $2::int[]) AS i(k, c)),
ended AS (
    UPDATE jobs j SET state = 'COMPLETED', completed_at = now(), deadline = NULL
    FROM input i
    WHERE j.job_key = i.k AND (j.state = 'ACTIVATED') IS TRUE AND j.activation_count = i.c
    RETURNING j.job_key, j.activation_count, j.activated_at, j.worker)
INSERT INTO job_events (job_key, activation_count, step, event, at, started_at, worker)
SELECT job_key, activation_count, 1, 'completed', now(), activated_at, worker FROM ended""",
    "move": """
WITH input AS (SELECT * FROM unnest($1::bigint[], $2::int[]) AS i(k, c)),
ended AS (
    DELETE FROM jobs j USING input i
    WHERE j.job_key = i.k AND (j.state = 'ACTIVATED') IS TRUE AND j.activation_count = i.c
    RETURNING j.*)
INSERT INTO done (job_key, job_type, tenant_id, fairness_key, state, priority, retries,
                  activation_count, worker, variables, created_at, activated_at,
                  completed_at)
SELECT job_key, job_type, tenant_id, fairness_key, 'COMPLETED', priority, retries,
       activation_count, worker, variables, created_at, activated_at, now()
FROM ended""",
    "append": """
WITH input AS (SELECT * FROM unnest($1::bigint[], $2::int[]) AS i(k, c)),
ended AS (
    DELETE FROM leases l USING input i
    WHERE l.job_key = i.k AND l.activation_count = i.c
    RETURNING l.*)
INSERT INTO done (job_key, tenant_id, state, activation_count, worker, activated_at,
                  completed_at)
SELECT job_key, tenant_id, 'COMPLETED', activation_count, worker, activated_at, now()
FROM ended""",
}

PRUNE = {
    "update": [
        """WITH gone AS (DELETE FROM jobs WHERE state IN ('COMPLETED', 'FAILED')
             AND completed_at < now() + interval '1 minute' RETURNING job_key)
           DELETE FROM job_events e USING gone g WHERE e.job_key = g.job_key""",
    ],
    "move": ["DROP TABLE done_today"],
    "append": ["TRUNCATE ready", "DROP TABLE done_today", "DROP TABLE jobs_today"],
}

TABLES = {
    "update": ["jobs", "job_events"],
    "move": ["jobs", "done_today"],
    "append": ["jobs_today", "ready", "cursors", "leases", "done_today"],
}


async def _wal(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))


async def _dead(
    conn: asyncpg.Connection, writers: list[asyncpg.Connection], tables: list[str]
) -> int:
    """Dead row versions in ``tables`` now, once ``writers`` flushed their statistics
    (a backend does when it goes idle after asking to; the read polls for it)."""
    for writer in writers:
        await writer.execute("SELECT pg_stat_force_next_flush()")
    await asyncio.sleep(0.5)
    return int(
        await conn.fetchval(
            "SELECT coalesce(sum(pg_stat_get_dead_tuples(c.oid)), 0) FROM pg_class c"
            " WHERE c.relname = ANY($1::text[]) AND c.relkind = 'r'",
            tables,
        )
    )


async def _phase(
    pg_pid: int, conn: asyncpg.Connection, jobs: int, work: Callable[[], Awaitable[None]]
) -> dict[str, float]:
    """PostgreSQL's CPU and WAL per job for ``work``, and its wall time."""
    wal0 = await _wal(conn)
    meter = Meter(None, pg_pid)
    t0 = time.perf_counter()
    await work()
    seconds = time.perf_counter() - t0
    cpu = meter.split(jobs)["postgresUsPerJob"]
    wal = (await _wal(conn) - wal0) / jobs
    return {"postgresUsPerJob": cpu, "walBytesPerJob": wal, "seconds": seconds}


async def _run(design: str, url: str, pg_pid: int, jobs: int, pin: bool) -> dict[str, Any]:
    producer = await asyncpg.connect(url)
    worker = await asyncpg.connect(url)
    pinned: asyncpg.Connection | None = None
    try:
        await producer.execute(SCHEMA[design])
        tenants = [f"t{i}" for i in range(TENANTS)]
        if design == "append":
            await producer.executemany(
                "INSERT INTO cursors (job_type, tenant_id) VALUES ('bench', $1)",
                [(t,) for t in tenants],
            )

        async def create() -> None:
            for k in range(0, jobs, CREATE_BATCH):
                keys = list(range(k + 1, min(jobs, k + CREATE_BATCH) + 1))
                await producer.execute(
                    CREATE[design],
                    [tenants[key % TENANTS] for key in keys],
                    keys,
                    [json.dumps({"n": key}) for key in keys],
                )

        async def drain() -> None:
            done, dry = 0, set()
            while len(dry) < TENANTS:
                for tenant in tenants:
                    if tenant in dry:
                        continue
                    rows = await worker.fetch(CLAIM[design], tenant, CLAIM_BATCH, "w")
                    if not rows:
                        dry.add(tenant)
                        continue
                    status = await worker.execute(
                        COMPLETE[design],
                        [r["job_key"] for r in rows],
                        [r["activation_count"] for r in rows],
                    )
                    assert status.endswith(f" {len(rows)}"), status
                    done += len(rows)
            assert done == jobs, (done, jobs)

        async def prune() -> None:
            for statement in PRUNE[design]:
                await producer.execute(statement)

        row: dict[str, Any] = {"design": design, "pinned": pin}
        created = await _phase(pg_pid, producer, jobs, create)
        await producer.execute("VACUUM ANALYZE")
        if pin:
            pinned = await asyncpg.connect(url)
            await pinned.execute("BEGIN; SELECT pg_current_xact_id()")
        drained = await _phase(pg_pid, producer, jobs, drain)
        row["deadAfterDrain"] = await _dead(producer, [producer, worker], TABLES[design])
        if pinned is not None:
            await pinned.execute("ROLLBACK")
        pruned = await _phase(pg_pid, producer, jobs, prune)
        for name, phase in (("create", created), ("drain", drained), ("prune", pruned)):
            row[f"{name}UsPerJob"] = phase["postgresUsPerJob"]
            row[f"{name}WalPerJob"] = phase["walBytesPerJob"]
        row["drainJobsPerSec"] = jobs / drained["seconds"]
        row["lifeUsPerJob"] = row["createUsPerJob"] + row["drainUsPerJob"] + row["pruneUsPerJob"]
        row["lifeWalPerJob"] = (
            row["createWalPerJob"] + row["drainWalPerJob"] + row["pruneWalPerJob"]
        )
        return row
    finally:
        for conn in (producer, worker, pinned):
            if conn is not None:
                await conn.close()


FIGURES = [
    "createUsPerJob",
    "drainUsPerJob",
    "pruneUsPerJob",
    "lifeUsPerJob",
    "lifeWalPerJob",
    "drainJobsPerSec",
    "deadAfterDrain",
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--repeat", type=int, default=3, help="runs per design (median reported)")
    p.add_argument("--designs", nargs="+", default=list(DESIGNS), choices=DESIGNS)
    p.add_argument("--pin", action="store_true", help="hold the xmin horizon through the drain")
    args = p.parse_args()
    pg = Postgres(ROOT / ".jobfair" / "bench")
    speed = machine_speed()
    print(speed_line(speed), flush=True)
    runs: dict[str, list[dict[str, Any]]] = {d: [] for d in args.designs}
    for rep in range(args.repeat):
        for design in args.designs:  # alternating, so the machine's noise falls on all
            url = pg.fresh_db("storage_designs", migrate=False)
            row = asyncio.run(_run(design, url, pg.postmaster_pid, args.jobs, args.pin))
            runs[design].append(row)
            print(
                f"  {rep + 1}/{args.repeat} {design:7} life {row['lifeUsPerJob']:6.1f} µs/job"
                f"  drain {row['drainJobsPerSec']:8,.0f} jobs/s",
                flush=True,
            )
    rows = []
    for design, results in runs.items():
        out: dict[str, Any] = {"design": design}
        out.update({k: median([r[k] for r in results]) for k in FIGURES})
        out["lifeRuns"] = [round(r["lifeUsPerJob"], 1) for r in results]
        rows.append(out)
    pinned = " (xmin horizon held through the drain)" if args.pin else ""
    print(f"\n## A job's life in PostgreSQL, {args.jobs:,} jobs{pinned}\n")
    print(table(rows, ["design", *FIGURES, "lifeRuns"]))
    doc = {"args": vars(args), "machine": speed, "runs": runs, "rows": rows}
    out_path = ROOT / "bench" / "results" / "storage_designs.json"
    out_path.write_text(json.dumps(doc, indent=2, default=str))
    print(json.dumps(doc, indent=2, default=str))


if __name__ == "__main__":
    main()
