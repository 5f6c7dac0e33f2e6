-- Each failed attempt's error and traceback (bounded), kept `JOBQ_RETENTION_S` like finished
-- jobs: partitioned by the UTC day it failed, the same pruner making and dropping the days'
-- partitions (jobq.queue.maintenance). Written by the statements that record a failure (a
-- retry, a burial, a rescue): a job that succeeds the first time writes nothing here.
CREATE TABLE job_attempt (
    job_id    bigint      NOT NULL,
    attempt   integer     NOT NULL,
    worker_id integer,
    error     text,
    traceback text,
    failed_at timestamptz NOT NULL
) PARTITION BY RANGE (failed_at);

CREATE INDEX job_attempt_job_idx ON job_attempt (job_id);
CREATE TABLE job_attempt_default PARTITION OF job_attempt DEFAULT;
