-- name: check_places
-- :max_sample: ids returned at most. Jobs in more than one of job, job_running, job_dead,
-- job_waiting.
WITH twice AS (
    SELECT id FROM job JOIN job_running USING (id)
    UNION SELECT id FROM job JOIN job_dead USING (id)
    UNION SELECT id FROM job_running JOIN job_dead USING (id)
    UNION SELECT job_id FROM job_waiting AS w
          WHERE EXISTS (SELECT FROM job WHERE job.id = w.job_id)
             OR EXISTS (SELECT FROM job_running AS r WHERE r.id = w.job_id)
             OR EXISTS (SELECT FROM job_dead AS d WHERE d.id = w.job_id)
)
SELECT count(*) AS violations,
       coalesce((array_agg(id ORDER BY id))[1:(:max_sample)], '{}') AS sample
FROM twice;

-- name: check_running
-- Running jobs that no live worker holds and that the rescue should have returned more than
-- `rescue grace` ago: their lease expired, or their worker is dead (as the rescue judges it,
-- job_workers_alive) and its last sign of life (heartbeat, or the claim when its row is gone) is that old.
WITH alive AS (
    SELECT worker_id FROM job_workers_alive(:now, :heartbeat_grace)
), overdue AS (
    SELECT r.id FROM job_running AS r LEFT JOIN worker AS w ON w.id = r.worker_id
    WHERE r.lease_expires_at < :now::timestamptz - :rescue_grace::interval
       OR (r.worker_id NOT IN (SELECT worker_id FROM alive)
           AND coalesce(w.heartbeat_at, r.claimed_at)
               < :now::timestamptz - :rescue_grace::interval)
)
SELECT count(*) AS violations,
       coalesce((array_agg(id ORDER BY id))[1:(:max_sample)], '{}') AS sample
FROM overdue;

-- name: check_attempts
-- Queued or running jobs past their last attempt (they belong in job_dead): the queued ones
-- through the partial index job_over_attempts_idx, empty while the invariant holds.
WITH over AS (
    SELECT id FROM job WHERE attempts > max_retries
    UNION ALL SELECT id FROM job_running WHERE attempts > max_retries
)
SELECT count(*) AS violations,
       coalesce((array_agg(id ORDER BY id))[1:(:max_sample)], '{}') AS sample
FROM over;

-- name: check_limits
-- Running jobs of a queue or a key that has more running than its concurrency limit allows (the
-- claim never lets that happen; lowering a limit does, until the jobs over it end).
WITH counted AS (
    SELECT r.id, q.max_running, q.max_running_per_key, r.concurrency_key,
           count(*) OVER (PARTITION BY r.queue) AS in_queue,
           count(*) OVER (PARTITION BY r.queue, r.concurrency_key) AS in_key
    FROM job_running AS r JOIN job_queue AS q ON q.name = r.queue
    WHERE q.max_running IS NOT NULL OR q.max_running_per_key IS NOT NULL
), over AS (
    SELECT id FROM counted
    WHERE in_queue > max_running
       OR (concurrency_key IS NOT NULL AND in_key > max_running_per_key)
)
SELECT count(*) AS violations,
       coalesce((array_agg(id ORDER BY id))[1:(:max_sample)], '{}') AS sample
FROM over;

-- name: check_counts
-- Jobs per state, and workers alive or not (as the rescue judges); the queued ones as the last
-- depth snapshot counted them when :counted (each subquery runs only if its branch is taken).
WITH alive AS (
    SELECT worker_id FROM job_workers_alive(:now, :heartbeat_grace)
)
SELECT CASE WHEN :counted::boolean THEN (SELECT coalesce(sum(ripe), 0) FROM job_type_depth)
            ELSE (SELECT count(*) FROM job WHERE ripe_at <= :now) END AS queued_ripe,
       CASE WHEN :counted::boolean THEN (SELECT coalesce(sum(scheduled), 0) FROM job_type_depth)
            ELSE (SELECT count(*) FROM job WHERE ripe_at > :now) END AS queued_scheduled,
       (SELECT count(*) FROM job_running) AS running,
       (SELECT count(*) FROM job_running WHERE lease_expires_at < :now) AS running_lease_expired,
       (SELECT count(*) FROM job_dead) AS dead,
       (SELECT count(*) FROM worker WHERE id IN (SELECT worker_id FROM alive)) AS workers_alive,
       (SELECT count(*) FROM worker WHERE id NOT IN (SELECT worker_id FROM alive)) AS workers_dead;
