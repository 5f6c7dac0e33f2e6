-- job_rate_opens_at (sql/013_limits_cheaper.sql), the moment a full rate window of a queue
-- lets one more job start, in PL/pgSQL: the same query, with its plan kept for the session.
-- As a SQL function it was planned at each call (a SQL function that is not inlined keeps its
-- plan for one call only), and a claim calls it whenever a queue with a rate has ripe jobs
-- that the claim left (a rate holds them back), for the worker's timer. `python -m bench
-- rate_held_claim --runs 3` (a queue whose rate of one start a minute holds back 999 ripe jobs;
-- the embedded PostgreSQL 16, 2026-11-26, alternated twice): a claim's p50 1.05-1.36 ms
-- before, 0.33-0.63 after. Held back by a per-key rate over 50 keys (a throwaway probe), about
-- the same both ways (2.1-3.4 ms): that one walks the keys. Its settings are the claim's
-- (jobq.queue.worker.CLAIM_SESSION), whatever the calling session's: a generic plan made while
-- job_rate is small must still probe its indexes.
CREATE OR REPLACE FUNCTION job_rate_opens_at(p_queues text[], p_now timestamptz)
RETURNS timestamptz LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET jit = off
AS $$
BEGIN
    RETURN (
        WITH RECURSIVE windows AS (
            SELECT jq.name AS queue, (SELECT r.concurrency_key FROM job_rate AS r
                                      WHERE r.queue = jq.name
                                      ORDER BY r.concurrency_key LIMIT 1) AS key
            FROM job_queue AS jq
            WHERE jq.name = ANY(p_queues)
              AND (jq.rate_max_starts IS NOT NULL OR jq.key_rate_max_starts IS NOT NULL)
            UNION ALL
            SELECT w.queue, (SELECT r.concurrency_key FROM job_rate AS r
                             WHERE r.queue = w.queue AND r.concurrency_key > w.key
                             ORDER BY r.concurrency_key LIMIT 1)
            FROM windows AS w WHERE w.key IS NOT NULL
        ), starts AS (
            SELECT w.queue, w.key, r.n, r.at
            FROM windows AS w JOIN job_queue AS jq ON jq.name = w.queue
            CROSS JOIN LATERAL (
                SELECT r.n, r.at FROM job_rate AS r
                WHERE r.queue = w.queue AND r.concurrency_key = w.key
                  AND r.at > p_now - CASE WHEN w.key = '' THEN jq.rate_period
                                          ELSE jq.key_rate_period END
            ) AS r
            WHERE w.key IS NOT NULL
            UNION ALL
            SELECT jq.name, f.key, 1, r.at
            FROM job_queue AS jq
            JOIN job_rate AS r
              ON r.queue = jq.name AND r.keys IS NOT NULL AND r.at > p_now - jq.key_rate_period
            CROSS JOIN LATERAL unnest(r.keys) AS f(key)
            WHERE jq.name = ANY(p_queues)
        )
        SELECT min(s.first_at + CASE WHEN s.key = '' THEN jq.rate_period ELSE jq.key_rate_period END)
        FROM (SELECT s.queue, s.key, sum(s.n) AS n, min(s.at) AS first_at
              FROM starts AS s GROUP BY s.queue, s.key) AS s
        JOIN job_queue AS jq ON jq.name = s.queue
        WHERE s.n >= CASE WHEN s.key = '' THEN jq.rate_max_starts ELSE jq.key_rate_max_starts END
    );
END $$;
