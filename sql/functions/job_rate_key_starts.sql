-- The starts after p_since of each key of p_keys of queue p_queue: its own rows and its
-- elements in the folded rows (both are at most the key rate within a key period).
CREATE OR REPLACE FUNCTION job_rate_key_starts(p_queue text, p_keys text[], p_since timestamptz)
RETURNS TABLE (key text, n bigint) LANGUAGE sql STABLE AS $$
    SELECT s.key, sum(s.n)::bigint FROM (
        SELECT r.concurrency_key AS key, r.n FROM unnest(p_keys) AS k(key)
        JOIN job_rate AS r
          ON r.queue = p_queue AND r.concurrency_key = k.key AND r.at > p_since
        UNION ALL
        SELECT f.key, 1 FROM job_rate AS r CROSS JOIN LATERAL unnest(r.keys) AS f(key)
        WHERE r.queue = p_queue AND r.keys IS NOT NULL AND r.at > p_since
          AND f.key = ANY(p_keys)
    ) AS s
    GROUP BY s.key
$$;
