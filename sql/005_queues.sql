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
-- The claim of a queue with per-key limits walks its keys when the head of its line is held
-- back (job_claimable): one probe finds the next key, one more its first ripe jobs, so jobs
-- held back by a full key are never read.
CREATE INDEX job_key_idx ON job (queue, concurrency_key, priority DESC, ripe_at);

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

-- The starts of rate-limited queues: one row per claim and window, a window being a whole queue
-- ('' as concurrency_key) or one key of it; `n` starts at `at`. Every claim of a rate-limited
-- queue writes its '' row (all its starts), whose `seq` is the queue's starts so far, this
-- claim's included: the queue's starts within a period are the last '' row's seq minus the seq
-- before the period's first '' row, two index probes. A key's rows carry their claim's seq and
-- are summed: within a period they are at most the key's rate. A claim's `at` is never before
-- the queue's last one (job_claimable), so rows are in the same order by `at` as by `seq`, and
-- pruning the rows older than every period forgets nothing a claim counts.
CREATE TABLE job_rate (
    queue           text NOT NULL,
    concurrency_key text NOT NULL,
    at              timestamptz NOT NULL,
    seq             bigint NOT NULL,
    n               integer NOT NULL CHECK (n > 0),
    PRIMARY KEY (queue, concurrency_key, at, seq)
);

-- The starts of queue p_queue after p_since, given the seq of its last claim (p_seq): the
-- window's first '' row after p_since is one index probe. (PL/pgSQL: its plan is kept.)
CREATE FUNCTION job_rate_queue_starts(p_queue text, p_seq bigint, p_since timestamptz)
RETURNS bigint LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN coalesce((
        SELECT p_seq - r.seq + r.n FROM job_rate AS r
        WHERE r.queue = p_queue AND r.concurrency_key = '' AND r.at > p_since
        ORDER BY r.at, r.seq LIMIT 1), 0);
END $$;

-- How many more jobs of each key of p_keys queue `q` may start at p_at: within its running limit
-- per key and its rate per key (NULL: neither limit).
CREATE FUNCTION job_key_allowances(q job_queue, p_keys text[], p_at timestamptz)
RETURNS TABLE (key text, n bigint) LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT k.key, least(q.max_running_per_key - coalesce(h.n, 0),
                        q.key_rate_max_starts - coalesce(w.n, 0))
    FROM unnest(p_keys) AS k(key)
    LEFT JOIN (
        SELECT r.concurrency_key, count(*) AS n FROM job_running AS r
        WHERE r.queue = q.name AND r.concurrency_key = ANY(p_keys) GROUP BY 1
    ) AS h ON h.concurrency_key = k.key
    LEFT JOIN LATERAL (
        SELECT sum(r.n) AS n FROM job_rate AS r
        WHERE r.queue = q.name AND r.concurrency_key = k.key
          AND r.at > p_at - q.key_rate_period
    ) AS w ON q.key_rate_max_starts IS NOT NULL;
END $$;

-- Which jobs of the queues with limits the claim may take (`id`), and the time each claim counts
-- as its start (`claimed_at`): the queues and their free slots (p_queues, p_slots), at p_now.
-- The chosen jobs are locked and their starts written to the rate windows: the caller claims
-- every returned id in the same transaction.
--
-- The claims of a limited queue take turns (a transaction lock per queue, taken in a fixed
-- order), and each reads what the ones before it committed: a volatile function's statements
-- each take a fresh snapshot, after the lock. So a limit is never exceeded however many workers
-- claim at once.
--
-- A queue's budget is its free slots within its own limits. In a queue with per-key limits the
-- budget goes to the first jobs of its line (priority, then ripe_at) whose key has room: each
-- key's allowance goes to its own first jobs. When no key can reach its limits in this claim
-- (the whole queue's running jobs, or starts within the key period, plus the budget stay within
-- them), the claim takes its line as a queue without per-key limits does. Otherwise it reads the
-- head of the line (four times the budget); only when that head is held back too much to fill
-- the budget does it walk the queue's keys (job_key_idx), reading each key's allowance of jobs.
--
-- A claim's start time in the rate windows is p_now, or the queue's last claim's if that is
-- later: a worker reads its clock before it waits for the queue's turn, so a claim that read it
-- earlier may come after one that read it later (and hosts' clocks differ a little). Taking the
-- later time keeps every window's starts in order, so the count is exact at every instant.
CREATE FUNCTION job_claimable(p_queues text[], p_slots integer[], p_now timestamptz)
RETURNS TABLE (id bigint, claimed_at timestamptz) LANGUAGE plpgsql VOLATILE
SET jit = off  -- a claim never waits for a compiler
AS $$
#variable_conflict use_column
DECLARE
    served record;
    q job_queue;
    rated boolean;
    v_at timestamptz;
    v_seq bigint;
    v_running bigint;
    v_budget integer;
    v_ids bigint[];
    v_head integer;
BEGIN
    FOR served IN
        SELECT jq.id, jq.name, u.free FROM unnest(p_queues, p_slots) AS u(name, free)
        JOIN job_queue AS jq USING (name) WHERE u.free > 0 ORDER BY jq.id
    LOOP
        PERFORM pg_advisory_xact_lock(1785684594, served.id);
        SELECT * INTO q FROM job_queue AS jq WHERE jq.name = served.name;
        CONTINUE WHEN q.paused;
        rated := q.rate_max_starts IS NOT NULL OR q.key_rate_max_starts IS NOT NULL;
        v_at := p_now;
        v_seq := 0;
        IF rated THEN
            SELECT greatest(p_now, r.at), r.seq INTO v_at, v_seq FROM job_rate AS r
            WHERE r.queue = q.name AND r.concurrency_key = ''
            ORDER BY r.at DESC, r.seq DESC LIMIT 1;
            v_at := coalesce(v_at, p_now);
            v_seq := coalesce(v_seq, 0);
        END IF;
        IF q.max_running IS NOT NULL OR q.max_running_per_key IS NOT NULL THEN
            v_running := (SELECT count(*) FROM job_running AS r WHERE r.queue = q.name);
        END IF;
        v_budget := least(
            served.free,
            q.max_running - v_running,
            q.rate_max_starts - CASE WHEN q.rate_max_starts IS NOT NULL THEN
                job_rate_queue_starts(q.name, v_seq, v_at - q.rate_period) END);
        CONTINUE WHEN v_budget <= 0;

        IF NOT q.per_key OR (
            v_running + v_budget > q.max_running_per_key
            OR job_rate_queue_starts(q.name, v_seq, v_at - q.key_rate_period) + v_budget
               > q.key_rate_max_starts
        ) IS NOT TRUE THEN
            v_ids := ARRAY(
                SELECT j.id FROM job AS j WHERE j.queue = q.name AND j.ripe_at <= p_now
                ORDER BY j.priority DESC, j.ripe_at LIMIT v_budget FOR UPDATE SKIP LOCKED);
        ELSE
            WITH head AS (
                SELECT h.id, h.concurrency_key AS key,
                       row_number() OVER (ORDER BY h.priority DESC, h.ripe_at) AS place
                FROM (SELECT j.id, j.concurrency_key, j.priority, j.ripe_at FROM job AS j
                      WHERE j.queue = q.name AND j.ripe_at <= p_now
                      ORDER BY j.priority DESC, j.ripe_at LIMIT 4 * v_budget) AS h
            ), ranked AS (
                SELECT h.*, row_number() OVER (PARTITION BY h.key ORDER BY h.place) AS nth
                FROM head AS h
            ), allowed AS (
                SELECT r.id FROM ranked AS r
                LEFT JOIN job_key_allowances(
                    q, ARRAY(SELECT DISTINCT key FROM head WHERE key IS NOT NULL), v_at
                ) AS a ON a.key = r.key
                WHERE r.key IS NULL OR a.n IS NULL OR r.nth <= a.n
                ORDER BY r.place LIMIT v_budget
            )
            SELECT ARRAY(SELECT allowed.id FROM allowed), (SELECT count(*) FROM head)
            INTO v_ids, v_head;
            IF cardinality(v_ids) < v_budget AND v_head = 4 * v_budget THEN
                -- the head is held back: each key's own first jobs, within its allowance
                v_ids := ARRAY(
                    WITH RECURSIVE keys AS (
                        SELECT (SELECT j.concurrency_key FROM job AS j
                                WHERE j.queue = q.name AND j.concurrency_key IS NOT NULL
                                ORDER BY j.concurrency_key LIMIT 1) AS key
                        UNION ALL
                        SELECT (SELECT j.concurrency_key FROM job AS j
                                WHERE j.queue = q.name AND j.concurrency_key > k.key
                                ORDER BY j.concurrency_key LIMIT 1)
                        FROM keys AS k WHERE k.key IS NOT NULL
                    ), candidates AS (
                        SELECT c.id, c.priority, c.ripe_at
                        FROM job_key_allowances(
                            q, ARRAY(SELECT key FROM keys WHERE key IS NOT NULL), v_at) AS a
                        CROSS JOIN LATERAL (
                            -- the key as a range, not `=`: with `=` the planner may walk the
                            -- queue's line (job_claim_idx) through a held key's many jobs
                            SELECT j.id, j.priority, j.ripe_at FROM job AS j
                            WHERE j.queue = q.name AND j.concurrency_key >= a.key
                              AND j.concurrency_key <= a.key AND j.ripe_at <= p_now
                            ORDER BY j.concurrency_key, j.priority DESC, j.ripe_at
                            LIMIT greatest(coalesce(a.n, v_budget), 0)) AS c
                        UNION ALL
                        (SELECT j.id, j.priority, j.ripe_at FROM job AS j
                         WHERE j.queue = q.name AND j.concurrency_key IS NULL
                           AND j.ripe_at <= p_now
                         ORDER BY j.concurrency_key, j.priority DESC, j.ripe_at LIMIT v_budget)
                    )
                    SELECT c.id FROM candidates AS c
                    ORDER BY c.priority DESC, c.ripe_at LIMIT v_budget);
            END IF;
            v_ids := ARRAY(
                SELECT j.id FROM job AS j WHERE j.id = ANY(v_ids) FOR UPDATE SKIP LOCKED);
        END IF;

        IF rated AND cardinality(v_ids) > 0 THEN
            INSERT INTO job_rate (queue, concurrency_key, at, seq, n)
            SELECT q.name, '', v_at, v_seq + cardinality(v_ids), cardinality(v_ids)
            UNION ALL
            SELECT q.name, j.concurrency_key, v_at, v_seq + cardinality(v_ids), count(*)
            FROM job AS j
            WHERE j.id = ANY(v_ids) AND j.concurrency_key IS NOT NULL
              AND q.key_rate_max_starts IS NOT NULL
            GROUP BY j.concurrency_key;
        END IF;
        RETURN QUERY SELECT u.id, v_at FROM unnest(v_ids) AS u(id);
    END LOOP;
END $$;

-- When a full rate window of the queues p_queues next lets one more job start after p_now (NULL
-- when none is full): when the first of its starts within the period leaves it.
CREATE FUNCTION job_rate_opens_at(p_queues text[], p_now timestamptz) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE windows AS (
        SELECT jq.name AS queue, (SELECT r.concurrency_key FROM job_rate AS r
                                  WHERE r.queue = jq.name
                                  ORDER BY r.concurrency_key LIMIT 1) AS key
        FROM job_queue AS jq
        WHERE jq.name = ANY(p_queues)
          AND (jq.rate_max_starts IS NOT NULL OR jq.key_rate_max_starts IS NOT NULL)
        UNION ALL
        SELECT w.queue, (SELECT r.concurrency_key FROM job_rate AS r
                         WHERE r.queue = w.queue AND r.concurrency_key > w.key
                         ORDER BY r.concurrency_key LIMIT 1)
        FROM windows AS w WHERE w.key IS NOT NULL
    )
    SELECT min(c.first_at + l.period)
    FROM windows AS w JOIN job_queue AS jq ON jq.name = w.queue
    CROSS JOIN LATERAL (
        SELECT CASE WHEN w.key = '' THEN jq.rate_max_starts ELSE jq.key_rate_max_starts END,
               CASE WHEN w.key = '' THEN jq.rate_period ELSE jq.key_rate_period END
    ) AS l(max_starts, period)
    CROSS JOIN LATERAL (
        SELECT sum(r.n) AS starts, min(r.at) AS first_at FROM job_rate AS r
        WHERE r.queue = w.queue AND r.concurrency_key = w.key AND r.at > p_now - l.period
    ) AS c
    WHERE w.key IS NOT NULL AND c.starts >= l.max_starts
$$;

-- Where a job is now, whichever table holds it (now with its queue).
CREATE OR REPLACE VIEW job_state AS
    SELECT id, job_type, 'queued'::text AS state, attempts, last_error, queue FROM job
    UNION ALL
    SELECT id, job_type, 'running', attempts, last_error, queue FROM job_running
    UNION ALL
    SELECT id, job_type, 'dead', attempts, last_error, queue FROM job_dead;
