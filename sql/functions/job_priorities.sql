-- The priorities of queue p_queue's queued jobs, highest first, each with the earliest ripe_at
-- of its jobs: a skip scan of job_claim_idx, one index probe per priority and one more that
-- finds no lower one. Every read of a queue's jobs by time goes through it, one priority at a
-- time: the claims' scans of each priority's ripe jobs, the next ripe_at, the oldest ripe job and
-- the queue's counts. `job` has no index by (queue, ripe_at), so no plan can serve those scans by
-- stepping over the jobs of other priorities.
--
-- Rows come in the order of the walk (highest priority first): a recursive query returns its
-- rows in the order it finds them, and each step finds the next lower priority. A caller that
-- takes the line's first jobs relies on that order: its LATERAL scan of each priority's jobs
-- runs as a nested loop (the scan refers to the outer row), which keeps the outer rows' order.
-- LANGUAGE sql, STABLE, one SELECT: the planner inlines it into the calling statement.
CREATE OR REPLACE FUNCTION job_priorities(p_queue text)
RETURNS TABLE (priority smallint, ripe_at timestamptz) LANGUAGE sql STABLE AS $$
    WITH RECURSIVE priorities AS (
        (SELECT j.priority, j.ripe_at FROM job AS j WHERE j.queue = p_queue
         ORDER BY j.priority DESC, j.ripe_at LIMIT 1)
        UNION ALL
        SELECT n.priority, n.ripe_at FROM priorities AS p CROSS JOIN LATERAL (
            SELECT j.priority, j.ripe_at FROM job AS j
            WHERE j.queue = p_queue AND j.priority < p.priority
            ORDER BY j.priority DESC, j.ripe_at LIMIT 1) AS n
    )
    SELECT priority, ripe_at FROM priorities
$$;
