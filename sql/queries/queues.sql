-- name: job_queue_declare
-- Arrays, one item per queue (NULL: no such limit). A queue's limits as its code declares them;
-- its paused state is left as it is. Names sorted: concurrent starts never deadlock.
INSERT INTO job_queue AS q (name, max_running, max_running_per_key, rate_max_starts, rate_period,
                            key_rate_max_starts, key_rate_period)
SELECT * FROM unnest(:names::text[], :max_running::int[], :max_running_per_key::int[],
                     :rate_max_starts::int[], :rate_periods::interval[],
                     :key_rate_max_starts::int[], :key_rate_periods::interval[]) AS u
ORDER BY 1
ON CONFLICT (name) DO UPDATE
SET max_running = EXCLUDED.max_running, max_running_per_key = EXCLUDED.max_running_per_key,
    rate_max_starts = EXCLUDED.rate_max_starts, rate_period = EXCLUDED.rate_period,
    key_rate_max_starts = EXCLUDED.key_rate_max_starts, key_rate_period = EXCLUDED.key_rate_period
WHERE (q.max_running, q.max_running_per_key, q.rate_max_starts, q.rate_period,
       q.key_rate_max_starts, q.key_rate_period)
      IS DISTINCT FROM (EXCLUDED.max_running, EXCLUDED.max_running_per_key,
                        EXCLUDED.rate_max_starts, EXCLUDED.rate_period,
                        EXCLUDED.key_rate_max_starts, EXCLUDED.key_rate_period);

-- name: job_queue_pause
-- Returns the name, or no row for an unknown queue.
UPDATE job_queue SET paused = :paused WHERE name = :name RETURNING name;

-- name: job_queue_list
-- Every queue with its state, limits and jobs (ripe, scheduled, running). Each queued count stops
-- at :max_count (NULL: none), so that a page over millions of jobs stays cheap; each is read one
-- priority at a time (job_priorities), a range of job_claim_idx each.
SELECT q.name, q.paused, q.max_running, q.max_running_per_key, q.rate_max_starts, q.rate_period,
       q.key_rate_max_starts, q.key_rate_period,
       (SELECT count(*) FROM (
            SELECT FROM job_priorities(q.name) AS p CROSS JOIN LATERAL (
                SELECT FROM job WHERE job.queue = q.name AND job.priority = p.priority
                                  AND ripe_at <= :now
                LIMIT :max_count::bigint) AS j
            LIMIT :max_count::bigint) AS j) AS ripe,
       (SELECT count(*) FROM (
            SELECT FROM job_priorities(q.name) AS p CROSS JOIN LATERAL (
                SELECT FROM job WHERE job.queue = q.name AND job.priority = p.priority
                                  AND ripe_at > :now
                LIMIT :max_count::bigint) AS j
            LIMIT :max_count::bigint) AS j) AS scheduled,
       (SELECT count(*) FROM job_running AS r WHERE r.queue = q.name) AS running
FROM job_queue AS q
ORDER BY q.name;

-- name: job_rate_prune!
-- Forget the starts older than their window's period, and a minute more: a claim that read its
-- clock up to a minute before this one's still finds the starts it counts. A queue's '' rows (all
-- its starts) bound its keys' starts too (job_claim_turns): they stay for the longer period.
DELETE FROM job_rate AS r USING job_queue AS jq
WHERE jq.name = r.queue
  AND r.at <= :now::timestamptz - interval '1 minute' - coalesce(CASE
      WHEN r.concurrency_key = '' THEN greatest(jq.rate_period, jq.key_rate_period)
      ELSE jq.key_rate_period END, interval '0');
