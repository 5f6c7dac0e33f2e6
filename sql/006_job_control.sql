-- Job control: cancel, results and waiting, finished jobs kept for a while (jobq.queue.control).

-- Someone waits for the job's end (`wait_for`, `?wait=`): the statement that ends it notifies
-- `jobq_done` with its id. A flag on the row rather than a table of waiters: the statement that
-- ends a job locks its row, so it reads a flag set just before (a waiter's row in another table
-- could be missed by its snapshot).
ALTER TABLE job ADD COLUMN awaited boolean NOT NULL DEFAULT false;
ALTER TABLE job_running
    ADD COLUMN awaited boolean NOT NULL DEFAULT false,
    -- A cancel of a running job marks it; whatever outcome its worker records then, the job
    -- ends `cancelled` (its result is dropped, it never goes back to the queue). Its row stays
    -- until then, so the concurrency limits count the job while its handler may still run.
    ADD COLUMN cancelled_at timestamptz;

-- Finished jobs: succeeded, or cancelled (failed ones are in the dead letter, job_dead), kept
-- `JOBQ_RETENTION_S` and then dropped a day at a time: one partition per UTC day of
-- `finished_at`, created ahead and dropped whole by the pruner (jobq.queue.retention), so
-- pruning never deletes rows one by one nor leaves dead tuples. The default partition takes the
-- rows of days without a partition of their own (clocks far off, or a pruner that has not run);
-- the pruner deletes its old rows in small batches.
CREATE TABLE job_done (
    id          bigint      NOT NULL,
    job_type    text        NOT NULL,
    queue       text        NOT NULL,
    arguments   jsonb       NOT NULL,
    state       text        NOT NULL CHECK (state IN ('succeeded', 'cancelled')),
    -- the attempts that ran (a job cancelled before it ran has 0)
    attempts    integer     NOT NULL,
    last_error  text,
    result      jsonb,
    created_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL
) PARTITION BY RANGE (finished_at);

CREATE INDEX job_done_id_idx ON job_done (id);
CREATE TABLE job_done_default PARTITION OF job_done DEFAULT;

-- Where a job is now, whichever table holds it.
CREATE OR REPLACE VIEW job_state AS
    SELECT id, job_type, 'queued'::text AS state, attempts, last_error, queue FROM job
    UNION ALL
    SELECT id, job_type, 'running', attempts, last_error, queue FROM job_running
    UNION ALL
    SELECT id, job_type, 'dead', attempts, last_error, queue FROM job_dead
    UNION ALL
    SELECT id, job_type, state, attempts, last_error, queue FROM job_done;
