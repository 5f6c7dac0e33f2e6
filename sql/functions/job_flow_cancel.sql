-- Jobs p_ids cancelled one by one (jobq.queue.control.cancel), at p_now: those that wait leave
-- job_waiting and end `cancelled` in job_done (their waiters told); those of workflows and
-- sequences that the caller's transaction cancelled from the queue, and the waiting ones, are
-- told to their dependents (job_flow_finish). Returns the jobs that waited, for the metrics.
-- Other jobs (no job_flow row) cost a probe of an index each.
CREATE OR REPLACE FUNCTION job_flow_cancel(p_ids bigint[], p_now timestamptz)
RETURNS TABLE (id bigint, queue text, job_type text) LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    ended bigint[];
BEGIN
    RETURN QUERY
    WITH gone AS (
        DELETE FROM job_waiting AS w WHERE w.job_id = ANY(p_ids) RETURNING w.job_id, w.awaited
    ), cancelled AS (
        INSERT INTO job_done (id, job_type, queue, arguments, state, attempts, last_error, result,
                              created_at, finished_at)
        SELECT f.job_id, f.job_type, f.queue, f.arguments, 'cancelled', 0, NULL, NULL,
               f.created_at, p_now
        FROM gone AS g JOIN job_flow AS f USING (job_id)
        RETURNING job_done.id, job_done.queue, job_done.job_type
    )
    SELECT c.id, c.queue, c.job_type FROM cancelled AS c
    WHERE (SELECT count(pg_notify('jobq_done', g.job_id::text)) FROM gone AS g WHERE g.awaited)
          >= 0;

    -- the cancelled ones: no longer waiting, queued or running
    ended := ARRAY(
        SELECT f.job_id FROM job_flow AS f
        WHERE f.job_id = ANY(p_ids) AND f.outcome IS NULL
          AND NOT EXISTS (SELECT FROM job_waiting AS w WHERE w.job_id = f.job_id)
          AND NOT job_is_active(f.job_id));
    IF cardinality(ended) > 0 THEN
        UPDATE job_flow AS f SET outcome = 'cancelled'
        FROM (SELECT * FROM unnest(ended) AS u(id) ORDER BY id) AS e
        WHERE f.job_id = e.id AND f.outcome IS NULL;
        PERFORM job_flow_finish(
            ended, array_fill('cancelled'::text, ARRAY[cardinality(ended)]), p_now);
    END IF;
END $$;
