-- name: insert_key
-- A new key.  Index: api_keys pkey.
INSERT INTO api_keys (key_id, secret_sha256, role, tenants, job_types, name, expires_at,
                      created_at, created_by)
VALUES (:key_id, :secret_sha256, :role, :tenants, :job_types, :name, :expires_at, :now,
        :created_by)
RETURNING key_id, secret_sha256, role, tenants, job_types, name, expires_at,
    created_at, created_by, last_used_at, revoked_at

-- name: key_in_use
-- A key, read to verify a request, and its last use recorded when the one on record is
-- older than :touch_before (so a busy key is written about once a minute, not per request).
-- Index: api_keys pkey.  The CTE's row lock is taken only when it writes.
WITH touched AS (
    UPDATE api_keys SET last_used_at = :now
    WHERE key_id = :key_id AND (last_used_at IS NULL OR last_used_at < :touch_before)
    RETURNING key_id
)
SELECT key_id, secret_sha256, role, tenants, job_types, name, expires_at,
    created_at, created_by, last_used_at, revoked_at, (SELECT count(*) FROM touched) AS _touched
FROM api_keys WHERE key_id = :key_id

-- name: list_keys
-- Every key, newest first (revoked ones too: the audit trail).
SELECT key_id, secret_sha256, role, tenants, job_types, name, expires_at,
    created_at, created_by, last_used_at, revoked_at FROM api_keys ORDER BY created_at DESC, key_id

-- name: revoke_key
-- Revoke a key (again: no change, the first revocation's time stays).  Index: pkey.
UPDATE api_keys SET revoked_at = COALESCE(revoked_at, :now) WHERE key_id = :key_id
RETURNING key_id, secret_sha256, role, tenants, job_types, name, expires_at,
    created_at, created_by, last_used_at, revoked_at

-- name: signing_secret
-- The secret OAuth access tokens are signed with: made by the first caller (:secret, random),
-- the same for every later one and every process.
WITH made AS (
    INSERT INTO signing_keys (id, secret, created_at) VALUES (1, :secret, :now)
    ON CONFLICT (id) DO NOTHING
    RETURNING secret
)
SELECT secret FROM made UNION ALL SELECT secret FROM signing_keys WHERE id = 1 LIMIT 1
