-- When a finished job's last attempt started (its claim), so that its run time is
-- finished_at - started_at: on job_done (NULL for a job cancelled before it ran) and on the dead
-- letter. Rows finished before this migration have none.
ALTER TABLE job_done ADD COLUMN started_at timestamptz;
ALTER TABLE job_dead ADD COLUMN started_at timestamptz;
