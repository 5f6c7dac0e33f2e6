-- Metrics (jobq.queue.metrics, served at /metrics by jobq.api.metrics) and trace contexts
-- (jobq.tracing).
--
-- Every process counts its job events and timings in memory and adds them here about once a
-- second (only when it has something to add), so the cumulative counts are the sums of every
-- process's, wherever it runs. The rows are few (queue x job type x event) and updated in
-- place: fillfactor leaves room for HOT updates, which vacuum cheaply.

-- Cumulative counts of job events per queue and job type, across every process.
CREATE TABLE job_counter (
    queue    text   NOT NULL,
    job_type text   NOT NULL,
    event    text   NOT NULL CHECK (event IN ('enqueued', 'started', 'succeeded', 'retried',
                                              'failed', 'cancelled', 'snoozed')),
    count    bigint NOT NULL CHECK (count >= 0),
    PRIMARY KEY (queue, job_type, event)
) WITH (fillfactor = 50);

-- Cumulative histograms of timings (seconds) per queue and job type: `buckets[i]` counts the
-- observations in (bounds[i-1], bounds[i]] (not cumulative), the last one those above every
-- bound (+Inf); `sum` is their total. New bounds (a new release) start the row afresh.
CREATE TABLE job_histogram (
    queue    text     NOT NULL,
    job_type text     NOT NULL,
    metric   text     NOT NULL CHECK (metric IN ('pickup_lag', 'run_time')),
    bounds   float8[] NOT NULL,
    buckets  bigint[] NOT NULL,
    sum      float8   NOT NULL,
    PRIMARY KEY (queue, job_type, metric)
) WITH (fillfactor = 50);

-- The queue depths, counted every few seconds by one process (the scrape reads them instead
-- of counting a big table): per queue, ripe and scheduled jobs, and the ripe ones that the
-- queue's concurrency limits hold back (its max_running, or their key's max_running_per_key,
-- reached), as of `taken_at`; `took_s`: how long the count took (the next waits 20 times as
-- long at least).
CREATE TABLE job_depth (
    queue     text        PRIMARY KEY,
    ripe      bigint      NOT NULL,
    scheduled bigint      NOT NULL,
    held      bigint      NOT NULL,
    taken_at  timestamptz NOT NULL,
    took_s    float8      NOT NULL DEFAULT 0
);

-- The W3C trace context (`traceparent`) of the span that enqueued a job, written by the
-- enqueue only while tracing; read in one batch per claim, forgotten after the retention.
-- A side table rather than a column of `job`: no statement that moves a job carries it.
CREATE TABLE job_trace (
    job_id      bigint      PRIMARY KEY,
    traceparent text        NOT NULL,
    created_at  timestamptz NOT NULL
);
CREATE INDEX job_trace_created_idx ON job_trace (created_at);
