-- The ends of jobs of workflows and sequences, told to the jobs that wait for them: job
-- p_ids[i] ended with p_outcomes[i] ('succeeded', 'failed' or 'cancelled'), which the caller
-- has just recorded as its job_flow row's `outcome` (`UPDATE ... WHERE outcome IS NULL`: only a
-- job's first end is told); p_at stamps the jobs cancelled because of them. Runs in the
-- transaction that recorded the ends: the trigger on job_running (job_flow_ran) and the cancels
-- (job_flow_cancel, job_workflow_cancel) call it.
-- A waiting job whose last dependency ended moves into `job` (and the workers are notified at
-- the commit); one whose dependency failed or was cancelled, by an edge that `cancels`, is
-- cancelled (into job_done), and its own dependents are told in the next round. Returns how
-- many jobs moved into `job`.
--
-- Exactly once, from PostgreSQL's row locks and READ COMMITTED: each statement of a function
-- reads the database as of its own start, and an UPDATE that finds a row locked by another
-- transaction waits for it to end, then evaluates its WHERE and SET on the row's newest
-- committed version (and skips a row that was deleted).
-- 1. A job's first end is the one recorded: the caller sets its job_flow row's `outcome` only
--    while NULL, so each end counts once toward each dependent.
-- 2. Dependents are looked up in a statement after 1, whose transaction holds the job_flow rows
--    of the ends. An enqueue that makes a job wait for an existing one (job_flow_enqueue,
--    job_workflow_retry) locks that one's job_flow row before it reads its outcome: either 1
--    waited for that enqueue's commit, and its dependent is seen here, or the enqueue waited
--    for this transaction and saw the outcome (and did not count that job).
-- 3. The dependents' job_waiting rows are counted down by one UPDATE. When the last two
--    dependencies of a job end at once on two workers, the second one's UPDATE waits for the
--    first's commit, then counts down from the row as the first left it: exactly one reaches
--    0 and moves the job. A row the first moved to the queue is gone, and the second skips it.
-- The UPDATEs take their rows in id order (`= ANY` of an index scan, or a nested loop over
-- sorted ids), so two transactions that share rows lock them in the same order.
CREATE OR REPLACE FUNCTION job_flow_finish(p_ids bigint[], p_outcomes text[], p_at timestamptz)
RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    ended    bigint[] := p_ids;
    outcomes text[]   := p_outcomes;
    ready    bigint[];
    doomed   bigint[];
    moved    integer;
    promoted integer  := 0;
BEGIN
    WHILE cardinality(ended) > 0 LOOP
        -- 2. their waiting dependents (in a statement after the caller's record of the ends;
        -- `= ANY`: one index scan for them all), 3. counted down, in id order (the join's outer
        -- side)
        WITH counted AS (
            UPDATE job_waiting AS w SET remaining = w.remaining - h.n
            FROM (SELECT d.job_id, count(*)::integer AS n,
                         bool_or(d.cancels AND e.outcome <> 'succeeded') AS cancels
                  FROM job_dependency AS d
                  JOIN unnest(ended, outcomes) AS e(id, outcome) ON e.id = d.depends_on
                  WHERE d.depends_on = ANY(ended)
                  GROUP BY d.job_id ORDER BY d.job_id) AS h
            WHERE w.job_id = h.job_id
            RETURNING w.job_id, w.remaining, h.cancels
        )
        SELECT coalesce(array_agg(job_id ORDER BY job_id) FILTER (WHERE cancels), '{}'),
               coalesce(array_agg(job_id ORDER BY job_id)
                        FILTER (WHERE remaining = 0 AND NOT cancels), '{}')
        INTO doomed, ready
        FROM counted;

        IF cardinality(ready) > 0 THEN
            -- the ripe ones into the queue, as their job_flow rows define them
            WITH gone AS (
                DELETE FROM job_waiting WHERE job_id = ANY(ready) RETURNING job_id, awaited
            )
            INSERT INTO job (id, job_type, arguments, ripe_at, priority, max_retries,
                             created_at, queue, concurrency_key, awaited, unique_mode)
            SELECT f.job_id, f.job_type, f.arguments, f.ripe_at, f.priority, f.max_retries,
                   f.created_at, f.queue, f.concurrency_key, g.awaited, 'flow'
            FROM gone AS g JOIN job_flow AS f USING (job_id);
            GET DIAGNOSTICS moved = ROW_COUNT;
            promoted := promoted + moved;
        END IF;

        IF cardinality(doomed) > 0 THEN
            -- the doomed ones cancelled (recorded, counted in the metrics, their waiters told),
            -- and told to their own dependents in the next round
            UPDATE job_flow SET outcome = 'cancelled'
            WHERE job_id = ANY(doomed) AND outcome IS NULL;
            WITH gone AS (
                DELETE FROM job_waiting WHERE job_id = ANY(doomed) RETURNING job_id, awaited
            ), cancelled AS (
                INSERT INTO job_done (id, job_type, queue, arguments, state, attempts,
                                      last_error, result, created_at, finished_at)
                SELECT f.job_id, f.job_type, f.queue, f.arguments, 'cancelled', 0,
                       'a job it waits for failed or was cancelled', NULL, f.created_at, p_at
                FROM gone AS g JOIN job_flow AS f USING (job_id)
                RETURNING queue, job_type
            ), counted AS (
                INSERT INTO job_counter AS c (queue, job_type, event, count)
                SELECT queue, job_type, 'cancelled', count(*) FROM cancelled
                GROUP BY queue, job_type ORDER BY queue, job_type
                ON CONFLICT (queue, job_type, event) DO UPDATE SET count = c.count + EXCLUDED.count
            )
            SELECT count(pg_notify('jobq_done', job_id::text)) INTO moved FROM gone WHERE awaited;
        END IF;
        ended := doomed;
        outcomes := array_fill('cancelled'::text, ARRAY[cardinality(doomed)]);
    END LOOP;
    IF promoted > 0 THEN
        -- in the transaction: the jobs it moved are ripe at its commit (only transactions that
        -- move some pay for a NOTIFY: see jobq.queue.notify)
        PERFORM pg_notify('jobq', '');
    END IF;
    RETURN promoted;
END $$;
