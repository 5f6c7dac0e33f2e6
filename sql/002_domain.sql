-- The domain: users, their reminders (each delivered by a send_reminder job) and
-- iCalendar exports (each rendered by a render_export job).

CREATE TABLE users (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text        NOT NULL,
    email       text        NOT NULL,
    webhook_url text,
    created_at  timestamptz NOT NULL
);

CREATE UNIQUE INDEX users_email_key ON users (lower(email));

CREATE TABLE reminders (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id    bigint      NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    message    text        NOT NULL,
    remind_at  timestamptz NOT NULL,
    -- The send_reminder job; it moves between job, job_running and job_dead (see job_state).
    job_id     bigint,
    sent_at    timestamptz,
    -- Delivery attempts made, recorded when the reminder is sent.
    attempts   integer     NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL
);

CREATE INDEX reminders_user_idx ON reminders (user_id, remind_at);

CREATE TABLE exports (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id     bigint      NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    job_id      bigint,
    content     text,
    created_at  timestamptz NOT NULL,
    finished_at timestamptz
);

CREATE INDEX exports_user_idx ON exports (user_id);
