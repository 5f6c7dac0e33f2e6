-- name: export_count
-- User :user_id's exports (each counts against the limit until deleted).
SELECT count(*) FROM exports WHERE user_id = :user_id;

-- name: export_bytes
-- The bytes user :user_id's stored export files take (their storage cap's measure).
SELECT coalesce(sum(octet_length(content)), 0) FROM exports WHERE user_id = :user_id;

-- name: export_delete
-- Delete user :user_id's export :export_id; returns its job_id and whether its file was stored
-- (a pending one's job is cancelled by the caller), or no row.
DELETE FROM exports
WHERE id = :export_id AND user_id = :user_id
RETURNING job_id, content IS NOT NULL AS done;

-- name: export_create
INSERT INTO exports (user_id, created_at) VALUES (:user_id, :now) RETURNING id;

-- name: export_job_set!
UPDATE exports SET job_id = :job_id WHERE id = :export_id;

-- name: export_get
-- User :user_id's export :export_id; `done` once its file is stored (the state of its job, for
-- the others, is the queue's: `jobq.queue.control.job_states`); `num_parts` and the parts
-- rendered so far.
SELECT e.id, e.user_id, e.job_id, e.created_at, e.finished_at, e.content IS NOT NULL AS done,
       e.num_parts, (SELECT count(*) FROM export_parts AS p WHERE p.export_id = e.id) AS parts_done
FROM exports AS e
WHERE e.id = :export_id AND e.user_id = :user_id;

-- name: export_content
-- The file of user :user_id's export :export_id (NULL while it is not rendered), or no row.
SELECT content FROM exports WHERE id = :export_id AND user_id = :user_id;

-- name: export_owner
-- The user (id and name) of export :export_id still to render, and its number of parts (0:
-- rendered whole), or no row (done, or gone).
SELECT e.user_id, u.name, e.num_parts
FROM exports AS e JOIN users AS u ON u.id = e.user_id
WHERE e.id = :export_id AND e.content IS NULL;

-- name: export_entries
-- What an export of user :user_id lists: each of the user's reminders, by due time.
SELECT id AS reminder_id, message, remind_at, created_at
FROM reminders
WHERE user_id = :user_id
ORDER BY remind_at, id;

-- name: export_store
-- Store export :export_id's file once; returns its id, or no row (stored already, or gone).
UPDATE exports SET content = :content, finished_at = :now
WHERE id = :export_id AND content IS NULL
RETURNING id;

-- name: export_parts_clear!
-- Forget the parts of export :export_id (its file is stored).
DELETE FROM export_parts WHERE export_id = :export_id;

-- name: export_reminder_ids
-- The ids of user :user_id's reminders, in the order an export lists them.
SELECT id FROM reminders WHERE user_id = :user_id ORDER BY remind_at, id;

-- name: export_parts_planned!
-- Export :export_id renders in :num_parts parts.
UPDATE exports SET num_parts = :num_parts WHERE id = :export_id;

-- name: export_part_entries
-- The reminders :reminder_ids of user :user_id that still exist, in the order an export lists
-- them.
SELECT id AS reminder_id, message, remind_at, created_at
FROM reminders
WHERE user_id = :user_id AND id = ANY(:reminder_ids::bigint[])
ORDER BY remind_at, id;

-- name: export_part_store!
-- Part :part of export :export_id, rendered (once: a second run of its job changes nothing).
INSERT INTO export_parts (export_id, part, content) VALUES (:export_id, :part, :content)
ON CONFLICT (export_id, part) DO NOTHING;

-- name: export_parts_read
-- The parts of export :export_id rendered so far, in order.
SELECT part, content FROM export_parts WHERE export_id = :export_id ORDER BY part;
