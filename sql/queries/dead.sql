-- name: job_dead_list
-- :after: list ids below this one (NULL: from the newest). Newest (highest id) first. Of queue
-- :queue, type :job_type, whose last error contains :error and whose arguments contain
-- :arguments (each NULL: any).
SELECT id, job_type, arguments, priority, attempts, max_retries, last_error, created_at, died_at, queue, concurrency_key FROM job_dead
WHERE id < coalesce(:after::bigint, 9223372036854775807)
  AND (:queue::text IS NULL OR queue = :queue)
  AND (:job_type::text IS NULL OR job_type = :job_type)
  AND (:error::text IS NULL OR strpos(last_error, :error) > 0)
  AND (:arguments::jsonb IS NULL OR arguments @> :arguments)
ORDER BY id DESC
LIMIT :limit;

-- name: job_dead_retry
-- Back to `job`, ripe now, with its retries reset (`attempts` 0) and its last error kept. The dead
-- row is locked first, so a concurrent retry or discard of the same job waits and then finds it
-- gone. When an identical job is queued (same md5), nothing changes.
WITH requeued AS (
    INSERT INTO job (id, job_type, arguments, ripe_at, priority, attempts, max_retries, last_error, created_at, queue, concurrency_key, awaited, unique_mode, unique_key)
    SELECT id, job_type, arguments, :now::timestamptz, priority, 0, max_retries, last_error,
           created_at, queue, concurrency_key, false, 'queued', NULL
    FROM (SELECT * FROM job_dead WHERE id = :job_id FOR UPDATE) AS dead
    ON CONFLICT (md5) DO NOTHING
    RETURNING id, job_type, arguments, ripe_at, priority, attempts, max_retries, last_error, created_at, queue, concurrency_key, awaited, unique_mode, unique_key
), revived AS (
    DELETE FROM job_dead WHERE id IN (SELECT id FROM requeued)
)
SELECT id, job_type, arguments, ripe_at, priority, attempts, max_retries, last_error, created_at, queue, concurrency_key, awaited, unique_mode, unique_key FROM requeued;

-- name: job_dead_twin
-- The queued job identical to the dead job, if any (one row while the dead job exists).
SELECT j.id AS twin_id
FROM job_dead AS d LEFT JOIN job AS j ON j.md5 = md5(d.job_type || d.arguments::text)
WHERE d.id = :job_id;

-- name: job_dead_discard
DELETE FROM job_dead WHERE id = :job_id RETURNING id;
