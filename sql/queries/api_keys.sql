-- name: api_key_count
-- User :user_id's keys not revoked.
SELECT count(*) FROM api_keys WHERE user_id = :user_id AND revoked_at IS NULL;

-- name: api_key_create
-- A new key's row, its digest still empty (the key names the row's id: `api_key_digest_set`
-- stores it once made). Returns its id.
INSERT INTO api_keys (user_id, digest, created_at) VALUES (:user_id, '', :now) RETURNING id;

-- name: api_key_digest_set!
UPDATE api_keys SET digest = :digest WHERE id = :key_id;

-- name: api_key_revoke
-- Revoke user :user_id's key :key_id at :now; returns its id, or no row (no such unrevoked key).
UPDATE api_keys SET revoked_at = :now
WHERE id = :key_id AND user_id = :user_id AND revoked_at IS NULL
RETURNING id;

-- name: api_key_find
-- The owner and digest of key :key_id, unless it is revoked.
SELECT user_id, digest FROM api_keys WHERE id = :key_id AND revoked_at IS NULL;

-- name: api_key_find_many
-- The id, owner and digest of each of keys :key_ids that is not revoked (the cache's lookups).
SELECT id, user_id, digest FROM api_keys
WHERE id = ANY(:key_ids::bigint[]) AND revoked_at IS NULL;
