-- E-mail addresses are no longer unique: sign-up answers at once with a working key and sends
-- no mail, so a refusal for a taken address would tell anyone which addresses are registered
-- (jobq.domain.users).
DROP INDEX users_email_key;

-- The dashboard's sessions, server-side: a session lives from its login until its logout or
-- its expiry; the cookie names it (jobq.dashboard.session). `id`: SHA-256 of the cookie's
-- random nonce, so that the table holds nothing a browser could present.
CREATE TABLE dashboard_session (
    id         bytea       PRIMARY KEY,
    created_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);
