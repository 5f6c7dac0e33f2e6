-- The cap on a user's unsent reminders (jobq.domain.reminders, JOBQ_MAX_REMINDERS_PER_USER),
-- kept without a lock held while a request runs. A creation first takes a hold on one more
-- unsent reminder (reminder_hold_take), in a short transaction of its own; its request's
-- transaction then turns the hold into the reminder (reminder_create deletes the hold, inserts
-- the reminder), so that a user's unsent reminders plus holds never exceed the cap.
-- `taken` is never below that sum: a take that finds it under the cap adds one; one that does
-- not counts the sum afresh under the row's lock (sent, deleted and released ones fall out).
CREATE TABLE reminder_quotas (
    user_id bigint  PRIMARY KEY REFERENCES users (id) ON DELETE CASCADE,
    taken   integer NOT NULL CHECK (taken >= 0)
);

-- The holds of creations in progress: `id` is the id their reminder will have. A hold whose
-- request died (its process killed) is dropped by the next recount once it is older than a
-- grace period and no transaction holds its row.
CREATE TABLE reminder_holds (
    id       bigint      PRIMARY KEY,
    user_id  bigint      NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    taken_at timestamptz NOT NULL
);

CREATE INDEX reminder_holds_user_idx ON reminder_holds (user_id);
