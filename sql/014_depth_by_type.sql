-- The queue at size (10 million jobs): what GET /jobs/stats and `python -m jobq check` read
-- without counting `job`.

-- The depth snapshot (job_depth, taken by one worker every few seconds) per job type too, from
-- the same single pass over `job`: ripe and scheduled jobs per queue and job type, as of
-- `taken_at`. /jobs/stats reads it once `job` holds more jobs than it counts live.
CREATE TABLE job_type_depth (
    queue     text        NOT NULL,
    job_type  text        NOT NULL,
    ripe      bigint      NOT NULL,
    scheduled bigint      NOT NULL,
    taken_at  timestamptz NOT NULL,
    PRIMARY KEY (queue, job_type)
);

-- Queued jobs past their last attempt (an invariant's violation: they belong in job_dead). The
-- index is empty while the invariant holds, so the check finds them without reading `job`;
-- an enqueue only evaluates its predicate.
CREATE INDEX job_over_attempts_idx ON job (id) WHERE attempts > max_retries;
