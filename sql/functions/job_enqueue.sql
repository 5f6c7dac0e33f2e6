-- Enqueue one job of the `Unique` modes `none` or `queued` from a statement of the caller's, so
-- that the job and the caller's rows are written by one statement (reminder_create_one_off):
-- the insert of `job_enqueue` (queries/enqueue.sql) and, with p_traceparent, its trace context
-- (job_trace_add). Returns the new job's id, or NULL when a queued twin holds its md5 (mode
-- `queued`). The caller wakes the workers after its commit (jobq.queue.store.enqueued).
-- PL/pgSQL, so that its statements are planned once per session: a LANGUAGE sql function
-- that writes is planned anew at every call of the statement that calls it.
CREATE OR REPLACE FUNCTION job_enqueue(
    p_job_type text, p_arguments jsonb, p_ripe_at timestamptz, p_priority smallint,
    p_max_retries integer, p_now timestamptz, p_queue text, p_concurrency_key text,
    p_unique_mode text, p_unique_key text, p_traceparent text
) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
BEGIN
    INSERT INTO job (job_type, arguments, ripe_at, priority, max_retries, created_at, queue,
                     concurrency_key, unique_mode, unique_key)
    VALUES (p_job_type, p_arguments, p_ripe_at, p_priority, p_max_retries, p_now, p_queue,
            p_concurrency_key, p_unique_mode, p_unique_key)
    ON CONFLICT (md5) DO NOTHING
    RETURNING id INTO v_id;
    IF v_id IS NOT NULL AND p_traceparent IS NOT NULL THEN
        INSERT INTO job_trace (job_id, traceparent, created_at)
        VALUES (v_id, p_traceparent, p_now);
    END IF;
    RETURN v_id;
END
$$;
