-- name: job_record
WITH
completed AS (
    DELETE FROM job_running WHERE token = ANY(:completed::bigint[])
    RETURNING token, id, job_type, queue, arguments, attempts, last_error, created_at, awaited,
              cancelled_at, claimed_at
), succeeded AS (
    INSERT INTO job_done (id, job_type, queue, arguments, state, attempts, last_error, result, created_at, finished_at, started_at)
    SELECT s.id, s.job_type, s.queue, s.arguments, CASE WHEN s.cancelled_at IS NULL THEN 'succeeded' ELSE 'cancelled' END, s.attempts + 1, s.last_error, CASE WHEN s.cancelled_at IS NULL THEN s.result::jsonb END,
           s.created_at, :now::timestamptz, s.claimed_at
    FROM (SELECT c.*, u.result FROM completed AS c JOIN unnest(:completed::bigint[], :results::text[]) AS u(token, result) USING (token)) AS s
    WHERE :retain::boolean
), failed AS (
    DELETE FROM job_running AS r
    USING unnest(:failed::bigint[], :failed_ripe_ats::timestamptz[], :failed_errors::text[],
                 :failed_charges::int[], :failed_tracebacks::text[])
          AS u(token, ripe_at, error, charge, traceback)
    WHERE r.token = u.token
    RETURNING r.token, r.id, r.job_type, r.arguments, r.priority,
              -- a release keeps the job's place in the queue; a retry waits its backoff, a
              -- snooze its delay
              coalesce(u.ripe_at, least(r.ripe_at, :now::timestamptz)) AS next_ripe_at,
              r.attempts + u.charge AS next_attempts, r.max_retries,
              coalesce(u.error, r.last_error) AS next_error, r.created_at, r.queue,
              r.concurrency_key, r.attempts, r.awaited, r.cancelled_at, r.unique_mode,
              r.unique_key, r.worker_id, u.charge, u.error AS attempt_error, u.traceback,
              r.claimed_at
),
live AS (
    SELECT * FROM failed WHERE cancelled_at IS NULL
), cancelled AS (
    INSERT INTO job_done (id, job_type, queue, arguments, state, attempts, last_error, result, created_at, finished_at, started_at)
    SELECT s.id, s.job_type, s.queue, s.arguments, 'cancelled', s.attempts + 1, s.next_error, NULL,
           s.created_at, :now::timestamptz, s.claimed_at
    FROM (SELECT * FROM failed WHERE cancelled_at IS NOT NULL) AS s
    WHERE :retain::boolean
),
requeued AS (
    INSERT INTO job (id, job_type, arguments, ripe_at, priority, attempts, max_retries, last_error, created_at, queue, concurrency_key, awaited, unique_mode, unique_key)
    SELECT s.id, s.job_type, s.arguments, s.next_ripe_at, s.priority, s.next_attempts, s.max_retries,
           s.next_error, s.created_at, s.queue, s.concurrency_key, s.awaited, s.unique_mode,
           s.unique_key
    FROM live AS s
    ON CONFLICT (md5) DO NOTHING
    RETURNING id
), hastened AS (
    UPDATE job SET ripe_at = least(job.ripe_at, s.next_ripe_at)
    FROM live AS s
    WHERE s.unique_mode = 'queued' AND job.md5 = md5(s.job_type || coalesce('#' || s.unique_key, s.arguments::text))
      AND s.id NOT IN (SELECT id FROM requeued)
    RETURNING job.id, s.id AS merged_id
), merged AS (
    INSERT INTO job_dead (id, job_type, arguments, priority, attempts, max_retries, last_error, created_at, died_at, queue, concurrency_key)
    SELECT s.id, s.job_type, s.arguments, s.priority, s.next_attempts, s.max_retries,
           coalesce('merged into queued duplicate job ' || h.id, 'merged into a queued duplicate'),
           s.created_at, :now::timestamptz, s.queue, s.concurrency_key
    FROM live AS s LEFT JOIN hastened AS h ON h.merged_id = s.id
    WHERE s.id NOT IN (SELECT id FROM requeued)
), buried AS (
    DELETE FROM job_running AS r
    USING unnest(:buried::bigint[], :buried_errors::text[], :buried_tracebacks::text[])
          AS u(token, error, traceback)
    WHERE r.token = u.token
    RETURNING r.token, r.id, r.job_type, r.arguments, r.priority, r.attempts, r.max_retries,
              u.error, r.created_at, r.queue, r.concurrency_key, r.awaited, r.cancelled_at,
              r.worker_id, u.traceback, r.claimed_at
), attempted AS (
    INSERT INTO job_attempt (job_id, attempt, worker_id, error, traceback, failed_at)
    SELECT id, attempts + 1, worker_id, error, traceback, :now::timestamptz FROM (
        SELECT id, attempts, worker_id, attempt_error AS error, traceback FROM failed
        WHERE charge > 0
        UNION ALL SELECT id, attempts, worker_id, error, traceback FROM buried
    ) AS a
    WHERE :retain::boolean
), dead AS (
    INSERT INTO job_dead (id, job_type, arguments, priority, attempts, max_retries, last_error, created_at, died_at, queue, concurrency_key, started_at)
    SELECT id, job_type, arguments, priority, attempts + 1, max_retries, error, created_at, :now,
           queue, concurrency_key, claimed_at
    FROM buried WHERE cancelled_at IS NULL
), buried_cancelled AS (
    INSERT INTO job_done (id, job_type, queue, arguments, state, attempts, last_error, result, created_at, finished_at, started_at)
    SELECT s.id, s.job_type, s.queue, s.arguments, 'cancelled', s.attempts + 1, s.error, NULL,
           s.created_at, :now::timestamptz, s.claimed_at
    FROM (SELECT * FROM buried WHERE cancelled_at IS NOT NULL) AS s
    WHERE :retain::boolean
), recorded AS (
    SELECT token FROM completed
    UNION ALL SELECT token FROM failed
    UNION ALL SELECT token FROM buried
), ended AS (
    SELECT id, awaited FROM completed
    UNION ALL SELECT id, awaited FROM failed WHERE cancelled_at IS NOT NULL
    UNION ALL SELECT id, awaited FROM buried
)
SELECT token FROM recorded WHERE (SELECT count(pg_notify('jobq_done', id::text)) FROM ended WHERE awaited) >= 0;

-- name: job_rescue
-- :error: the last error of the rescued jobs. A rescue charges an attempt: a job that kills its
-- worker every time must end in the dead letter rather than crash workers forever. A rescued job
-- keeps its place in the queue (its own ripe_at), ahead of jobs that ripened since.
WITH alive AS (
    SELECT worker_id FROM job_workers_alive(:now, :heartbeat_grace)
), lost AS (
    DELETE FROM job_running
    WHERE lease_expires_at < :now OR worker_id NOT IN (SELECT worker_id FROM alive)
    RETURNING id, job_type, arguments, ripe_at, priority, attempts, max_retries, last_error, created_at, queue, concurrency_key, awaited, unique_mode, unique_key, cancelled_at, worker_id, claimed_at
), attempted AS (
    INSERT INTO job_attempt (job_id, attempt, worker_id, error, failed_at)
    SELECT id, attempts + 1, worker_id, :error, :now FROM lost WHERE :retain::boolean
), retrying AS (  -- the cancelled ones end in `job_done` (_back_to_queue)
    SELECT * FROM lost WHERE attempts < max_retries OR cancelled_at IS NOT NULL
),
live AS (
    SELECT * FROM retrying WHERE cancelled_at IS NULL
), cancelled AS (
    INSERT INTO job_done (id, job_type, queue, arguments, state, attempts, last_error, result, created_at, finished_at, started_at)
    SELECT s.id, s.job_type, s.queue, s.arguments, 'cancelled', s.attempts + 1, :error::text, NULL,
           s.created_at, :now::timestamptz, s.claimed_at
    FROM (SELECT * FROM retrying WHERE cancelled_at IS NOT NULL) AS s
    WHERE :retain::boolean
),
requeued AS (
    INSERT INTO job (id, job_type, arguments, ripe_at, priority, attempts, max_retries, last_error, created_at, queue, concurrency_key, awaited, unique_mode, unique_key)
    SELECT s.id, s.job_type, s.arguments, least(s.ripe_at, :now::timestamptz), s.priority, s.attempts + 1, s.max_retries,
           :error::text, s.created_at, s.queue, s.concurrency_key, s.awaited, s.unique_mode,
           s.unique_key
    FROM live AS s
    ON CONFLICT (md5) DO NOTHING
    RETURNING id
), hastened AS (
    UPDATE job SET ripe_at = least(job.ripe_at, least(s.ripe_at, :now::timestamptz))
    FROM live AS s
    WHERE s.unique_mode = 'queued' AND job.md5 = md5(s.job_type || coalesce('#' || s.unique_key, s.arguments::text))
      AND s.id NOT IN (SELECT id FROM requeued)
    RETURNING job.id, s.id AS merged_id
), merged AS (
    INSERT INTO job_dead (id, job_type, arguments, priority, attempts, max_retries, last_error, created_at, died_at, queue, concurrency_key)
    SELECT s.id, s.job_type, s.arguments, s.priority, s.attempts + 1, s.max_retries,
           coalesce('merged into queued duplicate job ' || h.id, 'merged into a queued duplicate'),
           s.created_at, :now::timestamptz, s.queue, s.concurrency_key
    FROM live AS s LEFT JOIN hastened AS h ON h.merged_id = s.id
    WHERE s.id NOT IN (SELECT id FROM requeued)
), buried AS (
    INSERT INTO job_dead (id, job_type, arguments, priority, attempts, max_retries, last_error, created_at, died_at, queue, concurrency_key, started_at)
    SELECT id, job_type, arguments, priority, attempts + 1, max_retries, :error, created_at, :now,
           queue, concurrency_key, claimed_at
    FROM lost WHERE attempts >= max_retries AND cancelled_at IS NULL
), gone AS (
    DELETE FROM worker WHERE id NOT IN (SELECT worker_id FROM alive)
), ended AS (
    SELECT id, awaited FROM lost WHERE attempts >= max_retries OR cancelled_at IS NOT NULL
)
SELECT count(*) FROM lost WHERE (SELECT count(pg_notify('jobq_done', id::text)) FROM ended WHERE awaited) >= 0;

-- name: job_release_orphans
-- :tokens: those the worker holds. Claims of the worker whose answer never reached it (its
-- connection was cut as the claim committed): it never started those jobs. They go back to the
-- queue at their place, with no attempt charged.
WITH orphans AS (
    DELETE FROM job_running WHERE worker_id = :worker_id AND NOT (token = ANY(:tokens::bigint[]))
    RETURNING id, job_type, arguments, ripe_at, priority, attempts, max_retries, last_error, created_at, queue, concurrency_key, awaited, unique_mode, unique_key, cancelled_at
),
live AS (
    SELECT * FROM orphans WHERE cancelled_at IS NULL
), cancelled AS (
    INSERT INTO job_done (id, job_type, queue, arguments, state, attempts, last_error, result, created_at, finished_at)
    SELECT s.id, s.job_type, s.queue, s.arguments, 'cancelled', s.attempts, s.last_error, NULL,
           s.created_at, :now::timestamptz
    FROM (SELECT * FROM orphans WHERE cancelled_at IS NOT NULL) AS s
    WHERE :retain::boolean
),
requeued AS (
    INSERT INTO job (id, job_type, arguments, ripe_at, priority, attempts, max_retries, last_error, created_at, queue, concurrency_key, awaited, unique_mode, unique_key)
    SELECT s.id, s.job_type, s.arguments, least(s.ripe_at, :now::timestamptz), s.priority, s.attempts, s.max_retries,
           s.last_error, s.created_at, s.queue, s.concurrency_key, s.awaited, s.unique_mode,
           s.unique_key
    FROM live AS s
    ON CONFLICT (md5) DO NOTHING
    RETURNING id
), hastened AS (
    UPDATE job SET ripe_at = least(job.ripe_at, least(s.ripe_at, :now::timestamptz))
    FROM live AS s
    WHERE s.unique_mode = 'queued' AND job.md5 = md5(s.job_type || coalesce('#' || s.unique_key, s.arguments::text))
      AND s.id NOT IN (SELECT id FROM requeued)
    RETURNING job.id, s.id AS merged_id
), merged AS (
    INSERT INTO job_dead (id, job_type, arguments, priority, attempts, max_retries, last_error, created_at, died_at, queue, concurrency_key)
    SELECT s.id, s.job_type, s.arguments, s.priority, s.attempts, s.max_retries,
           coalesce('merged into queued duplicate job ' || h.id, 'merged into a queued duplicate'),
           s.created_at, :now::timestamptz, s.queue, s.concurrency_key
    FROM live AS s LEFT JOIN hastened AS h ON h.merged_id = s.id
    WHERE s.id NOT IN (SELECT id FROM requeued)
), ended AS (
    SELECT id, awaited FROM orphans WHERE cancelled_at IS NOT NULL
)
SELECT count(*) FROM orphans WHERE (SELECT count(pg_notify('jobq_done', id::text)) FROM ended WHERE awaited) >= 0;
