-- name: user_create
-- A new user (e-mail addresses are not unique: `jobq.domain.users` says why).
INSERT INTO users (name, email, webhook_url, created_at)
VALUES (:name, :email, :webhook_url, :now)
RETURNING id, name, email, webhook_url, created_at;

-- name: user_get
SELECT id, name, email, webhook_url, created_at FROM users WHERE id = :user_id;

-- name: user_exists
SELECT true FROM users WHERE id = :user_id;

-- name: user_lock
-- Lock user :user_id's row until the transaction ends, so that concurrent requests cannot both
-- count the user's reminders (exports, keys) below a limit and add one. Returns its webhook_url,
-- or no row for an unknown user.
SELECT webhook_url FROM users WHERE id = :user_id FOR NO KEY UPDATE;
