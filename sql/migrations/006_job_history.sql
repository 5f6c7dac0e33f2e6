-- The queue's history for the dashboard's charts (jobq.queue.leader.history): per queue and
-- minute, the cumulative event counts and timing histograms as they stood then, written by the
-- leader, kept a day and a bit.
CREATE TABLE job_history (
    queue          text        NOT NULL,
    at             timestamptz NOT NULL,
    enqueued       bigint      NOT NULL,
    succeeded      bigint      NOT NULL,
    failed         bigint      NOT NULL,
    pickup_buckets bigint[]    NOT NULL,
    run_buckets    bigint[]    NOT NULL,
    PRIMARY KEY (queue, at)
);
CREATE INDEX job_history_at_idx ON job_history (at);
