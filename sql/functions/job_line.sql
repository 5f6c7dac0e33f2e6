-- The first p_limit ripe jobs of queue p_queue's line (priority, then ripe_at), read one
-- priority at a time, highest first (job_priorities), each from the first job its probe saw, past
-- the index entries of jobs already gone. Read as one range, `ripe_at <= p_now` would step over
-- every job scheduled later whenever fewer are ripe than p_limit (ten million reminders due next
-- year: seconds per idle claim). The same walk as the claim of a queue without limits. No row
-- is locked: job_claim_turns, whose settings it runs under, locks the ones it takes (its claims
-- of a queue take turns, so none is lost to another's lock).
CREATE OR REPLACE FUNCTION job_line(p_queue text, p_now timestamptz, p_limit integer)
RETURNS TABLE (id bigint, concurrency_key text, priority smallint, ripe_at timestamptz)
LANGUAGE plpgsql STABLE
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT r.id, r.concurrency_key, r.priority, r.ripe_at FROM job_priorities(p_queue) AS p
    CROSS JOIN LATERAL (
        SELECT j.id, j.concurrency_key, j.priority, j.ripe_at FROM job AS j
        WHERE j.queue = p_queue AND j.priority = p.priority
          AND j.ripe_at >= p.ripe_at AND j.ripe_at <= p_now
        ORDER BY j.ripe_at LIMIT p_limit
    ) AS r
    LIMIT p_limit;
END $$;
