-- name: job_flow_enqueue
-- The jobs of a workflow, a batch or sequences, enqueued at once (job_flow_enqueue: the arrays
-- hold one element per job; job :edge_jobs[i] waits for job :edge_deps[i], 1-based). Returns
-- `workflow_id` (NULL: none), `job_ids` in the order of the arrays, and `num_waiting`.
SELECT * FROM job_flow_enqueue(
    :workflow_name::text, :new_workflow::boolean, :now::timestamptz, :job_types::text[],
    :arguments::text[], :ripe_ats::timestamptz[], :priorities::smallint[],
    :max_retries::integer[], :queues::text[], :concurrency_keys::text[], :steps::text[],
    :sequence_keys::text[], :cancels::boolean[], :edge_jobs::integer[], :edge_deps::integer[]);

-- name: job_flow_cancel
-- Jobs :job_ids, cancelled one by one at :now (job_flow_cancel): the waiting ones end
-- cancelled; the dependents of all are told. Returns the ones that waited (id, queue, job_type).
SELECT * FROM job_flow_cancel(:job_ids::bigint[], :now::timestamptz);

-- name: job_workflow_cancel
-- Workflow :workflow_id cancelled at :now (job_workflow_cancel): one row per job cancelled, with
-- where it was (`was`).
SELECT * FROM job_workflow_cancel(:workflow_id::bigint, :now::timestamptz);

-- name: job_workflow_retry
-- Workflow :workflow_id's failed and cancelled jobs made again at :now (job_workflow_retry): one
-- row per job, `waiting` or queued.
SELECT * FROM job_workflow_retry(:workflow_id::bigint, :now::timestamptz);

-- name: job_workflow_get
-- Workflow :workflow_id, with its jobs counted by the outcome their dependents saw
-- (`unfinished`: not ended yet); no row for an unknown (or forgotten) workflow.
SELECT w.id, w.name, w.num_jobs, w.created_at, w.cancelled_at, w.finished_at, c.*
FROM job_workflow AS w
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE f.outcome = 'succeeded') AS succeeded,
           count(*) FILTER (WHERE f.outcome = 'failed') AS failed,
           count(*) FILTER (WHERE f.outcome = 'cancelled') AS cancelled,
           count(*) FILTER (WHERE f.outcome IS NULL) AS unfinished
    FROM job_flow AS f WHERE f.workflow_id = w.id) AS c
WHERE w.id = :workflow_id;

-- name: job_workflow_list
-- A page of workflows, newest first, below id :after (NULL: from the newest), counted as
-- job_workflow_get counts them; :unfinished true: only those with a job not ended.
SELECT w.id, w.name, w.num_jobs, w.created_at, w.cancelled_at, w.finished_at, c.*
FROM job_workflow AS w
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE f.outcome = 'succeeded') AS succeeded,
           count(*) FILTER (WHERE f.outcome = 'failed') AS failed,
           count(*) FILTER (WHERE f.outcome = 'cancelled') AS cancelled,
           count(*) FILTER (WHERE f.outcome IS NULL) AS unfinished
    FROM job_flow AS f WHERE f.workflow_id = w.id) AS c
WHERE w.id < coalesce(:after::bigint, 9223372036854775807)
  AND (NOT :unfinished::boolean OR w.finished_at IS NULL)
ORDER BY w.id DESC
LIMIT :limit;

-- name: job_workflow_steps
-- Up to :limit jobs of workflow :workflow_id with ids above :after, by id: each with where it is
-- at :now (waiting, scheduled, queued, running, failed, succeeded, cancelled: the tables say;
-- the outcome its dependents saw once no table holds it), its progress while it runs, whether
-- it is being cancelled, and the jobs it waits for.
SELECT f.job_id, f.step, f.job_type, f.queue, f.sequence_key, f.created_at,
       CASE WHEN EXISTS (SELECT FROM job_waiting AS w WHERE w.job_id = f.job_id) THEN 'waiting'
            WHEN r.id IS NOT NULL THEN 'running'
            ELSE coalesce(
                (SELECT CASE WHEN q.ripe_at > :now THEN 'scheduled' ELSE 'queued' END
                 FROM job AS q WHERE q.id = f.job_id),
                (SELECT 'failed' FROM job_dead AS d WHERE d.id = f.job_id),
                (SELECT dn.state FROM job_done AS dn WHERE dn.id = f.job_id LIMIT 1),
                f.outcome, 'queued') END AS state,
       r.progress, r.progress_message, r.cancelled_at IS NOT NULL AS cancelling,
       ARRAY(SELECT d.depends_on FROM job_dependency AS d WHERE d.job_id = f.job_id
             ORDER BY d.depends_on) AS depends_on
FROM job_flow AS f
LEFT JOIN LATERAL (
    SELECT jr.id, jr.progress, jr.progress_message, jr.cancelled_at
    FROM job_running AS jr WHERE jr.id = f.job_id) AS r ON true
WHERE f.workflow_id = :workflow_id AND f.job_id > :after
ORDER BY f.job_id
LIMIT :limit;

-- name: job_flow_dependencies
-- The jobs that job :job_id waits (or waited) for, by id: each one's step name, job type, the
-- outcome its dependents saw (NULL: not ended) and, when it succeeded, its result while
-- job_done keeps it (retention on).
SELECT d.depends_on AS job_id, f.step, f.job_type, f.outcome,
       (SELECT dn.result FROM job_done AS dn
        WHERE dn.id = d.depends_on AND dn.state = 'succeeded' LIMIT 1) AS result
FROM job_dependency AS d
LEFT JOIN LATERAL (
    SELECT jf.step, jf.job_type, jf.outcome FROM job_flow AS jf WHERE jf.job_id = d.depends_on
) AS f ON true
WHERE d.job_id = :job_id
ORDER BY d.depends_on;

-- name: job_flow_of
-- The workflow and step of job :job_id, or no row (it is in none).
SELECT workflow_id, step, sequence_key FROM job_flow WHERE job_id = :job_id;

-- name: job_progress_set
-- Running job :job_id, run by worker :worker_id, reports :progress (0 to 1, NULL: unknown) and
-- :message at :now, in place; those awaiting it are told (NOTIFY jobq_done: they look again).
-- Returns 1, or 0 when the job is not running there (it ended, or was rescued).
WITH reported AS (
    UPDATE job_running
    SET progress = :progress, progress_message = :message, progress_at = :now
    WHERE id = :job_id AND worker_id = :worker_id
    RETURNING id, awaited
)
SELECT count(*) FROM reported
WHERE (SELECT count(pg_notify('jobq_done', id::text)) FROM reported WHERE awaited) >= 0;

-- name: job_waiting_await
-- Someone awaits waiting job :job_id's end: mark it (it carries the mark into `job`). Returns 1,
-- or 0 when it does not wait.
WITH marked AS (
    UPDATE job_waiting SET awaited = true WHERE job_id = :job_id RETURNING job_id
)
SELECT count(*) FROM marked;

-- name: job_workflow_seen_finished
-- Stamp :now as `finished_at` on the workflows whose every job has ended; returns how many.
WITH seen AS (
    UPDATE job_workflow AS w SET finished_at = :now
    WHERE w.finished_at IS NULL
      AND NOT EXISTS (SELECT FROM job_flow AS f WHERE f.workflow_id = w.id AND f.outcome IS NULL)
    RETURNING 1
)
SELECT count(*) FROM seen;

-- name: job_workflow_prune
-- Forget up to :batch workflows finished before :cutoff, with their jobs' job_flow rows and
-- dependencies (the jobs themselves are pruned with job_done); returns how many.
WITH gone AS (
    DELETE FROM job_workflow WHERE id = ANY(ARRAY(
        SELECT id FROM job_workflow WHERE finished_at < :cutoff ORDER BY finished_at
        LIMIT :batch))
    RETURNING id
), flows AS (
    DELETE FROM job_flow WHERE workflow_id IN (SELECT id FROM gone) RETURNING job_id
), edges AS (
    DELETE FROM job_dependency WHERE job_id IN (SELECT job_id FROM flows)
)
SELECT count(*) FROM gone;

-- name: job_sequence_prune
-- Forget up to :batch sequences whose last job has ended (the next enqueue of the key starts
-- it afresh), then up to :batch ended jobs of sequences outside workflows that are no
-- sequence's last, with their dependencies; returns how many rows went. A sequence that an
-- enqueue holds is kept: the delete waits for it, then finds its new last job (which this
-- statement does not see) unended.
WITH sequences AS (
    DELETE FROM job_sequence AS s
    WHERE s.key = ANY(ARRAY(
              SELECT q.key FROM job_sequence AS q JOIN job_flow AS f ON f.job_id = q.last_job_id
              WHERE f.outcome IS NOT NULL LIMIT :batch))
      AND EXISTS (SELECT FROM job_flow AS f WHERE f.job_id = s.last_job_id
                  AND f.outcome IS NOT NULL)
    RETURNING s.key
), flows AS (
    DELETE FROM job_flow AS f WHERE f.job_id = ANY(ARRAY(
        SELECT l.job_id FROM job_flow AS l
        WHERE l.workflow_id IS NULL AND l.outcome IS NOT NULL
          AND NOT EXISTS (SELECT FROM job_sequence AS q WHERE q.last_job_id = l.job_id)
        LIMIT :batch))
    RETURNING f.job_id
), edges AS (
    DELETE FROM job_dependency AS d
    WHERE d.job_id IN (SELECT job_id FROM flows) OR d.depends_on IN (SELECT job_id FROM flows)
)
SELECT (SELECT count(*) FROM sequences) + (SELECT count(*) FROM flows);

-- name: job_flow_counts
-- For the metrics: the jobs waiting (counted up to a million), and the workflows not seen
-- finished (job_workflow_open_idx).
SELECT (SELECT count(*) FROM (SELECT FROM job_waiting LIMIT 1000000) AS w) AS waiting,
       (SELECT count(*) FROM job_workflow WHERE finished_at IS NULL) AS open_workflows;
