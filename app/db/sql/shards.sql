-- fragment: j
-- The shards a statement's rows lie in, named on each reference to a distributed table
-- (``{{shards.j}}`` after a condition on the table aliased ``j``; one fragment per alias
-- the statements use).  On one PostgreSQL nothing: every row is on the one node.  On
-- Citus, ``AND j.shard = ANY(:shards)``: the shards of the tenants the call is for, all
-- in one Citus shard (the store groups a call's tenants so, app.db.citus.ShardMap), which
-- Citus prunes to at execution (deferred pruning: the generic plan holds the parameter),
-- so the statement runs whole on the one node that holds them, as PostgreSQL plans it
-- there (the router planner).  docs/scaling.md.

-- fragment: j @citus
AND j.shard = ANY(:shards::int2[])

-- fragment: x
-- As j, for the alias x.

-- fragment: x @citus
AND x.shard = ANY(:shards::int2[])

-- fragment: l
-- As j, for the alias l.

-- fragment: l @citus
AND l.shard = ANY(:shards::int2[])

-- fragment: k
-- As j, for the alias k.

-- fragment: k @citus
AND k.shard = ANY(:shards::int2[])

-- fragment: w
-- As j, for the alias w.

-- fragment: w @citus
AND w.shard = ANY(:shards::int2[])

-- fragment: e
-- As j, for the alias e.

-- fragment: e @citus
AND e.shard = ANY(:shards::int2[])

-- fragment: commit_async
-- A condition that makes the statement's transaction commit asynchronously
-- (synchronous_commit = off for it alone), for the writes of fairness state whose last
-- few a crash may forget (lane charges and settlements).  On Citus nothing: a volatile
-- function there makes Citus plan the statement's parts apart, and the statement then
-- fails; its charges commit synchronously (docs/scaling.md).
AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off'

-- fragment: commit_async @citus

-- fragment: w_of_k
-- A key weight ``w`` joined to its key ``k``: on Citus on the shard too (Citus joins two
-- distributed tables on their distribution column only).

-- fragment: w_of_k @citus
AND w.shard = k.shard

-- fragment: k_shard
-- A window over a lane's keys ``k``: on Citus partitioned by the shard too (the same
-- partitions: a tenant has one shard), which Citus then runs on each node.

-- fragment: k_shard @citus
k.shard,
