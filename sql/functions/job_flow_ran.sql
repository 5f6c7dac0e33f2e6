-- The triggers on job_running that tell the jobs of workflows and sequences that ended to the
-- jobs that wait for them (job_flow_finish), in the transaction that recorded their ends: the
-- claim's completions, job_record's outcomes, the rescue, the release of orphans. The claim
-- statement itself knows nothing of them.
--
-- Both fire only for a job of a workflow or a sequence (WHEN unique_mode = 'flow', checked as
-- each row is deleted): other jobs cost nothing, not even a trigger call. `note`, at the end of
-- each statement, appends the job's id (and whether it was cancelled while it ran) to a setting
-- of the transaction. `tell`, deferred to the commit, reads the whole list at its first call
-- (the others find it empty) and tells the ends at once, so that job_flow_finish locks what
-- they share in one order. Where each job is then tells how it ended: in `job` or `job_running`
-- (a retry, a release, and maybe a new claim: not ended), cancelled (marked while it ran), the
-- dead letter (failed), else succeeded (job_done holds it only while retention is on).
CREATE OR REPLACE FUNCTION job_flow_ran() RETURNS trigger LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    noted    text := current_setting('jobq.flow_ended', true);
    ids      bigint[];
    outcomes text[];
    at       timestamptz;
BEGIN
    IF TG_ARGV[0] = 'note' THEN
        PERFORM set_config('jobq.flow_ended', concat_ws(',', nullif(noted, ''),
            OLD.id || CASE WHEN OLD.cancelled_at IS NULL THEN '' ELSE ':cancelled' END), true);
        RETURN NULL;
    END IF;
    IF coalesce(noted, '') = '' THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('jobq.flow_ended', '', true);
    -- how each ended (one probe of each table's primary key per job: LATERAL, never a scan)
    SELECT array_agg(n.id ORDER BY n.id),
           array_agg(CASE WHEN n.cancelled THEN 'cancelled'
                          WHEN d.dead THEN 'failed'
                          ELSE 'succeeded' END ORDER BY n.id)
    INTO ids, outcomes
    FROM (SELECT split_part(x, ':', 1)::bigint AS id, bool_or(x LIKE '%:cancelled') AS cancelled
          FROM unnest(string_to_array(noted, ',')) AS x
          GROUP BY 1) AS n
    LEFT JOIN LATERAL (
        SELECT 1 AS place FROM job WHERE job.id = n.id
        UNION ALL SELECT 1 FROM job_running AS r WHERE r.id = n.id
        LIMIT 1) AS p ON true
    LEFT JOIN LATERAL (SELECT true AS dead FROM job_dead WHERE job_dead.id = n.id) AS d ON true
    WHERE n.cancelled OR p.place IS NULL;
    -- recorded as their outcomes where they are their jobs' first ends (job_flow_finish, 1), in
    -- id order (an index scan of `= ANY`; the lookup in the arrays is linear, and a statement
    -- ends at most a worker's batch of jobs)
    WITH recorded AS (
        UPDATE job_flow AS f
        SET outcome = outcomes[array_position(ids, f.job_id)]
        WHERE f.job_id = ANY(ids) AND f.outcome IS NULL
        RETURNING f.job_id, f.outcome
    )
    SELECT array_agg(job_id ORDER BY job_id), array_agg(outcome ORDER BY job_id)
    INTO ids, outcomes
    FROM recorded;
    IF ids IS NULL THEN
        RETURN NULL;
    END IF;
    IF 'succeeded' <> ANY(outcomes) THEN
        -- the time the statements stamped on the ends (the application's clock), for the jobs
        -- that they cancel
        at := coalesce(
            (SELECT max(died_at) FROM job_dead WHERE id = ANY(ids)),
            (SELECT max(finished_at) FROM job_done WHERE id = ANY(ids)),
            statement_timestamp());
    END IF;
    PERFORM job_flow_finish(ids, outcomes, at);
    RETURN NULL;
END $$;

-- The triggers themselves are made here, once each (this file runs at every migrate: CREATE OR
-- REPLACE TRIGGER would lock job_running each time). A change to one's definition drops it in
-- a migration.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_trigger
                   WHERE tgname = 'job_running_flow_note' AND tgrelid = 'job_running'::regclass)
    THEN
        CREATE TRIGGER job_running_flow_note AFTER DELETE ON job_running
        FOR EACH ROW WHEN (OLD.unique_mode = 'flow') EXECUTE FUNCTION job_flow_ran('note');
    END IF;
    IF NOT EXISTS (SELECT FROM pg_trigger
                   WHERE tgname = 'job_running_flow_tell' AND tgrelid = 'job_running'::regclass)
    THEN
        CREATE CONSTRAINT TRIGGER job_running_flow_tell AFTER DELETE ON job_running
        DEFERRABLE INITIALLY DEFERRED
        FOR EACH ROW WHEN (OLD.unique_mode = 'flow') EXECUTE FUNCTION job_flow_ran('tell');
    END IF;
END $$;
