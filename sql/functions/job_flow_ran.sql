-- The trigger on job_running that tells the jobs of workflows and sequences that ended to the
-- jobs that wait for them (job_flow_finish), in the transaction that recorded their ends: the
-- claim's completions, job_record's outcomes, the rescue, the release of orphans. The claim
-- statement itself knows nothing of it.
--
-- job_running_flow_tell is a constraint trigger deferred to the commit, whose WHEN clause is
-- evaluated as each row is deleted: for a job of a workflow or a sequence (unique_mode 'flow';
-- other jobs cost nothing, not even a function call) job_flow_note appends the job's id (and
-- whether it was cancelled while it ran) to a setting of the transaction, and is true for the
-- first job noted since the last tell only. So the trigger runs once per transaction, at the
-- commit: it
-- reads the whole list and tells the ends at once, so that job_flow_finish locks what they
-- share in one order. Where each job is then tells how it ended: in `job` or `job_running` (a
-- retry, a release, and maybe a new claim: not ended), cancelled (marked while it ran), the
-- dead letter (failed), else succeeded (job_done holds it only while retention is on).
CREATE OR REPLACE FUNCTION job_flow_ran() RETURNS trigger LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    noted    text := current_setting('jobq.flow_ended', true);
    ids      bigint[];
    marked   bigint[];
    outcomes text[];
    at       timestamptz;
BEGIN
    IF strpos(noted, ':') = 0 THEN  -- none was cancelled while it ran: no query
        ids := string_to_array(noted, ',')::bigint[];
        marked := '{}';
    ELSE
        SELECT array_agg(split_part(x, ':', 1)::bigint),
               array_agg(split_part(x, ':', 1)::bigint) FILTER (WHERE x LIKE '%:cancelled')
        INTO ids, marked
        FROM unnest(string_to_array(noted, ',')) AS x;
    END IF;
    noted := set_config('jobq.flow_ended', '', true);
    -- how each ended (three index scans of `= ANY`, each once: never a scan of a table; the
    -- lookups in their results are linear, and a transaction ends a worker's batch of jobs or
    -- a rescue's), recorded as its outcome where it is its job's first end (job_flow_finish, 1),
    -- in id order (an index scan of `= ANY`)
    WITH recorded AS (
        UPDATE job_flow AS f
        SET outcome = CASE
                WHEN f.job_id = ANY(marked) THEN 'cancelled'
                WHEN f.job_id = ANY(ARRAY(SELECT id FROM job_dead WHERE id = ANY(ids)))
                THEN 'failed'
                ELSE 'succeeded' END
        WHERE f.job_id = ANY(ids) AND f.outcome IS NULL
          AND (f.job_id = ANY(marked)
               OR NOT f.job_id = ANY(ARRAY(SELECT id FROM job WHERE id = ANY(ids)
                                           UNION ALL
                                           SELECT id FROM job_running WHERE id = ANY(ids))))
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

-- The trigger itself is made here, once (this file runs whenever migrate re-creates the
-- functions: CREATE OR REPLACE TRIGGER would lock job_running each time), after
-- job_flow_note.sql (the files run by name).
-- A database from before job_flow_note has two triggers, job_running_flow_note and an older
-- job_running_flow_tell: both are replaced here, in the transaction that makes job_flow_note
-- (a migration runs before it, and a commit between the two could end a job untold).
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_trigger
               WHERE tgname = 'job_running_flow_note' AND tgrelid = 'job_running'::regclass)
    THEN
        DROP TRIGGER job_running_flow_note ON job_running;
        DROP TRIGGER job_running_flow_tell ON job_running;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_trigger
                   WHERE tgname = 'job_running_flow_tell' AND tgrelid = 'job_running'::regclass)
    THEN
        CREATE CONSTRAINT TRIGGER job_running_flow_tell AFTER DELETE ON job_running
        DEFERRABLE INITIALLY DEFERRED
        FOR EACH ROW WHEN (CASE WHEN OLD.unique_mode = 'flow'
                                THEN job_flow_note(OLD.id, OLD.cancelled_at IS NOT NULL)
                                ELSE false END)
        EXECUTE FUNCTION job_flow_ran();
    END IF;
END $$;
