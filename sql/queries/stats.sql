-- name: job_stats
SELECT job_type,
       count(*) FILTER (WHERE state = 'queued' AND ripe_at <= :now) AS ripe,
       count(*) FILTER (WHERE state = 'queued' AND ripe_at > :now) AS scheduled,
       count(*) FILTER (WHERE state = 'running') AS running,
       count(*) FILTER (WHERE state = 'dead') AS dead
FROM (
    SELECT job_type, 'queued' AS state, ripe_at FROM job
    UNION ALL SELECT job_type, 'running', NULL FROM job_running
    UNION ALL SELECT job_type, 'dead', NULL FROM job_dead
) AS jobs
GROUP BY job_type
ORDER BY job_type;

-- name: job_count_over
-- Whether `job` holds more than :max_count jobs (reads at most :max_count + 1 rows).
SELECT count(*) > :max_count::bigint FROM (SELECT FROM job LIMIT :max_count::bigint + 1) AS j;

-- name: job_depth_taken_at
-- The time of the last depth snapshot (`job_depth_take`; NULL: none yet).
SELECT max(taken_at) FROM job_depth;

-- name: job_stats_counted
-- `job_stats` with the queued jobs as the last depth snapshot counted them (job_type_depth), and
-- the running and dead ones counted now.
SELECT job_type, sum(ripe)::bigint AS ripe, sum(scheduled)::bigint AS scheduled,
       sum(running)::bigint AS running, sum(dead)::bigint AS dead
FROM (
    SELECT job_type, ripe, scheduled, 0 AS running, 0 AS dead FROM job_type_depth
    UNION ALL SELECT job_type, 0, 0, count(*), 0 FROM job_running GROUP BY job_type
    UNION ALL SELECT job_type, 0, 0, 0, count(*) FROM job_dead GROUP BY job_type
) AS jobs
GROUP BY job_type
ORDER BY job_type;

-- name: job_stats_oldest_transaction
-- Age of the oldest transaction open in this database, other than the caller's: while it lasts,
-- vacuum can remove no row deleted after it began, so the queue tables' dead tuples pile up (a
-- claim then steps over them).
SELECT greatest(0, extract(epoch FROM :now::timestamptz - min(xact_start)))::float8
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL;

-- name: job_stats_tables
-- Live and dead tuples of the queue tables (as the statistics collector last heard), and their
-- last autovacuum.
SELECT relname AS table, n_live_tup, n_dead_tup, last_autovacuum AS last_autovacuum_at
FROM pg_stat_user_tables
WHERE relname IN ('job', 'job_running', 'job_dead') AND schemaname = current_schema()
ORDER BY relname;

-- name: job_stats_sizes
-- Each queue table, its partitions summed: on-disk size (bytes: heap, indexes and TOAST), live and
-- dead rows and last autovacuum (as the statistics last saw them), from the catalog and the
-- statistics alone (cheap whatever their size). pg_partition_tree gives a partitioned table and
-- its partitions, and no row for a plain table: the table itself is added (UNION: once).
SELECT t.name AS table,
       sum(pg_total_relation_size(p.relid))::bigint AS total_bytes,
       sum(s.n_live_tup)::bigint AS n_live_tup,
       sum(s.n_dead_tup)::bigint AS n_dead_tup,
       max(s.last_autovacuum) AS last_autovacuum_at
FROM unnest(ARRAY['job', 'job_running', 'job_dead', 'job_done', 'job_attempt']) AS t(name)
CROSS JOIN LATERAL (
    SELECT relid FROM pg_partition_tree(to_regclass(t.name))
    UNION SELECT to_regclass(t.name)
) AS p
LEFT JOIN pg_stat_user_tables AS s ON s.relid = p.relid
WHERE to_regclass(t.name) IS NOT NULL
GROUP BY t.name
ORDER BY t.name;

-- name: job_counter_sums
-- The cumulative event counters (`job_counter`, of the metrics) summed per queue and event per
-- queue and event (enqueued, started, succeeded, retried, failed, cancelled, snoozed).
SELECT queue, event, sum(count)::bigint AS count FROM job_counter GROUP BY queue, event;
