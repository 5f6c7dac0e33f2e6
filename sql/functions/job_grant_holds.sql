-- Whether a worker's grant in the queue with id p_queue_id, ending at p_until, still lets it
-- claim now: taken the turn lock shared (never waiting), its end not passed by the server's
-- clock. False sends the claim through the queue's turn.
CREATE OR REPLACE FUNCTION job_grant_holds(p_queue_id integer, p_until timestamptz) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN pg_try_advisory_xact_lock_shared(1785684594, p_queue_id)
           AND p_until > clock_timestamp();
END $$;
