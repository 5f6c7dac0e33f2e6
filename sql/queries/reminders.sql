-- name: reminder_hold_take
-- A hold on one more unsent reminder of user :user_id, at most :max_unsent (see the function);
-- alone, in autocommit.
SELECT hold_id FROM reminder_hold_take(:user_id, :max_unsent, :now, :grace);

-- name: reminder_hold_release!
-- Release hold :hold_id, whose request failed (nothing when its reminder was made).
DELETE FROM reminder_holds WHERE id = :hold_id;

-- name: reminder_create
-- Turn hold :id (reminder_hold_take) into user :user_id's recurring reminder with that id (:rrule,
-- :tz, :until, :count: its recurrence; its schedule is saved in the same transaction); returns
-- its id, or no row when the hold is gone (dropped as its request's, after the grace).
WITH hold AS (
    DELETE FROM reminder_holds WHERE id = :id AND user_id = :user_id RETURNING id, user_id
)
INSERT INTO reminders (id, user_id, message, remind_at, created_at, rrule, tz, until, count)
OVERRIDING SYSTEM VALUE
SELECT id, user_id, :message::text, :remind_at::timestamptz, :now::timestamptz, :rrule::text,
       :tz::text, :until::timestamptz, :count::integer
FROM hold
RETURNING id;

-- name: reminder_create_one_off
-- Turn hold :id (reminder_hold_take) into user :user_id's one-off reminder with that id and
-- enqueue its send_reminder job (job_enqueue, given the job's columns), all in this one statement:
-- one round trip, atomic alone. Returns the reminder's id and its job's id, or no row when the
-- hold is gone (dropped as its request's, after the grace): then no job is enqueued either.
WITH hold AS (
    DELETE FROM reminder_holds WHERE id = :id AND user_id = :user_id RETURNING id, user_id
)
INSERT INTO reminders (id, user_id, message, remind_at, created_at, job_id)
OVERRIDING SYSTEM VALUE
SELECT id, user_id, :message::text, :remind_at::timestamptz, :now::timestamptz,
       job_enqueue(:job_type, :arguments::jsonb, :ripe_at, :priority::smallint,
                   :max_retries, :now, :queue, :concurrency_key, :unique_mode, :unique_key,
                   :traceparent)
FROM hold
RETURNING id, job_id;

-- name: reminder_get
-- User :user_id's reminder :reminder_id. Its status derives from its job's state and its
-- schedule's next occurrence, which the queue gives (`jobq.queue.control.job_states`,
-- `jobq.queue.schedule.next_at`).
SELECT id, user_id, message, remind_at, job_id, sent_at, created_at, attempts, rrule, tz,
       until, count, paused, deliveries, last_occurrence_at
FROM reminders
WHERE id = :reminder_id AND user_id = :user_id;

-- name: reminder_list
-- User :user_id's reminders by due time, as `reminder_get` reads each.
SELECT id, user_id, message, remind_at, job_id, sent_at, created_at, attempts, rrule, tz,
       until, count, paused, deliveries, last_occurrence_at
FROM reminders
WHERE user_id = :user_id
ORDER BY remind_at, id;

-- name: reminder_sent_of
-- When each of reminders :reminder_ids was sent (NULL: not yet) and after how many attempts:
-- read again when its job ended after the reminder was read (a delivery marks its reminder sent
-- before its job ends).
SELECT id, sent_at, attempts FROM reminders WHERE id = ANY(:reminder_ids::bigint[]);

-- name: reminder_delete
-- Delete user :user_id's reminder :reminder_id, sent or not; returns its job_id, rrule and
-- whether it was sent (an unsent one's job is cancelled, its schedule dropped, by the caller),
-- or no row.
DELETE FROM reminders
WHERE id = :reminder_id AND user_id = :user_id
RETURNING job_id, rrule, sent_at IS NOT NULL AS sent;

-- name: reminder_pause
-- Mark user :user_id's reminder :reminder_id paused (or not); returns its rrule (NULL: a one-off
-- reminder), or no row.
UPDATE reminders SET paused = :paused
WHERE id = :reminder_id AND user_id = :user_id
RETURNING rrule;

-- name: reminder_delivery
-- What delivering reminder :reminder_id takes, while it is not sent (:recurring: whether it is a
-- recurring one, which is never marked sent), or no row.
SELECT r.id AS reminder_id, r.user_id, r.message, r.remind_at, u.webhook_url
FROM reminders AS r JOIN users AS u ON u.id = r.user_id
WHERE r.id = :reminder_id AND r.sent_at IS NULL AND (r.rrule IS NOT NULL) = :recurring;

-- name: reminder_occurrence_sent
-- Count occurrence :occurrence_at of recurring reminder :reminder_id delivered, unless it or a
-- later one was counted already, and end its delivery's hold :hold_id (NULL: none; as
-- webhook_hold_release does); returns its id, or no row (the hold ends either way).
WITH released AS (
    DELETE FROM webhook_hold WHERE id = :hold_id
)
UPDATE reminders SET deliveries = deliveries + 1, last_occurrence_at = :occurrence_at
WHERE id = :reminder_id AND (last_occurrence_at IS NULL OR last_occurrence_at < :occurrence_at)
RETURNING id;

-- name: reminder_sent
-- Mark reminder :reminder_id sent at :now after :attempts attempts (one delivery), once, and end
-- its delivery's hold :hold_id (NULL: none; as webhook_hold_release does); returns its id, or
-- no row (sent already, or gone; the hold ends either way).
WITH released AS (
    DELETE FROM webhook_hold WHERE id = :hold_id
)
UPDATE reminders SET sent_at = :now, attempts = :attempts, deliveries = deliveries + 1
WHERE id = :reminder_id AND sent_at IS NULL
RETURNING id;
