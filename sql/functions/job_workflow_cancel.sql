-- Cancel workflow p_id at p_now: every job of it that has not ended ends `cancelled`. Running
-- ones are marked and their workers told (NOTIFY jobq_cancel), as jobq.queue.control.cancel
-- does: whatever outcome they record then, they end cancelled, and never run again. Waiting and
-- queued ones go to job_done at once (their waiters told). Returns each job cancelled with
-- where it was ('running', 'waiting' or 'queued'); no row for a workflow that does not exist
-- or has no job left to cancel (its `cancelled_at` is set either way).
--
-- The statements follow the jobs' moves (each reads the database as of its own start): the
-- running jobs are marked first, so that none of them ends afterwards and moves a dependent
-- into the queue once the waiting ones are cancelled; then the waiting ones; then the queued
-- ones (with those that ends before this moved there); then the running ones again (those
-- claimed from the queue meanwhile). The jobs of other workflows or sequences that wait for
-- the cancelled ones are then told (job_flow_finish).
CREATE OR REPLACE FUNCTION job_workflow_cancel(p_id bigint, p_now timestamptz)
RETURNS TABLE (id bigint, queue text, job_type text, was text) LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    ended bigint[];
BEGIN
    UPDATE job_workflow AS w SET cancelled_at = coalesce(w.cancelled_at, p_now)
    WHERE w.id = p_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    FOR pass IN 1..2 LOOP
        RETURN QUERY
        WITH marked AS (
            UPDATE job_running AS r SET cancelled_at = p_now
            FROM job_flow AS f
            WHERE f.workflow_id = p_id AND r.id = f.job_id AND r.cancelled_at IS NULL
            RETURNING r.id, r.queue, r.job_type
        )
        SELECT m.id, m.queue, m.job_type, 'running'::text FROM marked AS m
        WHERE (SELECT count(pg_notify('jobq_cancel', m2.id::text)) FROM marked AS m2) >= 0;
        EXIT WHEN pass = 2;

        RETURN QUERY
        WITH gone AS (
            DELETE FROM job_waiting AS w USING job_flow AS f
            WHERE f.workflow_id = p_id AND w.job_id = f.job_id
            RETURNING w.job_id, w.awaited
        ), cancelled AS (
            INSERT INTO job_done (id, job_type, queue, arguments, state, attempts, last_error,
                                  result, created_at, finished_at)
            SELECT f.job_id, f.job_type, f.queue, f.arguments, 'cancelled', 0, NULL, NULL,
                   f.created_at, p_now
            FROM gone AS g JOIN job_flow AS f USING (job_id)
            RETURNING job_done.id, job_done.queue, job_done.job_type
        )
        SELECT c.id, c.queue, c.job_type, 'waiting'::text FROM cancelled AS c
        WHERE (SELECT count(pg_notify('jobq_done', g.job_id::text)) FROM gone AS g
               WHERE g.awaited) >= 0;

        RETURN QUERY
        WITH gone AS (
            DELETE FROM job AS j USING job_flow AS f
            WHERE f.workflow_id = p_id AND j.id = f.job_id
            RETURNING j.id, j.job_type, j.queue, j.arguments, j.attempts, j.last_error,
                      j.created_at, j.awaited
        ), cancelled AS (
            INSERT INTO job_done (id, job_type, queue, arguments, state, attempts, last_error,
                                  result, created_at, finished_at)
            SELECT g.id, g.job_type, g.queue, g.arguments, 'cancelled', g.attempts, g.last_error,
                   NULL, g.created_at, p_now
            FROM gone AS g
            RETURNING job_done.id, job_done.queue, job_done.job_type
        )
        SELECT c.id, c.queue, c.job_type, 'queued'::text FROM cancelled AS c
        WHERE (SELECT count(pg_notify('jobq_done', g.id::text)) FROM gone AS g
               WHERE g.awaited) >= 0;
    END LOOP;

    ended := ARRAY(
        SELECT f.job_id FROM job_flow AS f
        WHERE f.workflow_id = p_id AND f.outcome IS NULL
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
