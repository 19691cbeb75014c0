-- name: try_leader_lock
-- The leader lock (:key, app.db.locks.LEADER_LOCK_KEY, in the one-bigint space), tried:
-- whether this session holds it now.  Session-level: held until the connection ends.
SELECT pg_try_advisory_lock(:key)

-- name: check
-- The leader's connection answers (it holds the lock as long as it lives).
SELECT 1
