-- Per-user API keys. A key is "jq_<id>_<secret>"; only the SHA-256 digest of the whole key is
-- stored, so the table never holds a usable key. Lookup is by id (the primary key).
CREATE TABLE api_keys (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id    bigint      NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    digest     bytea       NOT NULL,
    created_at timestamptz NOT NULL,
    revoked_at timestamptz
);

CREATE INDEX api_keys_user_idx ON api_keys (user_id) WHERE revoked_at IS NULL;
