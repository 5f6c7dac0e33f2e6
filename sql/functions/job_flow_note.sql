-- Notes the end of job p_id of a workflow or a sequence (p_cancelled: it was cancelled while it
-- ran) in the transaction's list `jobq.flow_ended`, and returns whether it is the first noted
-- since the list was last read: the WHEN clause of job_running_flow_tell
-- (sql/functions/job_flow_ran.sql), which so runs job_flow_ran once per transaction. A function
-- rather than the expression itself in the WHEN clause: that clause is prepared at every
-- statement that deletes from job_running, whatever its jobs, and stays this small.
CREATE OR REPLACE FUNCTION job_flow_note(p_id bigint, p_cancelled boolean)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    noted text := p_id::text || CASE WHEN p_cancelled THEN ':cancelled' ELSE '' END;
BEGIN
    RETURN set_config('jobq.flow_ended',
                      concat_ws(',', nullif(current_setting('jobq.flow_ended', true), ''), noted),
                      true) = noted;
END $$;
