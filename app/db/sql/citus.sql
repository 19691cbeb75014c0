-- name: citus_version
-- The Citus extension's version in this database, or NULL: a database without Citus.
SELECT (SELECT extversion FROM pg_extension WHERE extname = 'citus') AS version

-- name: placements
-- How Citus holds each of Jobfair's tables (:tables): 'h' distributed by hash on a column,
-- 'n' a reference table (a copy on every node), NULL not at all (a local table of the
-- coordinator); the distribution column, and the colocation group.  Citus's catalog:
-- planned only where Citus is installed.
SELECT t.name AS table_name, p.partmethod::text AS method,
       CASE WHEN p.partmethod = 'h'
            THEN column_to_column_name(p.logicalrelid, p.partkey) END AS column_name,
       p.colocationid AS colocation
FROM unnest(:tables::text[]) AS t(name)
LEFT JOIN pg_dist_partition p ON p.logicalrelid = t.name::regclass

-- name: make_reference
-- Makes :table a reference table: copied whole to every node, its writes to all of them.
SELECT create_reference_table(:table::text::regclass)

-- name: distribute
-- Distributes :table by its ``shard`` column, colocated with :colocate_with (NULL: the
-- first of the group, jobs, in :shard_count Citus shards; the others have its): a
-- tenant's jobs, lanes, lane keys, key weights and history rows lie in the same Citus
-- shard, on one node.  Its rows, if any, are copied out.
SELECT create_distributed_table(:table::text::regclass, 'shard',
                                colocate_with => COALESCE(:colocate_with::text, 'default'),
                                shard_count => :shard_count::int)

-- name: worker_nodes
-- The worker nodes that may hold shards (the coordinator's group is 0).
SELECT count(*)::int FROM pg_dist_node
WHERE groupid <> 0 AND noderole = 'primary' AND isactive AND shouldhaveshards

-- name: shard_ids
-- Which Citus shard holds each of Jobfair's shard values (0 to :shards - 1), as Citus
-- hashes ``jobs.shard``: the store sends one statement per Citus shard
-- (app.db.citus.ShardMap).  Citus's catalog: planned only where Citus is installed.
SELECT s::int2 AS shard, get_shard_id_for_distribution_column('jobs', s::int2) AS shard_id
FROM generate_series(0, :shards::int - 1) AS s
