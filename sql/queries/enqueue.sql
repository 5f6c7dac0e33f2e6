-- name: job_enqueue
-- One job of the `Unique` modes `none` or `queued` (`store.enqueue`): the insert, whose md5
-- job_md5_key checks for `queued`. Returns the new job's id, or its queued twin's with duplicate
-- true; no row when the twin committed after this statement's snapshot, or was claimed meanwhile
-- (the caller tries again).
WITH queued AS (
    INSERT INTO job (job_type, arguments, ripe_at, priority, max_retries, created_at, queue,
                     concurrency_key, unique_mode, unique_key)
    VALUES (:job_type, :arguments::jsonb, :ripe_at, :priority, :max_retries, :now, :queue,
            :concurrency_key, :unique_mode, :unique_key)
    ON CONFLICT (md5) DO NOTHING
    RETURNING id
)
SELECT id, false AS duplicate FROM queued
UNION ALL
SELECT id, true FROM job
WHERE md5 = md5(:job_type || coalesce('#' || :unique_key::text, :arguments::jsonb::text))
  AND :unique_mode = 'queued' AND NOT EXISTS (SELECT FROM queued);

-- name: job_enqueue_held
-- One job of the modes `active` or `period`: first take its key in job_unique, or take it over
-- when its job is no longer queued or running (`active`) or its period is over; then the job.
-- Returns as `job_enqueue` does (the twin is the key's job).
WITH new AS (
    SELECT nextval(pg_get_serial_sequence('job', 'id')) AS id,
           md5(:job_type::text || coalesce('#' || :unique_key::text, :arguments::jsonb::text))
               AS md5
), held AS (
    INSERT INTO job_unique AS u (md5, job_id, until)
    SELECT new.md5, new.id,
           CASE WHEN :unique_mode::text = 'period' THEN :now::timestamptz + :period::interval END
    FROM new
    ON CONFLICT (md5) DO UPDATE SET job_id = EXCLUDED.job_id, until = EXCLUDED.until
    WHERE CASE WHEN u.until IS NULL THEN NOT job_is_active(u.job_id) ELSE u.until <= :now END
    RETURNING job_id
), queued AS (
    INSERT INTO job (id, job_type, arguments, ripe_at, priority, max_retries, created_at, queue,
                     concurrency_key, unique_mode, unique_key)
    SELECT held.job_id, :job_type, :arguments::jsonb, :ripe_at, :priority, :max_retries, :now,
           :queue, :concurrency_key, :unique_mode, :unique_key
    FROM held
    RETURNING id
)
SELECT id, false AS duplicate FROM queued
UNION ALL
SELECT u.job_id, true FROM job_unique AS u, new
WHERE u.md5 = new.md5 AND NOT EXISTS (SELECT FROM held);

-- name: job_hasten!
-- A duplicate's twin, queued, ripens no later than :ripe_at (`Unique.on_conflict` `earlier`).
UPDATE job SET ripe_at = :ripe_at WHERE id = :job_id AND ripe_at > :ripe_at;

-- name: job_enqueue_many
-- Many jobs of the modes `none` and `queued` (`store.enqueue_many`); the duplicates of queued jobs
-- are skipped, and the twins of those with :hasten ripen no later than they would have.
WITH u AS (
    SELECT * FROM unnest(:job_types::text[], :arguments::text[], :ripe_ats::timestamptz[],
                         :priorities::smallint[], :max_retries::int[], :queues::text[],
                         :concurrency_keys::text[], :unique_modes::text[], :unique_keys::text[],
                         :hasten::boolean[]) AS u(t, a, r, p, m, q, k, um, uk, h)
), queued AS (
    INSERT INTO job (job_type, arguments, ripe_at, priority, max_retries, created_at, queue,
                     concurrency_key, unique_mode, unique_key)
    SELECT t, a::jsonb, r, p, m, :now, q, k, um, uk FROM u
    ON CONFLICT (md5) DO NOTHING
    RETURNING id, queue, job_type
), hastened AS (
    UPDATE job SET ripe_at = u.r
    FROM u
    WHERE u.h AND u.um = 'queued' AND job.md5 = md5(u.t || coalesce('#' || u.uk, u.a::jsonb::text))
      AND job.ripe_at > u.r
)
SELECT id, queue, job_type FROM queued;
