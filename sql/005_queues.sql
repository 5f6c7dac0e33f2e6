-- Named queues and their flow control: pause, concurrency limits (per queue, per key) and rate
-- limits (starts per period, per queue, per key). A worker serves a set of queues, each with
-- its own slots; the claim honours the limits (jobq.queue.sql `job_claim`).

ALTER TABLE job
    ADD COLUMN queue text NOT NULL DEFAULT 'default'
        CHECK (queue ~ '^[a-z][a-z0-9_.:-]{0,62}$'),
    ADD COLUMN concurrency_key text CHECK (concurrency_key <> '' AND length(concurrency_key) <= 200);
ALTER TABLE job_running
    ADD COLUMN queue text NOT NULL DEFAULT 'default',
    ADD COLUMN concurrency_key text;
ALTER TABLE job_dead
    ADD COLUMN queue text NOT NULL DEFAULT 'default',
    ADD COLUMN concurrency_key text;

-- The claim walks one queue's line: highest priority first, then the earliest ripe_at.
DROP INDEX job_claim_idx;
CREATE INDEX job_claim_idx ON job (queue, priority DESC, ripe_at);
-- The next ripe_at of a queue, for an idle worker's timer.
DROP INDEX job_ripe_at_idx;
CREATE INDEX job_ripe_at_idx ON job (queue, ripe_at);
-- Queues with per-key limits are claimed key by key: one probe finds the next key, one more
-- its ripe jobs, so jobs held back by a full key are never read.
CREATE INDEX job_key_idx ON job (queue, concurrency_key, ripe_at);

-- A queue's shared state: paused or not, and its limits (NULL: none). Workers write the limits
-- declared in code when they start (jobq.queue.registry); pause and resume come from operators.
CREATE TABLE job_queue (
    id                    integer GENERATED ALWAYS AS IDENTITY UNIQUE,
    name                  text PRIMARY KEY CHECK (name ~ '^[a-z][a-z0-9_.:-]{0,62}$'),
    paused                boolean NOT NULL DEFAULT false,
    -- at most this many of the queue's jobs in job_running, across all workers
    max_running           integer CHECK (max_running > 0),
    -- at most this many jobs of one concurrency_key in job_running
    max_running_per_key   integer CHECK (max_running_per_key > 0),
    -- at most rate_max_starts claims of the queue's jobs in any rate_period
    rate_max_starts       integer CHECK (rate_max_starts > 0),
    rate_period           interval CHECK (rate_period > interval '0'),
    -- the same, per concurrency_key
    key_rate_max_starts   integer CHECK (key_rate_max_starts > 0),
    key_rate_period       interval CHECK (key_rate_period > interval '0'),
    limited               boolean NOT NULL GENERATED ALWAYS AS (
        max_running IS NOT NULL OR max_running_per_key IS NOT NULL
        OR rate_max_starts IS NOT NULL OR key_rate_max_starts IS NOT NULL) STORED,
    per_key               boolean NOT NULL GENERATED ALWAYS AS (
        max_running_per_key IS NOT NULL OR key_rate_max_starts IS NOT NULL) STORED,
    CHECK ((rate_max_starts IS NULL) = (rate_period IS NULL)),
    CHECK ((key_rate_max_starts IS NULL) = (key_rate_period IS NULL))
);
INSERT INTO job_queue (name) VALUES ('default');

-- The recent claims of rate-limited queues ('' for the whole queue) and keys: the claim times
-- within the last `period`, oldest first. The claim counts them and appends its own. A claim's
-- time there is never before the last one's (see job_claimable), so each window only grows at
-- its end, and a claim that trims it forgets nothing a later claim could count.
CREATE TABLE job_rate (
    queue           text NOT NULL,
    concurrency_key text NOT NULL,
    period          interval NOT NULL,
    starts          timestamptz[] NOT NULL,
    PRIMARY KEY (queue, concurrency_key)
);

-- Which jobs of the queues with limits the claim may take (`id`), and the time each claim counts
-- as its start (`claimed_at`): the queues and their free slots (p_queues, p_slots), at p_now. The claims of a limited queue take turns (a transaction
-- lock per queue), and each reads what the ones before it committed: a volatile function's
-- statements each take a fresh snapshot, after the lock. So a limit is never exceeded however
-- many workers claim at once. The caller claims the returned ids in the same transaction.
--
-- A queue's budget is its free slots within its own limits; in a queue with per-key limits each
-- key gets its allowance within its own (taken in ripe_at order within a key), and the jobs of
-- every key compete for the budget by priority, then ripe_at.
--
-- A claim's start time in a rate window is p_now, or the window's last start if that is later:
-- a worker reads its clock before it waits for the queue's turn, so a claim that read it earlier
-- may come after one that read it later (and hosts' clocks differ a little). Taking the later
-- time keeps every window's starts in order, so the count is exact at every instant.
CREATE FUNCTION job_claimable(p_queues text[], p_slots integer[], p_now timestamptz)
RETURNS TABLE (id bigint, claimed_at timestamptz) LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    PERFORM pg_advisory_xact_lock(1785684594, q.id)
    FROM job_queue AS q WHERE q.name = ANY(p_queues) ORDER BY q.id;

    RETURN QUERY
    WITH RECURSIVE window_ AS (
        -- the queue-wide rate window, and the time of its claims now
        SELECT jq.name, greatest(p_now, w.starts[cardinality(w.starts)]) AS at, w.starts
        FROM unnest(p_queues) AS u(name) JOIN job_queue AS jq USING (name)
        LEFT JOIN job_rate AS w ON w.queue = jq.name AND w.concurrency_key = ''
    ), q AS (
        SELECT jq.*, wq.at, least(
                   u.free,
                   jq.max_running - (SELECT count(*) FROM job_running AS r WHERE r.queue = jq.name),
                   jq.rate_max_starts - (
                       SELECT count(*) FROM unnest(wq.starts) AS t WHERE t > wq.at - jq.rate_period)
               ) AS budget
        FROM unnest(p_queues, p_slots) AS u(name, free) JOIN job_queue AS jq USING (name)
        JOIN window_ AS wq ON wq.name = jq.name
        WHERE NOT jq.paused
    ), keys AS (
        -- the distinct keys queued in each per-key queue: one index probe per key
        SELECT q.name AS queue, (
                   SELECT j.concurrency_key FROM job AS j
                   WHERE j.queue = q.name AND j.concurrency_key IS NOT NULL
                   ORDER BY j.concurrency_key LIMIT 1) AS key
        FROM q WHERE q.per_key AND q.budget > 0
        UNION ALL
        SELECT k.queue, (
                   SELECT j.concurrency_key FROM job AS j
                   WHERE j.queue = k.queue AND j.concurrency_key > k.key
                   ORDER BY j.concurrency_key LIMIT 1)
        FROM keys AS k WHERE k.key IS NOT NULL
    ), held AS (
        SELECT r.queue, r.concurrency_key AS key, count(*) AS n FROM job_running AS r
        WHERE r.queue IN (SELECT name FROM q WHERE per_key) AND r.concurrency_key IS NOT NULL
        GROUP BY 1, 2
    ), allowance AS (
        SELECT k.queue, k.key, kw.at, least(
                   q.budget,
                   q.max_running_per_key - coalesce(h.n, 0),
                   q.key_rate_max_starts - (
                       SELECT count(*) FROM unnest(kw.starts) AS t
                       WHERE t > kw.at - q.key_rate_period)
               ) AS n
        FROM keys AS k JOIN q ON q.name = k.queue
        LEFT JOIN held AS h ON h.queue = k.queue AND h.key = k.key
        LEFT JOIN job_rate AS w ON w.queue = k.queue AND w.concurrency_key = k.key
        CROSS JOIN LATERAL (
            SELECT greatest(q.at, w.starts[cardinality(w.starts)]) AS at, w.starts) AS kw
        WHERE k.key IS NOT NULL
    ), candidates AS (
        SELECT a.queue, a.at, c.id, c.priority, c.ripe_at
        FROM allowance AS a CROSS JOIN LATERAL (
            SELECT j.id, j.priority, j.ripe_at FROM job AS j
            WHERE j.queue = a.queue AND j.concurrency_key = a.key AND j.ripe_at <= p_now
            ORDER BY j.ripe_at LIMIT greatest(a.n, 0)) AS c
        UNION ALL
        -- a per-key queue's jobs without a key: only the queue's own limits hold them
        SELECT q.name, q.at, c.id, c.priority, c.ripe_at
        FROM q CROSS JOIN LATERAL (
            SELECT j.id, j.priority, j.ripe_at FROM job AS j
            WHERE j.queue = q.name AND j.concurrency_key IS NULL AND j.ripe_at <= p_now
            ORDER BY j.ripe_at LIMIT greatest(q.budget, 0)) AS c
        WHERE q.per_key
        UNION ALL
        -- a queue with queue-wide limits only: its line
        SELECT q.name, q.at, c.id, c.priority, c.ripe_at
        FROM q CROSS JOIN LATERAL (
            SELECT j.id, j.priority, j.ripe_at FROM job AS j
            WHERE j.queue = q.name AND j.ripe_at <= p_now
            ORDER BY j.priority DESC, j.ripe_at LIMIT greatest(q.budget, 0)) AS c
        WHERE NOT q.per_key
    ), ranked AS (
        SELECT c.id, c.queue, c.at,
               row_number() OVER (PARTITION BY c.queue ORDER BY c.priority DESC, c.ripe_at) AS rank
        FROM candidates AS c
    ), chosen AS (
        SELECT r.id, r.at FROM ranked AS r JOIN q ON q.name = r.queue WHERE r.rank <= q.budget
    )
    SELECT j.id, c.at FROM job AS j JOIN chosen AS c ON c.id = j.id
    FOR UPDATE OF j SKIP LOCKED;
END $$;

-- Where a job is now, whichever table holds it (now with its queue).
CREATE OR REPLACE VIEW job_state AS
    SELECT id, job_type, 'queued'::text AS state, attempts, last_error, queue FROM job
    UNION ALL
    SELECT id, job_type, 'running', attempts, last_error, queue FROM job_running
    UNION ALL
    SELECT id, job_type, 'dead', attempts, last_error, queue FROM job_dead;
