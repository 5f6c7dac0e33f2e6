-- name: job_dead_count
-- Jobs in the dead letter, counted up to :max_count + 1 (a bigger dead letter shows "more than").
SELECT count(*) FROM (SELECT FROM job_dead LIMIT :max_count::bigint + 1) AS d;

-- name: job_history_take
-- Copy, per queue, the cumulative counts (job_counter) and the histograms' buckets under :bounds
-- (job_histogram, summed over the job types; :num_buckets of them, zeros when none) as they stand,
-- under minute :at; a second take of the same minute changes nothing. Returns the rows written.
WITH counts AS (
    SELECT queue,
           sum(count) FILTER (WHERE event = 'enqueued') AS enqueued,
           sum(count) FILTER (WHERE event = 'succeeded') AS succeeded,
           sum(count) FILTER (WHERE event = 'failed') AS failed
    FROM job_counter GROUP BY queue
), buckets AS (
    SELECT h.queue, h.metric, b.i, sum(b.n)::bigint AS n
    FROM job_histogram AS h CROSS JOIN LATERAL unnest(h.buckets) WITH ORDINALITY AS b(n, i)
    WHERE h.bounds = :bounds::float8[]
    GROUP BY h.queue, h.metric, b.i
), histograms AS (
    SELECT queue,
           array_agg(n ORDER BY i) FILTER (WHERE metric = 'pickup_lag') AS pickup_buckets,
           array_agg(n ORDER BY i) FILTER (WHERE metric = 'run_time') AS run_buckets
    FROM buckets GROUP BY queue
), written AS (
    INSERT INTO job_history (queue, at, enqueued, succeeded, failed, pickup_buckets, run_buckets)
    SELECT c.queue, :at, coalesce(c.enqueued, 0), coalesce(c.succeeded, 0), coalesce(c.failed, 0),
           coalesce(h.pickup_buckets, array_fill(0::bigint, ARRAY[:num_buckets::int])),
           coalesce(h.run_buckets, array_fill(0::bigint, ARRAY[:num_buckets::int]))
    FROM counts AS c LEFT JOIN histograms AS h USING (queue)
    ON CONFLICT (queue, at) DO NOTHING
    RETURNING 1
)
SELECT count(*) FROM written;

-- name: job_history_prune!
-- Forget the history before :cutoff (a bounded table: the dashboard shows a day at most).
DELETE FROM job_history WHERE at < :cutoff;

-- name: job_history_read
-- Every queue's history rows from :since on whose minute is a multiple of :step_min (the steps of
-- a chart), by queue and time.
SELECT queue, at, enqueued, succeeded, failed, pickup_buckets, run_buckets
FROM job_history
WHERE at >= :since AND (extract(epoch FROM at)::bigint / 60) % :step_min::int = 0
ORDER BY queue, at;

-- name: job_held_reasons
-- Why each of the jobs :job_ids that are queued and ripe at :now waits, when something holds it
-- back: 'paused' (its queue), 'limit' (its queue's max_running reached), 'key limit' (its key's
-- max_running_per_key reached) or 'rate' (a rate window of its queue is full until `until`). No
-- row for a job that waits only for a free worker, nor for one that is not queued and ripe.
SELECT id, reason, until FROM (
    SELECT j.id,
           CASE WHEN q.paused THEN 'paused'
                WHEN q.max_running <= (SELECT count(*) FROM job_running AS r
                                       WHERE r.queue = j.queue) THEN 'limit'
                WHEN q.max_running_per_key <= (SELECT count(*) FROM job_running AS r
                                               WHERE r.queue = j.queue
                                                 AND r.concurrency_key = j.concurrency_key)
                     THEN 'key limit'
                WHEN q.rate_max_starts IS NOT NULL OR q.key_rate_max_starts IS NOT NULL
                     THEN CASE WHEN job_rate_opens_at(ARRAY[j.queue], :now) > :now THEN 'rate' END
           END AS reason,
           CASE WHEN q.rate_max_starts IS NOT NULL OR q.key_rate_max_starts IS NOT NULL
                THEN job_rate_opens_at(ARRAY[j.queue], :now) END AS until
    FROM job AS j JOIN job_queue AS q ON q.name = j.queue
    WHERE j.id = ANY(:job_ids::bigint[]) AND j.ripe_at <= :now
) AS h
WHERE reason IS NOT NULL;

-- name: job_queue_holds
-- Per queue, what holds its ripe jobs back at :now: `paused`, `held` (those its concurrency limits
-- hold, as the last depth snapshot counted them; NULL: none yet) and `rate_until` (a full rate
-- window opens then; NULL: none is full).
SELECT q.name AS queue, q.paused, d.held,
       CASE WHEN q.rate_max_starts IS NOT NULL OR q.key_rate_max_starts IS NOT NULL
            THEN job_rate_opens_at(ARRAY[q.name], :now) END AS rate_until
FROM job_queue AS q LEFT JOIN job_depth AS d ON d.queue = q.name;

-- name: job_dead_matching
-- Up to :limit dead jobs below id :after (NULL: from the newest), newest first, of queue :queue,
-- type :job_type, whose last error contains :error and whose arguments contain :arguments (each
-- NULL: any): the ids a bulk retry or discard of a filter works through, a batch at a time.
SELECT id FROM job_dead
WHERE id < coalesce(:after::bigint, 9223372036854775807)
  AND (:queue::text IS NULL OR queue = :queue)
  AND (:job_type::text IS NULL OR job_type = :job_type)
  AND (:error::text IS NULL OR strpos(last_error, :error) > 0)
  AND (:arguments::jsonb IS NULL OR arguments @> :arguments)
ORDER BY id DESC
LIMIT :limit;

