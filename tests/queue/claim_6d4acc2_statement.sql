-- The limited claim of revision 6d4acc2^ (`jobq.queue.sql.job_claim_recording`, rendered by
-- that revision's `_claiming`): it records the worker's outcomes and claims in one statement,
-- and its CTE `q` decides whether a limited queue takes its turn with
--     EXISTS (SELECT FROM completed AS c WHERE c.queue = u.name) OR EXISTS (ripe job)
-- (the "busy-queue exemption" that commit 6d4acc2 withdrew). Kept for
-- tests/queue/test_claim_cte_order.py; frozen: never edit.
-- $1 completed tokens, $2 now, $3 results, $4 retain, $5 failed tokens, $6 failed_ripe_ats,
-- $7 failed_errors, $8 failed_charges, $9 failed_tracebacks, $10 buried tokens,
-- $11 buried_errors, $12 buried_tracebacks, $13 queues, $14 slots, $15 worker_id,
-- $16 lease_expires_at.

WITH 
completed AS (
    DELETE FROM job_running WHERE token = ANY($1::bigint[])
    RETURNING token, id, job_type, queue, arguments, attempts, last_error, created_at, awaited,
              cancelled_at
), succeeded AS (
    INSERT INTO job_done (id, job_type, queue, arguments, state, attempts, last_error, result, created_at, finished_at)
    SELECT s.id, s.job_type, s.queue, s.arguments, CASE WHEN s.cancelled_at IS NULL THEN 'succeeded' ELSE 'cancelled' END, s.attempts + 1, s.last_error, CASE WHEN s.cancelled_at IS NULL THEN s.result::jsonb END,
           s.created_at, $2::timestamptz
    FROM (SELECT c.*, u.result FROM completed AS c JOIN unnest($1::bigint[], $3::text[]) AS u(token, result) USING (token)) AS s
    WHERE $4::boolean
), failed AS (
    DELETE FROM job_running AS r
    USING unnest($5::bigint[], $6::timestamptz[], $7::text[],
                 $8::int[], $9::text[])
          AS u(token, ripe_at, error, charge, traceback)
    WHERE r.token = u.token
    RETURNING r.token, r.id, r.job_type, r.arguments, r.priority,
              -- a release keeps the job's place in the queue; a retry waits its backoff, a
              -- snooze its delay
              coalesce(u.ripe_at, least(r.ripe_at, $2::timestamptz)) AS next_ripe_at,
              r.attempts + u.charge AS next_attempts, r.max_retries,
              coalesce(u.error, r.last_error) AS next_error, r.created_at, r.queue,
              r.concurrency_key, r.attempts, r.awaited, r.cancelled_at, r.unique_mode,
              r.unique_key, r.worker_id, u.charge, u.error AS attempt_error, u.traceback
), 
live AS (
    SELECT * FROM failed WHERE cancelled_at IS NULL
), cancelled AS (
    INSERT INTO job_done (id, job_type, queue, arguments, state, attempts, last_error, result, created_at, finished_at)
    SELECT s.id, s.job_type, s.queue, s.arguments, 'cancelled', s.attempts + 1, s.next_error, NULL,
           s.created_at, $2::timestamptz
    FROM (SELECT * FROM failed WHERE cancelled_at IS NOT NULL) AS s
    WHERE $4::boolean
),
requeued AS (
    INSERT INTO job (id, job_type, arguments, ripe_at, priority, attempts, max_retries, last_error, created_at, queue, concurrency_key, awaited, unique_mode, unique_key)
    SELECT s.id, s.job_type, s.arguments, s.next_ripe_at, s.priority, s.next_attempts, s.max_retries,
           s.next_error, s.created_at, s.queue, s.concurrency_key, s.awaited, s.unique_mode,
           s.unique_key
    FROM live AS s
    ON CONFLICT (md5) DO NOTHING
    RETURNING id
), hastened AS (
    UPDATE job SET ripe_at = least(job.ripe_at, s.next_ripe_at)
    FROM live AS s
    WHERE s.unique_mode = 'queued' AND job.md5 = md5(s.job_type || coalesce('#' || s.unique_key, s.arguments::text))
      AND s.id NOT IN (SELECT id FROM requeued)
    RETURNING job.id, s.id AS merged_id
), merged AS (
    INSERT INTO job_dead (id, job_type, arguments, priority, attempts, max_retries, last_error, created_at, died_at, queue, concurrency_key)
    SELECT s.id, s.job_type, s.arguments, s.priority, s.next_attempts, s.max_retries,
           coalesce('merged into queued duplicate job ' || h.id, 'merged into a queued duplicate'),
           s.created_at, $2::timestamptz, s.queue, s.concurrency_key
    FROM live AS s LEFT JOIN hastened AS h ON h.merged_id = s.id
    WHERE s.id NOT IN (SELECT id FROM requeued)
), buried AS (
    DELETE FROM job_running AS r
    USING unnest($10::bigint[], $11::text[], $12::text[])
          AS u(token, error, traceback)
    WHERE r.token = u.token
    RETURNING r.token, r.id, r.job_type, r.arguments, r.priority, r.attempts, r.max_retries,
              u.error, r.created_at, r.queue, r.concurrency_key, r.awaited, r.cancelled_at,
              r.worker_id, u.traceback
), attempted AS (
    INSERT INTO job_attempt (job_id, attempt, worker_id, error, traceback, failed_at)
    SELECT id, attempts + 1, worker_id, error, traceback, $2::timestamptz FROM (
        SELECT id, attempts, worker_id, attempt_error AS error, traceback FROM failed
        WHERE charge > 0
        UNION ALL SELECT id, attempts, worker_id, error, traceback FROM buried
    ) AS a
    WHERE $4::boolean
), dead AS (
    INSERT INTO job_dead (id, job_type, arguments, priority, attempts, max_retries, last_error, created_at, died_at, queue, concurrency_key)
    SELECT id, job_type, arguments, priority, attempts + 1, max_retries, error, created_at, $2,
           queue, concurrency_key
    FROM buried WHERE cancelled_at IS NULL
), buried_cancelled AS (
    INSERT INTO job_done (id, job_type, queue, arguments, state, attempts, last_error, result, created_at, finished_at)
    SELECT s.id, s.job_type, s.queue, s.arguments, 'cancelled', s.attempts + 1, s.error, NULL,
           s.created_at, $2::timestamptz
    FROM (SELECT * FROM buried WHERE cancelled_at IS NOT NULL) AS s
    WHERE $4::boolean
), recorded AS (
    SELECT token FROM completed
    UNION ALL SELECT token FROM failed
    UNION ALL SELECT token FROM buried
), ended AS (
    SELECT id, awaited FROM completed
    UNION ALL SELECT id, awaited FROM failed WHERE cancelled_at IS NOT NULL
    UNION ALL SELECT id, awaited FROM buried
), q AS (
    SELECT u.name, u.free, coalesce(jq.limited, false) AS limited, jq, jq.limited AND (
        EXISTS (SELECT FROM completed AS c WHERE c.queue = u.name)
        OR EXISTS (SELECT FROM job WHERE job.queue = u.name AND job.ripe_at <= $2)) AS ripe
    FROM unnest($13::text[], $14::int[]) AS u(name, free)
    LEFT JOIN job_queue AS jq USING (name)
    WHERE u.free > 0 AND NOT coalesce(jq.paused, false)
), turns AS (
    -- the limited queues' turns (job_claimable): per queue, its budget, or the jobs it chose
    -- when a key's limit may bind
    SELECT t.*
    FROM (SELECT array_agg(q.jq ORDER BY (q.jq).id) AS queues,
                 array_agg(q.free ORDER BY (q.jq).id) AS free
          FROM q WHERE q.ripe HAVING count(*) > 0) AS a
    CROSS JOIN LATERAL job_claimable(a.queues, a.free, $2) AS t
), claimed AS (
    DELETE FROM job
    WHERE id = ANY(ARRAY(
        -- first (it may wait for the queues' turn): the jobs chosen in a turn
        SELECT unnest(t.ids) FROM turns AS t
        UNION ALL
        SELECT j.id FROM (
            -- how many jobs of its line each queue takes: its free slots, or its turn's budget
            -- (none when the turn chose its jobs, or left no budget)
            SELECT q.name, CASE WHEN q.limited THEN coalesce(t.budget, 0) ELSE q.free END AS n
            FROM q LEFT JOIN turns AS t ON t.queue = q.name
        ) AS l CROSS JOIN LATERAL (
            -- the queue's line one priority at a time, highest first (a skip scan: one index
            -- probe finds the next priority and its first job), so the claim reads the ripe
            -- jobs it takes and never walks the jobs scheduled later: one range scan of (queue,
            -- priority DESC, ripe_at) with `ripe_at <= $2` would read them all whenever fewer
            -- jobs are ripe than free slots. Each priority's scan starts at the first job its
            -- probe saw, past the index entries of jobs already gone (dead rows a long
            -- transaction elsewhere keeps from vacuum): they are stepped over once, not twice.
            WITH RECURSIVE priorities AS (
                (SELECT priority, ripe_at FROM job WHERE job.queue = l.name
                 ORDER BY priority DESC, ripe_at LIMIT 1)
                UNION ALL
                SELECT n.priority, n.ripe_at FROM priorities AS p CROSS JOIN LATERAL (
                    SELECT job.priority, job.ripe_at FROM job
                    WHERE job.queue = l.name AND job.priority < p.priority
                    ORDER BY job.priority DESC, job.ripe_at LIMIT 1) AS n
            )
            SELECT r.id FROM priorities AS p CROSS JOIN LATERAL (
                SELECT id FROM job
                WHERE job.queue = l.name AND job.priority = p.priority
                  AND ripe_at >= p.ripe_at AND ripe_at <= $2
                ORDER BY ripe_at
                LIMIT l.n
                FOR UPDATE SKIP LOCKED
            ) AS r
            LIMIT l.n  -- in the order of the priorities, then of ripe_at
        ) AS j
    ))
    RETURNING id, job_type, arguments, ripe_at, priority, attempts, max_retries, last_error, created_at, queue, concurrency_key, awaited, unique_mode, unique_key
), running AS (
    INSERT INTO job_running (id, job_type, arguments, ripe_at, priority, attempts, max_retries, last_error, created_at, queue, concurrency_key, awaited, unique_mode, unique_key, worker_id, claimed_at, lease_expires_at, token)
    SELECT id, job_type, arguments, ripe_at, priority, attempts, max_retries, last_error, created_at, queue, concurrency_key, awaited, unique_mode, unique_key, $15, coalesce((SELECT t.claimed_at FROM turns AS t WHERE t.queue = c.queue), $2), $16, nextval('job_fencing_token')
    FROM claimed AS c  -- in the order of the claim (a join could reorder the jobs)
    RETURNING token, id, job_type, arguments, attempts, max_retries, ripe_at, claimed_at, queue,
              concurrency_key
), started AS (
    -- the start rows of the turns that took their line here (their keys folded in when
    -- `keyed`); a turn that chose its jobs wrote theirs (job_claimable)
    INSERT INTO job_rate (queue, concurrency_key, at, seq, n, keys)
    SELECT t.queue, '', t.claimed_at, t.seq + s.n, s.n, s.keys
    FROM turns AS t CROSS JOIN LATERAL (
        SELECT count(*) AS n, CASE WHEN t.keyed THEN array_agg(r.concurrency_key)
                                   FILTER (WHERE r.concurrency_key IS NOT NULL) END AS keys
        FROM running AS r WHERE r.queue = t.queue
    ) AS s
    WHERE t.budget IS NOT NULL AND t.rated AND s.n > 0
), unfilled AS (
    SELECT q.* FROM q
    WHERE q.free > (SELECT count(*) FROM running AS r WHERE r.queue = q.name)
      AND true
), upcoming AS (
    -- when a claim of the queues this one left slots free in may next find work (the worker's
    -- timer), as `job_next_ripe_at` tells, with no second statement to ask it; the rate
    -- windows only of limited queues (none here without `limits`)
    SELECT least(
    (SELECT min(n.ripe_at) FROM (SELECT name FROM unfilled) AS u CROSS JOIN LATERAL (
         SELECT ripe_at FROM job WHERE job.queue = u.name AND ripe_at > $2
         ORDER BY ripe_at LIMIT 1) AS n),
    CASE WHEN EXISTS (SELECT name FROM unfilled WHERE ripe) THEN job_rate_opens_at(ARRAY(SELECT name FROM unfilled WHERE ripe), $2::timestamptz) END
) AS ripe_at
)
SELECT * FROM running
UNION ALL
SELECT token, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM recorded
WHERE (SELECT count(pg_notify('jobq_done', id::text)) FROM ended WHERE awaited) >= 0
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, ripe_at, NULL, NULL, NULL FROM upcoming
