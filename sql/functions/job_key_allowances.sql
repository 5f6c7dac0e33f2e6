-- How many more jobs of each key of p_keys queue `q` may start at p_at (NULL: no limit): within
-- its running limit per key when p_running, and within its rate per key when p_rated. A limit
-- left out is one that no key can reach in this claim (job_claim_turns).
CREATE OR REPLACE FUNCTION job_key_allowances(
    q job_queue, p_keys text[], p_at timestamptz, p_running boolean, p_rated boolean
)
RETURNS TABLE (key text, n bigint) LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT k.key, least(
        CASE WHEN p_running THEN q.max_running_per_key - coalesce(h.n, 0) END,
        CASE WHEN p_rated THEN q.key_rate_max_starts - coalesce(w.n, 0) END)
    FROM unnest(p_keys) AS k(key)
    LEFT JOIN (
        SELECT r.concurrency_key, count(*) AS n FROM job_running AS r
        WHERE p_running AND r.queue = q.name AND r.concurrency_key = ANY(p_keys) GROUP BY 1
    ) AS h ON h.concurrency_key = k.key
    LEFT JOIN (
        SELECT s.key, s.n FROM job_rate_key_starts(q.name, p_keys, p_at - q.key_rate_period) AS s
        WHERE p_rated
    ) AS w ON w.key = k.key;
END $$;
