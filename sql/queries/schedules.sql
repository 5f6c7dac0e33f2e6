-- name: schedule_table
-- Whether job_schedule exists (a database from before schedules has none); every schedule.
SELECT to_regclass('job_schedule') IS NOT NULL;

-- name: schedule_list
SELECT * FROM job_schedule ORDER BY 1;

-- name: schedule_forget_code!
-- :names. Delete the code schedules not among them.
DELETE FROM job_schedule WHERE source = 'code' AND NOT (name = ANY(:names::text[]));

-- name: schedule_declare!
-- A schedule as declared: new, or changed (its spec differs: it starts again at :next_at), or as
-- it was (nothing changes, its next_at neither).
INSERT INTO job_schedule AS s (name, source, job_type, arguments, occurrence_arg, queue, cron,
                              every_s, rrule, tz, starts_at, misfire, backfill, next_at, spec,
                              concurrency_key)
VALUES (:name, :source, :job_type, :arguments::jsonb, :occurrence_arg, :queue, :cron, :every_s,
        :rrule, :tz, :starts_at, :misfire, :backfill, :next_at, :spec, :concurrency_key)
ON CONFLICT (name) DO UPDATE
SET source = EXCLUDED.source, job_type = EXCLUDED.job_type, arguments = EXCLUDED.arguments,
    occurrence_arg = EXCLUDED.occurrence_arg, queue = EXCLUDED.queue, cron = EXCLUDED.cron,
    every_s = EXCLUDED.every_s, rrule = EXCLUDED.rrule, tz = EXCLUDED.tz,
    starts_at = EXCLUDED.starts_at, misfire = EXCLUDED.misfire, backfill = EXCLUDED.backfill,
    next_at = EXCLUDED.next_at, spec = EXCLUDED.spec, concurrency_key = EXCLUDED.concurrency_key
WHERE s.spec IS DISTINCT FROM EXCLUDED.spec;

-- name: schedule_due
-- The schedules (not paused) whose next occurrence is due by :horizon, locked for this
-- transaction; those another scheduler holds are skipped.
SELECT * FROM job_schedule
WHERE NOT paused AND next_at <= :horizon
ORDER BY next_at
LIMIT :limit
FOR UPDATE SKIP LOCKED;

-- name: schedule_advance!
UPDATE job_schedule SET next_at = :next_at WHERE name = :name;

-- name: schedule_enqueue
-- The occurrences :ats of schedule :name (:at_texts: the same in ISO 8601, for :occurrence_arg)
-- not enqueued before: one job each, ripe at its time, every enqueue its own job (unique_mode
-- none: the occurrence's row is its uniqueness). Returns the new jobs' ids.
WITH occurrence AS (
    INSERT INTO job_occurrence (schedule, at, job_id)
    SELECT :name, u.at, nextval(pg_get_serial_sequence('job', 'id'))
    FROM unnest(:ats::timestamptz[]) AS u(at)
    ON CONFLICT (schedule, at) DO NOTHING
    RETURNING at, job_id
)
INSERT INTO job (id, job_type, arguments, ripe_at, max_retries, created_at, queue, unique_mode,
                 concurrency_key)
SELECT o.job_id, :job_type,
       CASE WHEN :occurrence_arg::text IS NULL THEN :arguments::jsonb
            ELSE :arguments::jsonb || jsonb_build_object(:occurrence_arg::text, t.text) END,
       o.at, :max_retries, :now, :queue, 'none', :concurrency_key
FROM occurrence AS o
JOIN unnest(:ats::timestamptz[], :at_texts::text[]) AS t(at, text) ON t.at = o.at
RETURNING id;

-- name: schedule_pause
-- Pause (or resume, at :next_at) schedule :name; returns its name, or no row.
UPDATE job_schedule SET paused = :paused, next_at = coalesce(:next_at, next_at)
WHERE name = :name RETURNING name;

-- name: schedule_drop!
DELETE FROM job_schedule WHERE name = :name;

-- name: schedule_pending_jobs
-- The jobs of schedule :name's occurrences still queued or running.
SELECT o.job_id FROM job_occurrence AS o
WHERE o.schedule = :name
  AND (EXISTS (SELECT FROM job WHERE id = o.job_id)
       OR EXISTS (SELECT FROM job_running WHERE id = o.job_id));

-- name: schedule_lock
-- Schedule :name, locked until the transaction ends (a pause or resume computes its next_at from
-- it), or no row.
SELECT * FROM job_schedule WHERE name = :name FOR UPDATE;

-- name: schedule_next_at
-- The schedules of :names that exist, with what their next occurrences are computed from
-- (next_at NULL: it has ended).
SELECT name, next_at, paused, cron, every_s, rrule, tz, starts_at
FROM job_schedule
WHERE name = ANY(:names::text[]);
