-- name: dashboard_session_create!
-- A new dashboard session :id (SHA-256 of its cookie's nonce), from :now until :expires_at;
-- the expired ones go at the same time.
WITH expired AS (DELETE FROM dashboard_session WHERE expires_at <= :now)
INSERT INTO dashboard_session (id, created_at, expires_at) VALUES (:id, :now, :expires_at);

-- name: dashboard_session_live
-- Whether dashboard session :id exists and has not expired at :now.
SELECT EXISTS (SELECT FROM dashboard_session WHERE id = :id AND expires_at > :now);

-- name: dashboard_session_end!
-- End dashboard session :id (a logout).
DELETE FROM dashboard_session WHERE id = :id;
