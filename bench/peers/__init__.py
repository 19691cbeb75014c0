"""Jobfair against PgQueuer and Procrastinate, in one run: ``python -m bench.peers``
(``make bench-peers``; ``--scale 0.1 --repeat 1`` for a smoke run).

Each peer runs in this process (its producer and its worker, no HTTP), Jobfair as one
``jobfair serve`` process with the Python client here; all on the same embedded
PostgreSQL, a fresh database per run.  The workloads:

- W1 enqueue: 20,000 jobs in batches of 500, one producer: jobs/s.
- W2 drain: 25,000 ready jobs (loaded beforehand, not timed), one worker with 10 or 50
  in flight and a handler that does nothing: jobs/s over the last 20,000, from the
  moment the first 5,000 were acknowledged until the last one was (the warm-up gives
  every worker its pace first: connections open, statements prepared, and for the Java
  and TypeScript workers the JIT's compiled code; a JVM's first seconds cost it twice
  the CPU per job).  Jobfair's at 50 also through its Python worker's SSE mode and the
  TypeScript (drain.mjs) and Java (DrainWorker.java) clients' workers.
- W3 pickup: an idle worker (10 in flight); the producer creates one job at a time at
  200/s (2,000 jobs, after 100 not counted): ms from just before the create call to the
  handler's start, and the create call's own time.
- W4 fairness: 5,000 jobs of tenant A, then 20 of B (for the peers, which have no
  tenants, a field of the payload), then a worker with 10 in flight: the position of B's
  last job in handler start order.
- CPU per job (µs) of the server, PostgreSQL and this process, for W1 and W2.
"""
