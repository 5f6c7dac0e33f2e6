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
-- the others, is the queue's: `jobq.queue.control.job_states`).
SELECT id, user_id, job_id, created_at, finished_at, content IS NOT NULL AS done
FROM exports
WHERE id = :export_id AND user_id = :user_id;

-- name: export_content
-- The file of user :user_id's export :export_id (NULL while it is not rendered), or no row.
SELECT content FROM exports WHERE id = :export_id AND user_id = :user_id;

-- name: export_owner
-- The user (id and name) of export :export_id still to render, or no row (done, or gone).
SELECT e.user_id, u.name
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
