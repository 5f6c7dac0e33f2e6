-- Workflows, batches and sequences (jobq.queue.flow), the progress of running jobs, and the
-- exports rendered in parts (a batch).

-- `flow`: a job of a workflow or a sequence (never deduplicated). Checked without holding the
-- table's lock through a scan of it (NOT VALID, then VALIDATE).
ALTER TABLE job DROP CONSTRAINT job_unique_mode_check;
ALTER TABLE job ADD CONSTRAINT job_unique_mode_check
    CHECK (unique_mode IN ('none', 'queued', 'active', 'period', 'flow')) NOT VALID;
ALTER TABLE job VALIDATE CONSTRAINT job_unique_mode_check;

-- A running job's last progress report (jobq.queue.progress): stored in place, one row per job.
ALTER TABLE job_running ADD COLUMN progress real CHECK (progress BETWEEN 0 AND 1);
ALTER TABLE job_running ADD COLUMN progress_message text CHECK (length(progress_message) <= 200);
ALTER TABLE job_running ADD COLUMN progress_at timestamptz;

CREATE TABLE job_workflow (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name         text CHECK (length(name) BETWEEN 1 AND 200),
    num_jobs     integer     NOT NULL CHECK (num_jobs > 0),
    created_at   timestamptz NOT NULL,
    cancelled_at timestamptz,
    finished_at  timestamptz
);
CREATE INDEX job_workflow_open_idx ON job_workflow (id) WHERE finished_at IS NULL;
CREATE INDEX job_workflow_finished_idx ON job_workflow (finished_at);

CREATE TABLE job_flow (
    job_id          bigint      PRIMARY KEY,
    workflow_id     bigint,
    step            text CHECK (length(step) BETWEEN 1 AND 200),
    sequence_key    text CHECK (sequence_key <> '' AND length(sequence_key) <= 200),
    job_type        text        NOT NULL,
    arguments       jsonb       NOT NULL,
    ripe_at         timestamptz NOT NULL,
    priority        smallint    NOT NULL,
    max_retries     integer     NOT NULL,
    queue           text        NOT NULL,
    concurrency_key text,
    created_at      timestamptz NOT NULL,
    outcome         text CHECK (outcome IN ('succeeded', 'failed', 'cancelled'))
)
WITH (fillfactor = 50);
CREATE INDEX job_flow_workflow_idx ON job_flow (workflow_id, job_id);
CREATE UNIQUE INDEX job_flow_step_key ON job_flow (workflow_id, step) WHERE step IS NOT NULL;

CREATE TABLE job_dependency (
    depends_on bigint  NOT NULL,
    job_id     bigint  NOT NULL,
    cancels    boolean NOT NULL,
    PRIMARY KEY (depends_on, job_id)
);
CREATE INDEX job_dependency_job_idx ON job_dependency (job_id);

CREATE TABLE job_waiting (
    job_id    bigint  PRIMARY KEY,
    remaining integer NOT NULL CHECK (remaining >= 0),
    awaited   boolean NOT NULL DEFAULT false
)
WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);

CREATE TABLE job_sequence (
    key         text   PRIMARY KEY,
    last_job_id bigint NOT NULL
);
CREATE INDEX job_sequence_last_idx ON job_sequence (last_job_id);

CREATE OR REPLACE VIEW job_state AS
    SELECT id, job_type, 'queued'::text AS state, attempts, last_error, queue FROM job
    UNION ALL
    SELECT id, job_type, 'running', attempts, last_error, queue FROM job_running
    UNION ALL
    SELECT id, job_type, 'dead', attempts, last_error, queue FROM job_dead
    UNION ALL
    SELECT id, job_type, state, attempts, last_error, queue FROM job_done
    UNION ALL
    SELECT w.job_id, f.job_type, 'waiting', 0, NULL, f.queue
    FROM job_waiting AS w JOIN job_flow AS f USING (job_id);

ALTER TABLE exports ADD COLUMN num_parts integer NOT NULL DEFAULT 0;

CREATE TABLE export_parts (
    export_id bigint  NOT NULL REFERENCES exports (id) ON DELETE CASCADE,
    part      integer NOT NULL,
    content   text    NOT NULL,
    PRIMARY KEY (export_id, part)
);
