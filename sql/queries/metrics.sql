-- name: job_counter_add
-- Add to the cumulative counts: arrays, one item per (queue, job type, event), sorted by it (two
-- processes adding to the same rows lock them in the same order: no deadlock).
INSERT INTO job_counter AS c (queue, job_type, event, count)
SELECT * FROM unnest(:queues::text[], :job_types::text[], :events::text[], :counts::bigint[])
ORDER BY 1, 2, 3
ON CONFLICT (queue, job_type, event) DO UPDATE SET count = c.count + EXCLUDED.count;

-- name: job_histogram_add
-- Add one histogram's observations (:buckets, not cumulative, under :bounds) and their :sum; a row
-- of other bounds starts afresh (a counter reset, which Prometheus' rate() handles).
INSERT INTO job_histogram AS h (queue, job_type, metric, bounds, buckets, sum)
VALUES (:queue, :job_type, :metric, :bounds::float8[], :buckets::bigint[], :sum)
ON CONFLICT (queue, job_type, metric) DO UPDATE
SET buckets = CASE WHEN h.bounds = EXCLUDED.bounds
                   THEN ARRAY(SELECT a + b FROM unnest(h.buckets, EXCLUDED.buckets)
                                  WITH ORDINALITY AS u(a, b, i) ORDER BY i)
                   ELSE EXCLUDED.buckets END,
    sum = CASE WHEN h.bounds = EXCLUDED.bounds THEN h.sum + EXCLUDED.sum ELSE EXCLUDED.sum END,
    bounds = EXCLUDED.bounds;

-- name: job_depth_lock
-- The first step of the depth snapshot's election: whether this transaction takes the metrics
-- lock (held until it ends). Another transaction holding it is taking a snapshot.
SELECT pg_try_advisory_xact_lock(1785684593, -12);

-- name: job_depth_stale
-- The second step, a statement of its own once the metrics lock is held: whether the last
-- snapshot is older than :fresh_for before :now and than 20 times the time it took (a count that
-- takes long, over a big queue, costs at most 5% of a core). A statement reads the rows committed
-- when it begins (READ COMMITTED), and a transaction's commit is visible before its lock is
-- released: so this one sees every snapshot taken under the lock before this transaction held
-- it. The lock's own statement may have begun earlier, before the last snapshot committed.
SELECT NOT EXISTS (
    SELECT FROM job_depth
    WHERE taken_at > :now::timestamptz - greatest(:fresh_for::interval, took_s * interval '20 s'));

-- name: job_depth_took!
-- The time the snapshot taken at :now took.
UPDATE job_depth SET took_s = :took_s WHERE taken_at = :now;

-- name: job_depth_take
-- Count, per queue, its ripe and scheduled jobs at :now and the ripe ones its concurrency limits
-- hold back (the queue's max_running reached, or their key's max_running_per_key), into job_depth,
-- and per queue and job type its ripe and scheduled jobs into job_type_depth. One pass over `job`:
-- a second or so per million jobs, every few seconds, in one process.
WITH running_queue AS (
    SELECT queue, count(*) AS n FROM job_running GROUP BY queue
), running_key AS (
    SELECT queue, concurrency_key, count(*) AS n FROM job_running
    WHERE concurrency_key IS NOT NULL GROUP BY queue, concurrency_key
), by_type AS (
    SELECT j.queue, j.job_type,
           count(*) FILTER (WHERE j.ripe_at <= :now) AS ripe,
           count(*) FILTER (WHERE j.ripe_at > :now) AS scheduled,
           count(*) FILTER (WHERE j.ripe_at <= :now
                              AND (rq.n >= q.max_running OR rk.n >= q.max_running_per_key))
               AS held
    FROM job AS j
    LEFT JOIN job_queue AS q ON q.name = j.queue
    LEFT JOIN running_queue AS rq ON rq.queue = j.queue
    LEFT JOIN running_key AS rk
        ON rk.queue = j.queue AND rk.concurrency_key = j.concurrency_key
    GROUP BY j.queue, j.job_type
), counted AS (
    SELECT queue, sum(ripe) AS ripe, sum(scheduled) AS scheduled, sum(held) AS held
    FROM by_type GROUP BY queue
), types AS (
    INSERT INTO job_type_depth AS d (queue, job_type, ripe, scheduled, taken_at)
    SELECT queue, job_type, ripe, scheduled, :now FROM by_type
    ON CONFLICT (queue, job_type) DO UPDATE
    SET ripe = EXCLUDED.ripe, scheduled = EXCLUDED.scheduled, taken_at = EXCLUDED.taken_at
), types_gone AS (
    DELETE FROM job_type_depth AS d
    WHERE NOT EXISTS (SELECT FROM by_type AS b WHERE b.queue = d.queue AND b.job_type = d.job_type)
), gone AS (
    DELETE FROM job_depth WHERE queue NOT IN (SELECT name FROM job_queue)
)
INSERT INTO job_depth AS d (queue, ripe, scheduled, held, taken_at)
SELECT q.name, coalesce(c.ripe, 0), coalesce(c.scheduled, 0), coalesce(c.held, 0), :now
FROM job_queue AS q LEFT JOIN counted AS c ON c.queue = q.name
ON CONFLICT (queue) DO UPDATE
SET ripe = EXCLUDED.ripe, scheduled = EXCLUDED.scheduled, held = EXCLUDED.held,
    taken_at = EXCLUDED.taken_at;

-- name: metrics_counters
SELECT queue, job_type, event, count FROM job_counter;

-- name: metrics_histograms
SELECT queue, job_type, metric, bounds, buckets, sum FROM job_histogram;

-- name: metrics_queues
-- Per queue: paused or not, the last depth snapshot (NULL: none yet), and the age at :now of its
-- oldest ripe job (NULL: none): the earliest first job of its priorities (job_priorities, one
-- index probe per priority).
SELECT q.name AS queue, q.paused, d.ripe, d.scheduled, d.held, d.taken_at,
       extract(epoch FROM :now::timestamptz - (
           SELECT min(p.ripe_at) FROM job_priorities(q.name) AS p WHERE p.ripe_at <= :now
       ))::float8 AS oldest_ripe_s
FROM job_queue AS q LEFT JOIN job_depth AS d ON d.queue = q.name
ORDER BY q.name;

-- name: metrics_running
-- Running jobs per queue and job type (job_running holds only the claimed jobs: small).
SELECT queue, job_type, count(*) AS running FROM job_running GROUP BY queue, job_type;

-- name: metrics_workers_alive
-- Workers alive, as the rescue judges.
WITH alive AS (
    SELECT worker_id FROM job_workers_alive(:now, :heartbeat_grace)
)
SELECT count(*) FROM worker WHERE id IN (SELECT worker_id FROM alive);

-- name: job_trace_add
-- The trace context of the span that enqueued :job_ids (the jobs of one enqueue).
INSERT INTO job_trace (job_id, traceparent, created_at)
SELECT unnest(:job_ids::bigint[]), :traceparent, :now
ON CONFLICT (job_id) DO NOTHING;

-- name: job_trace_of
SELECT job_id, traceparent FROM job_trace WHERE job_id = ANY(:job_ids::bigint[]);
