-- The turns of the queues with limits p_queues (sorted by id), each with p_free[i] free slots
-- of worker p_worker_id: each queue's turn claims its jobs and returns them, each with a new
-- fencing token, leased until p_lease_expires_at.
--
-- Exact by construction. A turn's steps are statements of this function, run in this order:
--   1. take the queue's turn: a transaction-level advisory lock (class 1785684594, the queue's
--      id), held until the claim's transaction ends; every claim of the queue takes it, in the
--      queues' id order (no deadlock);
--   2. count: the queue's running jobs and its starts within each rate period, in a statement
--      that begins after the lock is held, so its snapshot (READ COMMITTED: a fresh one per
--      statement of a VOLATILE function) holds every claim of the queue that committed before
--      this turn, and this transaction's own outcomes recorded so far;
--   3. choose: the budget (free slots within the queue's limits) goes to the first jobs of the
--      queue's line, or, when a key's limit may bind, to the first jobs whose key has room;
--      the chosen rows are locked (FOR UPDATE SKIP LOCKED);
--   4. move the chosen jobs from job to job_running;
--   5. write their starts to the rate windows (job_rate).
-- No other claim of the queue counts until this transaction commits, and then it sees the
-- moved rows: so no limit is exceeded however many workers claim at once. Outcomes, rescues and
-- cancels only ever lower the counts, and need no turn.
--
-- Budget. Each per-key limit is checked only when some key could reach it in this claim: the
-- queue's running jobs plus the budget exceed the running limit per key, or the queue's starts
-- within the key period plus the budget exceed the rate per key (a key's count is part of the
-- queue's, so when the queue's count stays within a per-key limit, every key's does). When a
-- key's limit may bind, the budget goes to the first jobs of the line whose key has room: each
-- key's allowance to its own first jobs. The turn reads the head of the line (four times the
-- budget); only when that head is held back too much to fill the budget does it walk the
-- queue's keys (job_key_idx), so a claim never scans held-back jobs.
--
-- Rate windows. A start row of job_rate is one claim's starts: `n` of them at `at`, and `seq`,
-- the queue's starts so far, so the starts within a period are two index probes. A turn's time
-- is p_now, or the queue's last start if later (hosts' clocks differ a little): each window's
-- starts stay in order.
CREATE OR REPLACE FUNCTION job_claim_turns(
    p_queues job_queue[], p_free integer[], p_worker_id integer, p_now timestamptz,
    p_lease_expires_at timestamptz
)
RETURNS SETOF job_claimed LANGUAGE plpgsql VOLATILE
SET jit = off SET plan_cache_mode = force_generic_plan SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
DECLARE
    q job_queue;
    v_rated boolean;
    v_at timestamptz;
    v_seq bigint;
    v_running bigint;
    v_starts bigint;      -- the queue's starts within its rate period
    v_key_starts bigint;  -- the queue's starts within the key rate period
    v_budget integer;
    v_keys_running boolean;  -- some key could reach max_running_per_key in this claim
    v_keys_rated boolean;    -- some key could reach key_rate_max_starts in this claim
    v_ids bigint[];
    v_head integer;
    v_moved job_claimed[];
BEGIN
    FOR i IN 1 .. coalesce(cardinality(p_queues), 0) LOOP
        q := p_queues[i];
        CONTINUE WHEN coalesce(p_free[i], 0) <= 0;

        -- 1. the queue's turn
        PERFORM pg_advisory_xact_lock(1785684594, q.id);

        -- 2. the counts, in a statement after the lock
        v_rated := q.rate_max_starts IS NOT NULL OR q.key_rate_max_starts IS NOT NULL;
        SELECT CASE WHEN q.max_running IS NOT NULL OR q.max_running_per_key IS NOT NULL THEN
                   (SELECT count(*) FROM job_running AS r WHERE r.queue = q.name) ELSE 0 END,
               greatest(p_now, l.at), coalesce(l.seq, 0),
               CASE WHEN q.rate_max_starts IS NOT NULL THEN coalesce(l.seq - (
                   SELECT r.seq - r.n FROM job_rate AS r
                   WHERE r.queue = q.name AND r.concurrency_key = ''
                     AND r.at > greatest(p_now, l.at) - q.rate_period
                   ORDER BY r.at, r.seq LIMIT 1), 0) ELSE 0 END,
               CASE WHEN q.key_rate_max_starts IS NOT NULL THEN coalesce(l.seq - (
                   SELECT r.seq - r.n FROM job_rate AS r
                   WHERE r.queue = q.name AND r.concurrency_key = ''
                     AND r.at > greatest(p_now, l.at) - q.key_rate_period
                   ORDER BY r.at, r.seq LIMIT 1), 0) ELSE 0 END
        INTO v_running, v_at, v_seq, v_starts, v_key_starts
        FROM (SELECT) AS one
        LEFT JOIN LATERAL (
            SELECT r.at, r.seq FROM job_rate AS r
            WHERE v_rated AND r.queue = q.name AND r.concurrency_key = ''
            ORDER BY r.at DESC, r.seq DESC LIMIT 1) AS l ON true;
        v_at := coalesce(v_at, p_now);

        -- 3. choose
        v_budget := least(p_free[i], q.max_running - v_running, q.rate_max_starts - v_starts);
        CONTINUE WHEN v_budget <= 0;
        v_keys_running := coalesce(v_running + v_budget > q.max_running_per_key, false);
        v_keys_rated := coalesce(v_key_starts + v_budget > q.key_rate_max_starts, false);
        IF NOT (v_keys_running OR v_keys_rated) THEN
            -- no key's limit can bind: the head of the line
            v_ids := ARRAY(SELECT h.id FROM job_line(q.name, p_now, v_budget) AS h);
        ELSE
            WITH head AS (
                SELECT h.id, h.concurrency_key AS key,
                       row_number() OVER (ORDER BY h.priority DESC, h.ripe_at) AS place
                FROM job_line(q.name, p_now, 4 * v_budget) AS h
            ), ranked AS (
                SELECT h.*, row_number() OVER (PARTITION BY h.key ORDER BY h.place) AS nth
                FROM head AS h
            ), allowed AS (
                SELECT r.id FROM ranked AS r
                LEFT JOIN job_key_allowances(
                    q, ARRAY(SELECT DISTINCT key FROM head WHERE key IS NOT NULL), v_at,
                    v_keys_running, v_keys_rated
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
                            q, ARRAY(SELECT key FROM keys WHERE key IS NOT NULL), v_at,
                            v_keys_running, v_keys_rated) AS a
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
        END IF;

        -- 4. move the chosen jobs (those another transaction holds are skipped)
        WITH chosen AS (
            SELECT j.id FROM job AS j WHERE j.id = ANY(v_ids) FOR UPDATE SKIP LOCKED
        ), moved AS (
            DELETE FROM job AS j USING chosen AS c WHERE j.id = c.id
            RETURNING j.*
        ), running AS (
            INSERT INTO job_running (id, job_type, arguments, ripe_at, priority, attempts,
                                     max_retries, last_error, created_at, queue,
                                     concurrency_key, awaited, unique_mode, unique_key,
                                     worker_id, claimed_at, lease_expires_at, token)
            SELECT m.id, m.job_type, m.arguments, m.ripe_at, m.priority, m.attempts,
                   m.max_retries, m.last_error, m.created_at, m.queue, m.concurrency_key,
                   m.awaited, m.unique_mode, m.unique_key, p_worker_id, v_at,
                   p_lease_expires_at, nextval('job_fencing_token')
            FROM moved AS m
            RETURNING token, id, job_type, arguments::text, attempts, max_retries, ripe_at,
                      claimed_at, queue, concurrency_key
        )
        SELECT coalesce(array_agg(r::job_claimed), '{}') INTO v_moved FROM running AS r;
        CONTINUE WHEN cardinality(v_moved) = 0;

        -- 5. their starts: one row folding the keys (per key when a key's rate may bind)
        IF v_rated THEN
            INSERT INTO job_rate (queue, concurrency_key, at, seq, n, keys)
            SELECT q.name, '', v_at, v_seq + count(*), count(*),
                   CASE WHEN q.key_rate_max_starts IS NOT NULL AND NOT v_keys_rated THEN
                       array_agg(m.concurrency_key) FILTER (WHERE m.concurrency_key IS NOT NULL)
                   END
            FROM unnest(v_moved) AS m
            UNION ALL
            SELECT q.name, m.concurrency_key, v_at, v_seq + cardinality(v_moved), count(*), NULL
            FROM unnest(v_moved) AS m
            WHERE v_keys_rated AND m.concurrency_key IS NOT NULL
            GROUP BY m.concurrency_key;
        END IF;
        RETURN QUERY SELECT * FROM unnest(v_moved);
    END LOOP;
END $$;
