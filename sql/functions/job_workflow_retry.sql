-- Run again, at p_now, every job of workflow p_id that failed or was cancelled (its steps that
-- succeeded stay as they are): each is made again with its id, from its job_flow row, with a
-- full retry budget; into job_waiting while a job it waits for has not ended, else into `job`.
-- Their dead-letter and job_done rows go; the workflow is no longer cancelled. Jobs still
-- waiting for a job made again count it again. Returns the jobs made again (none: nothing to
-- retry); raises 'jobq:cancelling' while a job of it that was cancelled still runs (its end is
-- to come: retry after it).
--
-- Every job made again waits only for jobs whose job_flow rows this transaction locked (FOR
-- NO KEY UPDATE, in id order, with the jobs made again): an end of one of them recorded after
-- this commits sees its new dependents (job_flow_finish, 2); one recorded before is seen here.
-- The waiting rows counted again are locked too, and counted from the outcomes as they are.
CREATE OR REPLACE FUNCTION job_workflow_retry(p_id bigint, p_now timestamptz)
RETURNS TABLE (id bigint, queue text, job_type text, waiting boolean)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    candidates bigint[];
    again      bigint[];
BEGIN
    IF EXISTS (SELECT FROM job_running AS r JOIN job_flow AS f ON f.job_id = r.id
               WHERE f.workflow_id = p_id AND r.cancelled_at IS NOT NULL) THEN
        RAISE EXCEPTION 'jobq:cancelling: workflow % has cancelled jobs still running', p_id;
    END IF;
    candidates := ARRAY(SELECT f.job_id FROM job_flow AS f
                        WHERE f.workflow_id = p_id AND f.outcome IN ('failed', 'cancelled'));
    IF cardinality(candidates) = 0 THEN
        RETURN;
    END IF;
    PERFORM FROM job_flow AS f
    WHERE f.job_id = ANY(candidates)
       OR f.job_id IN (SELECT d.depends_on FROM job_dependency AS d
                       WHERE d.job_id = ANY(candidates))
    ORDER BY f.job_id FOR NO KEY UPDATE;
    again := ARRAY(SELECT f.job_id FROM job_flow AS f
                   WHERE f.job_id = ANY(candidates) AND f.outcome IN ('failed', 'cancelled'));

    UPDATE job_workflow AS w SET cancelled_at = NULL, finished_at = NULL WHERE w.id = p_id;
    DELETE FROM job_dead AS d WHERE d.id = ANY(again);
    DELETE FROM job_done AS d WHERE d.id = ANY(again);
    UPDATE job_flow AS f SET outcome = NULL WHERE f.job_id = ANY(again);

    INSERT INTO job_waiting (job_id, remaining)
    SELECT d.job_id, count(*)
    FROM job_dependency AS d JOIN job_flow AS f ON f.job_id = d.depends_on
    WHERE d.job_id = ANY(again) AND f.outcome IS NULL
    GROUP BY d.job_id;

    -- the jobs that wait for one made again (a callback that runs anyway, say) count it again
    PERFORM FROM job_waiting AS w
    WHERE w.job_id IN (SELECT d.job_id FROM job_dependency AS d WHERE d.depends_on = ANY(again))
      AND NOT (w.job_id = ANY(again))
    ORDER BY w.job_id FOR NO KEY UPDATE;
    UPDATE job_waiting AS w
    SET remaining = (SELECT count(*) FROM job_dependency AS d
                     JOIN job_flow AS f ON f.job_id = d.depends_on
                     WHERE d.job_id = w.job_id AND f.outcome IS NULL)
    WHERE w.job_id IN (SELECT d.job_id FROM job_dependency AS d WHERE d.depends_on = ANY(again))
      AND NOT (w.job_id = ANY(again));

    RETURN QUERY
    WITH queued AS (
        INSERT INTO job (id, job_type, arguments, ripe_at, priority, max_retries, created_at,
                         queue, concurrency_key, unique_mode)
        SELECT f.job_id, f.job_type, f.arguments, greatest(f.ripe_at, p_now), f.priority,
               f.max_retries, f.created_at, f.queue, f.concurrency_key, 'flow'
        FROM job_flow AS f
        WHERE f.job_id = ANY(again)
          AND NOT EXISTS (SELECT FROM job_waiting AS w WHERE w.job_id = f.job_id)
        RETURNING job.id, job.queue, job.job_type
    )
    SELECT q.id, q.queue, q.job_type, false FROM queued AS q
    UNION ALL
    SELECT f.job_id, f.queue, f.job_type, true
    FROM job_waiting AS w JOIN job_flow AS f USING (job_id)
    WHERE w.job_id = ANY(again);
END $$;
