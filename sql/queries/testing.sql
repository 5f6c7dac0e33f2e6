-- name: job_queued
-- The queued jobs (waiting to run, or for their retry), of type :job_type (NULL: all), earliest
-- ripe_at first (`jobq.testing.enqueued`).
SELECT id, job_type, arguments, queue, priority, ripe_at, attempts, max_retries, last_error,
       concurrency_key, created_at
FROM job
WHERE :job_type::text IS NULL OR job_type = :job_type
ORDER BY ripe_at, id;

-- name: job_ripe_counts
-- How many jobs of each type are ripe at :now (what `jobq.testing` reports when the queue does not
-- settle).
SELECT job_type, count(*) AS n FROM job WHERE ripe_at <= :now GROUP BY job_type ORDER BY job_type;
