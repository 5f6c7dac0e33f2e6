-- When a full rate window of the queues p_queues next lets one more job start after p_now (NULL
-- when none is full): when the first of its starts within the period leaves it. A key's starts
-- are its own rows and its elements in the folded rows.
--
-- PL/pgSQL, so that its plan is kept for the session (a SQL function that is not inlined keeps
-- its plan for one call only): a claim calls it whenever a queue with a rate has ripe jobs that
-- the claim left (a rate holds them back), for the worker's timer. Its settings are the claim's
-- (jobq.queue.listener.CLAIM_SESSION), whatever the calling session's: a generic plan made while
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
