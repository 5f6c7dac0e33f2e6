-- Whether job p_id is queued or running, read with a snapshot of its own (a volatile function's
-- statement, in READ COMMITTED): an enqueue that waited for a key's holder to commit sees that
-- holder's job, which its own statement's snapshot predates. One query, one snapshot: a job
-- moving between the two tables is seen in one of them.
CREATE OR REPLACE FUNCTION job_is_active(p_id bigint) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN EXISTS (SELECT FROM job WHERE id = p_id)
        OR EXISTS (SELECT FROM job_running WHERE id = p_id);
END $$;
