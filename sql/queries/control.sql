-- name: job_cancel
-- A queued (or scheduled) job leaves the queue now and ends `cancelled`; a running one is marked
-- (`cancelled_at`) and its worker told (NOTIFY jobq_cancel). Returns how many of each: none when
-- the job is elsewhere (or moved after this statement's snapshot: the caller looks again), with
-- the queue and job type of the job cancelled (for the metrics).
WITH queued AS (
    DELETE FROM job WHERE id = :job_id
    RETURNING id, job_type, queue, arguments, attempts, last_error, created_at, awaited
), cancelled AS (
    INSERT INTO job_done (id, job_type, queue, arguments, state, attempts, last_error, result, created_at, finished_at)
    SELECT s.id, s.job_type, s.queue, s.arguments, 'cancelled', s.attempts, s.last_error, NULL,
           s.created_at, :now::timestamptz
    FROM queued AS s
    WHERE :retain::boolean
),
running AS (
    UPDATE job_running SET cancelled_at = :now WHERE id = :job_id AND cancelled_at IS NULL
    RETURNING id, job_type, queue
), cancelled_job AS (
    SELECT job_type, queue FROM queued UNION ALL SELECT job_type, queue FROM running
)
SELECT (SELECT count(*) FROM queued) AS queued,
       (SELECT count(pg_notify('jobq_cancel', id::text)) FROM running) AS running,
       (SELECT queue FROM cancelled_job LIMIT 1) AS queue,
       (SELECT job_type FROM cancelled_job LIMIT 1) AS job_type
WHERE (SELECT count(pg_notify('jobq_done', id::text)) FROM queued WHERE awaited) >= 0;

-- name: job_await
-- Someone awaits the job's end: mark it, where it is queued, running or waiting (the statement that ends it
-- notifies jobq_done). Returns how many rows were marked (0: it is elsewhere, or moved).
WITH queued AS (
    UPDATE job SET awaited = true WHERE id = :job_id RETURNING id
), running AS (
    UPDATE job_running SET awaited = true WHERE id = :job_id RETURNING id
), waiting AS (
    UPDATE job_waiting SET awaited = true WHERE job_id = :job_id RETURNING job_id
)
SELECT (SELECT count(*) FROM queued) + (SELECT count(*) FROM running)
       + (SELECT count(*) FROM waiting);

-- name: job_find
-- The job wherever it is (`waiting`: for other jobs, in job_waiting).
SELECT * FROM (
(SELECT id, job_type, queue, CASE WHEN ripe_at > :now THEN 'scheduled' ELSE 'queued' END AS state, arguments, priority, attempts, max_retries,
        last_error, created_at, ripe_at, NULL::timestamptz AS started_at,
        NULL::timestamptz AS finished_at, NULL::timestamptz AS cancelled_at, NULL::jsonb AS result,
        NULL::real AS progress, NULL::text AS progress_message
 FROM job
 WHERE id = :job_id )
UNION ALL
(SELECT id, job_type, queue, 'running', arguments, priority, attempts + 1, max_retries,
        last_error, created_at, ripe_at, claimed_at, NULL, cancelled_at, NULL, progress,
        progress_message
 FROM job_running
 WHERE id = :job_id )
UNION ALL
(SELECT id, job_type, queue, 'failed', arguments, priority, attempts, max_retries, last_error,
        created_at, NULL, started_at, died_at, NULL, NULL, NULL, NULL
 FROM job_dead
 WHERE id = :job_id )
UNION ALL
(SELECT id, job_type, queue, state, arguments, NULL, attempts, NULL, last_error, created_at,
        NULL, started_at, finished_at, CASE WHEN state = 'cancelled' THEN finished_at END, result,
        NULL, NULL
 FROM job_done
 WHERE id = :job_id )
UNION ALL
(SELECT f.job_id, f.job_type, f.queue, 'waiting', f.arguments, f.priority, 0, f.max_retries,
        NULL, f.created_at, f.ripe_at, NULL, NULL, NULL, NULL, NULL, NULL
 FROM job_waiting AS w JOIN job_flow AS f USING (job_id)
 WHERE w.job_id = :job_id )) AS j LIMIT 1;

-- name: job_attempts
-- Job :job_id's failed attempts, in order (kept as long as finished jobs are).
SELECT attempt, worker_id, error, traceback, failed_at FROM job_attempt
WHERE job_id = :job_id
ORDER BY failed_at, attempt;

-- name: job_list
-- A page of jobs, newest (highest id) first, below id :after (NULL: from the newest), of queue
-- :queue, type :job_type, state :state, arguments containing :arguments (JSON containment, @>)
-- (each NULL: any). Each table gives its own page first,
-- through its index on id; a table that cannot hold :state is not read at all (the condition on
-- the parameter alone is a one-time filter), so a search for failed jobs never walks job_done.
SELECT * FROM (
(SELECT id, job_type, queue, CASE WHEN ripe_at > :now THEN 'scheduled' ELSE 'queued' END AS state, arguments, priority, attempts, max_retries,
        last_error, created_at, ripe_at, NULL::timestamptz AS started_at,
        NULL::timestamptz AS finished_at, NULL::timestamptz AS cancelled_at, NULL::jsonb AS result,
        NULL::real AS progress, NULL::text AS progress_message
 FROM job
 WHERE id < coalesce(:after::bigint, 9223372036854775807) AND (:queue::text IS NULL OR queue = :queue) AND (:job_type::text IS NULL OR job_type = :job_type) AND (:arguments::jsonb IS NULL OR arguments @> :arguments) AND (:state::text IS NULL OR :state = ANY('{queued,scheduled}'::text[])) AND (:state::text IS NULL OR CASE WHEN ripe_at > :now THEN 'scheduled' ELSE 'queued' END = :state) ORDER BY id DESC LIMIT :limit)
UNION ALL
(SELECT id, job_type, queue, 'running', arguments, priority, attempts + 1, max_retries,
        last_error, created_at, ripe_at, claimed_at, NULL, cancelled_at, NULL, progress,
        progress_message
 FROM job_running
 WHERE id < coalesce(:after::bigint, 9223372036854775807) AND (:queue::text IS NULL OR queue = :queue) AND (:job_type::text IS NULL OR job_type = :job_type) AND (:arguments::jsonb IS NULL OR arguments @> :arguments) AND (:state::text IS NULL OR :state = ANY('{running}'::text[])) AND (:state::text IS NULL OR 'running' = :state) ORDER BY id DESC LIMIT :limit)
UNION ALL
(SELECT id, job_type, queue, 'failed', arguments, priority, attempts, max_retries, last_error,
        created_at, NULL, started_at, died_at, NULL, NULL, NULL, NULL
 FROM job_dead
 WHERE id < coalesce(:after::bigint, 9223372036854775807) AND (:queue::text IS NULL OR queue = :queue) AND (:job_type::text IS NULL OR job_type = :job_type) AND (:arguments::jsonb IS NULL OR arguments @> :arguments) AND (:state::text IS NULL OR :state = ANY('{failed}'::text[])) AND (:state::text IS NULL OR 'failed' = :state) ORDER BY id DESC LIMIT :limit)
UNION ALL
(SELECT id, job_type, queue, state, arguments, NULL, attempts, NULL, last_error, created_at,
        NULL, started_at, finished_at, CASE WHEN state = 'cancelled' THEN finished_at END, result,
        NULL, NULL
 FROM job_done
 WHERE id < coalesce(:after::bigint, 9223372036854775807) AND (:queue::text IS NULL OR queue = :queue) AND (:job_type::text IS NULL OR job_type = :job_type) AND (:arguments::jsonb IS NULL OR arguments @> :arguments) AND (:state::text IS NULL OR :state = ANY('{succeeded,cancelled}'::text[])) AND (:state::text IS NULL OR state = :state) ORDER BY id DESC LIMIT :limit)
UNION ALL
(SELECT f.job_id, f.job_type, f.queue, 'waiting', f.arguments, f.priority, 0, f.max_retries,
        NULL, f.created_at, f.ripe_at, NULL, NULL, NULL, NULL, NULL, NULL
 FROM job_waiting AS w JOIN job_flow AS f USING (job_id)
 WHERE w.job_id < coalesce(:after::bigint, 9223372036854775807) AND (:queue::text IS NULL OR f.queue = :queue) AND (:job_type::text IS NULL OR f.job_type = :job_type) AND (:arguments::jsonb IS NULL OR f.arguments @> :arguments) AND (:state::text IS NULL OR :state = 'waiting') ORDER BY w.job_id DESC LIMIT :limit)) AS j
ORDER BY id DESC
LIMIT :limit;

-- name: job_state_of
-- Where each of jobs :job_ids is: a row for each one some table holds (none for a job discarded
-- from the dead letter, or finished longer ago than the retention), its state `queued` (ripe or
-- not), `waiting` (for other jobs), `running`, `failed` (dead), `succeeded` or `cancelled`, its
-- attempts ended (a running one is not counted) and its last error.
SELECT id, 'queued' AS state, attempts, last_error FROM job WHERE id = ANY(:job_ids::bigint[])
UNION ALL
SELECT id, 'running', attempts, last_error FROM job_running WHERE id = ANY(:job_ids::bigint[])
UNION ALL
SELECT id, 'failed', attempts, last_error FROM job_dead WHERE id = ANY(:job_ids::bigint[])
UNION ALL
SELECT id, state, attempts, last_error FROM job_done WHERE id = ANY(:job_ids::bigint[])
UNION ALL
SELECT job_id, 'waiting', 0, NULL FROM job_waiting WHERE job_id = ANY(:job_ids::bigint[]);
