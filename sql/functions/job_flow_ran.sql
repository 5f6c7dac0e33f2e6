-- The trigger on job_running: after each statement that deletes rows from it (`gone`: the
-- claim's completions, job_record's outcomes, the rescue, the release of orphans), the jobs of
-- workflows and sequences among them that ended are told to the jobs that wait for them
-- (job_flow_finish), in the same transaction. Where each went tells how it ended: back to `job`
-- (a retry, a release: it has not ended), cancelled (marked while it ran), the dead letter
-- (failed), else succeeded (job_done holds it only while retention is on). The claim statement
-- itself knows nothing of this.
--
-- Its cost for other jobs: one probe of job_flow's primary key per row deleted (an empty
-- index's answer, while no workflow or sequence is in use).
CREATE OR REPLACE FUNCTION job_flow_ran() RETURNS trigger LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    ids      bigint[];
    outcomes text[];
    at       timestamptz;
BEGIN
    SELECT array_agg(g.id ORDER BY g.id), array_agg(o.outcome ORDER BY g.id)
    INTO ids, outcomes
    FROM gone AS g
    CROSS JOIN LATERAL (
        SELECT FROM job_flow AS f WHERE f.job_id = g.id AND f.outcome IS NULL) AS f
    CROSS JOIN LATERAL (SELECT CASE
        WHEN g.cancelled_at IS NOT NULL THEN 'cancelled'
        WHEN EXISTS (SELECT FROM job WHERE job.id = g.id) THEN NULL
        WHEN EXISTS (SELECT FROM job_dead AS d WHERE d.id = g.id) THEN 'failed'
        ELSE 'succeeded' END AS outcome) AS o
    WHERE o.outcome IS NOT NULL;
    IF ids IS NULL THEN
        RETURN NULL;
    END IF;
    IF 'succeeded' <> ANY(outcomes) THEN
        -- the time the statement stamped on the ends (the application's clock), for the jobs
        -- that they cancel
        at := coalesce(
            (SELECT max(died_at) FROM job_dead WHERE id = ANY(ids)),
            (SELECT max(finished_at) FROM job_done WHERE id = ANY(ids)),
            statement_timestamp());
    END IF;
    PERFORM job_flow_finish(ids, outcomes, at);
    RETURN NULL;
END $$;

-- The trigger itself is made here, once (this file runs at every migrate: CREATE OR REPLACE
-- TRIGGER would lock job_running each time). A change to its definition drops it in a migration.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_trigger
                   WHERE tgname = 'job_running_flow' AND tgrelid = 'job_running'::regclass) THEN
        CREATE TRIGGER job_running_flow AFTER DELETE ON job_running
        REFERENCING OLD TABLE AS gone
        FOR EACH STATEMENT EXECUTE FUNCTION job_flow_ran();
    END IF;
END $$;
