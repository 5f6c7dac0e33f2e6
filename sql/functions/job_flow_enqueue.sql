-- Enqueue the jobs of a workflow, a batch or sequences at once (jobq.queue.flow), in the
-- caller's transaction: one job per element of the p_job_types ... p_sequence_keys arrays, and
-- job p_edge_jobs[i] waits for job p_edge_deps[i] (1-based positions in those arrays); a job of
-- p_cancels true is cancelled when one it waits for fails or is cancelled. A job with a sequence
-- key also waits for the job enqueued before it with that key (here or earlier, whatever its
-- outcome). With p_workflow_name or p_new_workflow, the jobs form a new workflow.
-- Every job gets a job_flow row; those that wait go to job_waiting, the others into `job`
-- (never deduplicated). Returns the workflow's id (NULL: none), the jobs' ids in the order of
-- the arrays, and how many wait. Cycles and unknown dependencies are refused before this, by
-- the caller (jobq.queue.flow.Workflow).
--
-- A sequence's row (job_sequence) is locked while its last job is read and replaced: enqueues of
-- one key take turns, in commit order, and lock keys in key order (no deadlock). The last job
-- of an earlier enqueue is locked FOR SHARE (in id order) before its outcome is read: if it
-- has not ended, the statement that records its end waits for this transaction and then sees
-- the new job waiting for it (job_flow_finish, 2).
CREATE OR REPLACE FUNCTION job_flow_enqueue(
    p_workflow_name text,
    p_new_workflow boolean,
    p_now timestamptz,
    p_job_types text[],
    p_arguments text[],
    p_ripe_ats timestamptz[],
    p_priorities smallint[],
    p_max_retries integer[],
    p_queues text[],
    p_concurrency_keys text[],
    p_steps text[],
    p_sequence_keys text[],
    p_cancels boolean[],
    p_edge_jobs integer[],
    p_edge_deps integer[],
    OUT workflow_id bigint,
    OUT job_ids bigint[],
    OUT num_waiting integer
) LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    n       integer := cardinality(p_job_types);
    k       record;
    prev    bigint;
    firsts  bigint[] := '{}';
    prevs   bigint[] := '{}';
    unended bigint[];
BEGIN
    IF p_new_workflow OR p_workflow_name IS NOT NULL THEN
        INSERT INTO job_workflow (name, num_jobs, created_at)
        VALUES (p_workflow_name, n, p_now)
        RETURNING id INTO workflow_id;
    END IF;
    job_ids := ARRAY(SELECT nextval(pg_get_serial_sequence('job', 'id'))
                     FROM generate_series(1, n));

    INSERT INTO job_flow (job_id, workflow_id, step, sequence_key, job_type, arguments, ripe_at,
                          priority, max_retries, queue, concurrency_key, created_at)
    SELECT u.id, workflow_id, u.step, u.sequence_key, u.job_type, u.arguments::jsonb, u.ripe_at,
           u.priority, u.max_retries, u.queue, u.concurrency_key, p_now
    FROM unnest(job_ids, p_steps, p_sequence_keys, p_job_types, p_arguments, p_ripe_ats,
                p_priorities, p_max_retries, p_queues, p_concurrency_keys)
         AS u(id, step, sequence_key, job_type, arguments, ripe_at, priority, max_retries, queue,
              concurrency_key);

    -- the dependencies named, and each sequence's jobs in order within this enqueue (a job
    -- waits for the one before it in its sequence whatever its outcome)
    INSERT INTO job_dependency (depends_on, job_id, cancels)
    SELECT e.depends_on, e.job_id, bool_and(e.cancels)
    FROM (SELECT job_ids[d.dep] AS depends_on, job_ids[d.job] AS job_id, p_cancels[d.job] AS cancels
          FROM unnest(p_edge_jobs, p_edge_deps) AS d(job, dep)
          UNION ALL
          SELECT s.before, s.id, false
          FROM (SELECT u.id, lag(u.id) OVER (PARTITION BY u.key ORDER BY u.i) AS before
                FROM unnest(job_ids, p_sequence_keys) WITH ORDINALITY AS u(id, key, i)
                WHERE u.key IS NOT NULL) AS s
          WHERE s.before IS NOT NULL) AS e
    GROUP BY e.depends_on, e.job_id;

    -- each sequence's last job of an earlier enqueue, and this enqueue's last job in its place
    FOR k IN
        SELECT u.key, min(u.i) AS first, max(u.i) AS last
        FROM unnest(p_sequence_keys) WITH ORDINALITY AS u(key, i)
        WHERE u.key IS NOT NULL
        GROUP BY u.key
        ORDER BY u.key
    LOOP
        LOOP
            SELECT last_job_id INTO prev FROM job_sequence WHERE key = k.key FOR UPDATE;
            IF FOUND THEN
                UPDATE job_sequence SET last_job_id = job_ids[k.last] WHERE key = k.key;
                firsts := firsts || job_ids[k.first];
                prevs := prevs || prev;
                EXIT;
            END IF;
            INSERT INTO job_sequence (key, last_job_id) VALUES (k.key, job_ids[k.last])
            ON CONFLICT (key) DO NOTHING;
            EXIT WHEN FOUND;  -- a new sequence; else another enqueue made it meanwhile: lock it
        END LOOP;
    END LOOP;
    IF cardinality(prevs) > 0 THEN
        unended := ARRAY(SELECT job_id FROM job_flow
                      WHERE job_id = ANY(prevs) AND outcome IS NULL
                      ORDER BY job_id FOR SHARE);
        INSERT INTO job_dependency (depends_on, job_id, cancels)
        SELECT u.prev, u.first, false
        FROM unnest(firsts, prevs) AS u(first, prev)
        WHERE u.prev = ANY(unended);
    END IF;

    INSERT INTO job_waiting (job_id, remaining)
    SELECT d.job_id, count(*)
    FROM unnest(job_ids) AS u(id) JOIN job_dependency AS d ON d.job_id = u.id
    GROUP BY d.job_id;
    GET DIAGNOSTICS num_waiting = ROW_COUNT;

    INSERT INTO job (id, job_type, arguments, ripe_at, priority, max_retries, created_at, queue,
                     concurrency_key, unique_mode)
    SELECT f.job_id, f.job_type, f.arguments, f.ripe_at, f.priority, f.max_retries, f.created_at,
           f.queue, f.concurrency_key, 'flow'
    FROM unnest(job_ids) AS u(id) JOIN job_flow AS f ON f.job_id = u.id
    WHERE NOT EXISTS (SELECT FROM job_waiting AS w WHERE w.job_id = u.id);
END $$;
