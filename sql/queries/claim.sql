-- name: job_claim
-- The claim: records the jobs of worker :worker_id that succeeded since its last claim, and moves
-- up to :slots[i] ripe jobs (ripe_at <= :now) of each queue :queues[i] from job to job_running,
-- each with a new fencing token, leased until :lease_expires_at.
-- :completed: the succeeded jobs' tokens, :results their results (JSON text, NULL: none);
-- :retain: keep them in job_done (false: retention is off). A stale token (the job was rescued)
-- matches no row and changes nothing; a job cancelled while it ran ends `cancelled`.
-- Returns one row: `jobs` (job_claimed[]: the claimed jobs), `recorded` (the tokens of the
-- outcomes recorded) and `next_ripe_at` (when a claim of the queues it did not fill may next
-- find work: their earliest ripe_at after :now, or the moment a full rate window of a queue
-- with limits opens; NULL: neither).
WITH completed AS (
    -- 1. the succeeded jobs leave job_running (fenced by their tokens) ...
    DELETE FROM job_running WHERE token = ANY(:completed::bigint[])
    RETURNING token, id, job_type, queue, arguments, attempts, last_error, created_at, awaited,
              cancelled_at, claimed_at
), succeeded AS (
    -- ... for job_done, with their results
    INSERT INTO job_done (id, job_type, queue, arguments, state, attempts, last_error, result,
                          created_at, finished_at, started_at)
    SELECT c.id, c.job_type, c.queue, c.arguments,
           CASE WHEN c.cancelled_at IS NULL THEN 'succeeded' ELSE 'cancelled' END,
           c.attempts + 1, c.last_error,
           CASE WHEN c.cancelled_at IS NULL THEN u.result::jsonb END, c.created_at, :now,
           c.claimed_at
    FROM completed AS c
    JOIN unnest(:completed::bigint[], :results::text[]) AS u(token, result) USING (token)
    WHERE :retain::boolean
), q AS (
    -- 2. the queues to claim from: free slots, not paused; `ripe`: a queue with limits that
    -- holds a ripe job (only those take a turn)
    SELECT u.name, u.free, jq, coalesce(jq.limited, false) AS limited,
           jq.limited AND EXISTS (
               SELECT FROM job_priorities(u.name) AS p WHERE p.ripe_at <= :now) AS ripe
    FROM unnest(:queues::text[], :slots::int[]) AS u(name, free)
    LEFT JOIN job_queue AS jq USING (name)
    WHERE u.free > 0 AND NOT coalesce(jq.paused, false)
), turns AS (
    -- 3. the queues with limits: their turns, which claim their jobs themselves, in an order
    -- the function states (job_claim_turns: lock, count, choose, move, write the starts)
    SELECT t.*
    FROM (SELECT array_agg(q.jq ORDER BY (q.jq).id) AS queues,
                 array_agg(q.free ORDER BY (q.jq).id) AS free
          FROM q WHERE q.ripe HAVING count(*) > 0) AS a
    CROSS JOIN LATERAL job_claim_turns(a.queues, a.free, :worker_id, :now, :lease_expires_at) AS t
), claimed AS (
    -- 4. the queues without limits: the first ripe jobs of each queue's line, rows another
    -- claim holds skipped. The line is read one priority at a time, highest first
    -- (job_priorities: one index probe finds the next priority and its first job), so a claim
    -- reads the ripe jobs it takes, never the jobs scheduled later nor those of other
    -- priorities. Each priority's scan starts at the first job its probe saw, past the index
    -- entries of jobs already gone.
    DELETE FROM job
    WHERE id = ANY(ARRAY(
        SELECT j.id FROM q CROSS JOIN LATERAL (
            SELECT r.id FROM job_priorities(q.name) AS p CROSS JOIN LATERAL (
                SELECT id FROM job
                WHERE job.queue = q.name AND job.priority = p.priority
                  AND ripe_at >= p.ripe_at AND ripe_at <= :now
                ORDER BY ripe_at
                LIMIT q.free
                FOR UPDATE SKIP LOCKED
            ) AS r
            LIMIT q.free  -- in the order of the priorities, then of ripe_at
        ) AS j
        WHERE NOT q.limited
    ))
    RETURNING id, job_type, arguments, ripe_at, priority, attempts, max_retries, last_error,
              created_at, queue, concurrency_key, awaited, unique_mode, unique_key
), running AS (
    -- 5. into job_running, each with a new fencing token
    INSERT INTO job_running (id, job_type, arguments, ripe_at, priority, attempts, max_retries,
                             last_error, created_at, queue, concurrency_key, awaited,
                             unique_mode, unique_key, worker_id, claimed_at, lease_expires_at,
                             token)
    SELECT c.*, :worker_id, :now, :lease_expires_at, nextval('job_fencing_token')
    FROM claimed AS c
    RETURNING token, id, job_type, arguments::text, attempts, max_retries, ripe_at, claimed_at,
              queue, concurrency_key
), taken AS (
    SELECT r::job_claimed AS job FROM running AS r
    UNION ALL
    SELECT t::job_claimed FROM turns AS t
), unfilled AS (
    -- the queues this claim left slots free in
    SELECT q.* FROM q
    WHERE q.free > (SELECT count(*) FROM taken WHERE (taken.job).queue = q.name)
)
-- 6. one row; the awaited jobs that ended are announced (`jobq_done`, sent at the commit)
SELECT ARRAY(SELECT job FROM taken) AS jobs,
       ARRAY(SELECT token FROM completed) AS recorded,
       least(
           (SELECT min(n.ripe_at) FROM unfilled AS u
            CROSS JOIN LATERAL job_priorities(u.name) AS p CROSS JOIN LATERAL (
                SELECT ripe_at FROM job
                WHERE job.queue = u.name AND job.priority = p.priority AND ripe_at > :now
                ORDER BY ripe_at LIMIT 1) AS n),
           CASE WHEN EXISTS (SELECT FROM unfilled WHERE ripe)
                THEN job_rate_opens_at(ARRAY(SELECT name FROM unfilled WHERE ripe), :now) END
       ) AS next_ripe_at
WHERE (SELECT count(pg_notify('jobq_done', id::text)) FROM completed WHERE awaited) >= 0;

-- name: job_claim_unlimited
-- The claim of a worker whose queues :queues have no limits (as it declared them): job_claim
-- without the turns, the rate windows and the queues' ripe probes. Records the succeeded jobs
-- of :completed as job_claim does, and moves up to :slots[i] ripe jobs of each queue
-- :queues[i] from job to job_running. A queue paused in job_queue is skipped; so is a queue
-- with limits there (another process declared them), which `limited` names: its claims are
-- job_claim's.
-- Returns one row: `jobs` (job_claimed[]), `recorded` (the tokens of the outcomes recorded),
-- `next_ripe_at` (the earliest ripe_at after :now of the queues it did not fill; NULL: none)
-- and `limited` (the queues skipped for their limits).
WITH completed AS (
    -- 1. the succeeded jobs leave job_running (fenced by their tokens) ...
    DELETE FROM job_running WHERE token = ANY(:completed::bigint[])
    RETURNING token, id, job_type, queue, arguments, attempts, last_error, created_at, awaited,
              cancelled_at, claimed_at
), succeeded AS (
    -- ... for job_done, with their results
    INSERT INTO job_done (id, job_type, queue, arguments, state, attempts, last_error, result,
                          created_at, finished_at, started_at)
    SELECT c.id, c.job_type, c.queue, c.arguments,
           CASE WHEN c.cancelled_at IS NULL THEN 'succeeded' ELSE 'cancelled' END,
           c.attempts + 1, c.last_error,
           CASE WHEN c.cancelled_at IS NULL THEN u.result::jsonb END, c.created_at, :now,
           c.claimed_at
    FROM completed AS c
    JOIN unnest(:completed::bigint[], :results::text[]) AS u(token, result) USING (token)
    WHERE :retain::boolean
), given AS (
    -- 2. the queues with free slots, each with its row of job_queue (if any)
    SELECT u.name, u.free, jq.paused, jq.limited
    FROM unnest(:queues::text[], :slots::int[]) AS u(name, free)
    LEFT JOIN job_queue AS jq USING (name)
    WHERE u.free > 0
), q AS (
    -- the queues to claim from: neither paused nor limited
    SELECT name, free FROM given WHERE NOT coalesce(paused OR limited, false)
), claimed AS (
    -- 3. the first ripe jobs of each queue's line, read as job_claim reads them (a skip scan
    -- of the priorities, rows another claim holds skipped)
    DELETE FROM job
    WHERE id = ANY(ARRAY(
        SELECT j.id FROM q CROSS JOIN LATERAL (
            SELECT r.id FROM job_priorities(q.name) AS p CROSS JOIN LATERAL (
                SELECT id FROM job
                WHERE job.queue = q.name AND job.priority = p.priority
                  AND ripe_at >= p.ripe_at AND ripe_at <= :now
                ORDER BY ripe_at
                LIMIT q.free
                FOR UPDATE SKIP LOCKED
            ) AS r
            LIMIT q.free
        ) AS j
    ))
    RETURNING id, job_type, arguments, ripe_at, priority, attempts, max_retries, last_error,
              created_at, queue, concurrency_key, awaited, unique_mode, unique_key
), running AS (
    -- 4. into job_running, each with a new fencing token
    INSERT INTO job_running (id, job_type, arguments, ripe_at, priority, attempts, max_retries,
                             last_error, created_at, queue, concurrency_key, awaited,
                             unique_mode, unique_key, worker_id, claimed_at, lease_expires_at,
                             token)
    SELECT c.*, :worker_id, :now, :lease_expires_at, nextval('job_fencing_token')
    FROM claimed AS c
    RETURNING token, id, job_type, arguments::text, attempts, max_retries, ripe_at, claimed_at,
              queue, concurrency_key
)
-- 5. one row; the awaited jobs that ended are announced (`jobq_done`, sent at the commit)
SELECT ARRAY(SELECT r::job_claimed FROM running AS r) AS jobs,
       ARRAY(SELECT token FROM completed) AS recorded,
       (SELECT min(n.ripe_at) FROM q
        CROSS JOIN LATERAL job_priorities(q.name) AS p CROSS JOIN LATERAL (
            SELECT ripe_at FROM job
            WHERE job.queue = q.name AND job.priority = p.priority AND ripe_at > :now
            ORDER BY ripe_at LIMIT 1) AS n
        WHERE q.free > (SELECT count(*) FROM running WHERE running.queue = q.name)
       ) AS next_ripe_at,
       ARRAY(SELECT name FROM given WHERE limited AND NOT paused) AS limited
WHERE (SELECT count(pg_notify('jobq_done', id::text)) FROM completed WHERE awaited) >= 0;

-- name: job_next_ripe_at
-- When the next claim of :queues may find work after :now: the earliest ripe_at after it of
-- their jobs (one probe per priority of each, job_priorities), or the moment a full rate window
-- (`job_rate`) of theirs lets one more job start, whichever comes first (NULL: neither).
SELECT least(
    (SELECT min(n.ripe_at) FROM unnest(:queues::text[]) AS u(name)
     CROSS JOIN LATERAL job_priorities(u.name) AS p CROSS JOIN LATERAL (
         SELECT ripe_at FROM job
         WHERE job.queue = u.name AND job.priority = p.priority AND ripe_at > :now
         ORDER BY ripe_at LIMIT 1) AS n),
    job_rate_opens_at(:queues::text[], :now::timestamptz)
);
