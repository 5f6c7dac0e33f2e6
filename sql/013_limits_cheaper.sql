-- Limits that do not bind cost little (issue 8): a claim of a limited queue is four statements
-- (its queues, the queue's turn, the queue's counts, the claim with its start row), its running
-- jobs are counted by an index, and a claim that no key's rate can stop writes its starts as one
-- row.
--
-- A claim's keyed starts are written in one of two ways, so each is counted exactly once:
--
-- * folded: in the claim's '' row, `keys` (one element per started job with a key), when no
--   key's rate could bind in this claim: the queue's starts within the key period plus the
--   claim's budget stay within the key rate (a key's starts are some of the queue's, so no key
--   can exceed the rate either). One row for the whole claim.
-- * per key: one row per key (concurrency_key, n), as before, when some key's rate could bind.
--   The claims that must count keys are those, so the rows they read are indexed by key.
--
-- A key's starts within a period are then the sum of its own rows plus its elements in the
-- folded rows of the period (job_rate_key_starts). The folded rows within any one key period
-- hold at most the key rate's starts together: let L be the last folded claim of the window;
-- every other folded claim in it is earlier and within L's own window, whose starts before L
-- plus L's budget were within the rate when L folded. So counting them stays cheap, and a
-- queue whose keys are always near their rate writes (and reads) per-key rows alone.

ALTER TABLE job_rate ADD COLUMN keys text[];
COMMENT ON COLUMN job_rate.keys IS
    'the keys of a claim''s starts (one element per job), when written in its '''' row';
-- The folded rows of a queue, by time: only claims that folded keys have an entry.
CREATE INDEX job_rate_folded_idx ON job_rate (queue, at) WHERE keys IS NOT NULL;

-- A queue's running jobs, and a key's, for the limits: counted by this index, not by a scan of
-- job_running, whose dead rows (every job leaves one) pile up between autovacuums: a scan's
-- cost grew with the jobs run since the last vacuum (0.12 ms at 20,000), the index's does not.
CREATE INDEX job_running_queue_idx ON job_running (queue, concurrency_key);

DROP FUNCTION job_claimable(text[], integer[], timestamptz);
DROP FUNCTION job_key_allowances(job_queue, text[], timestamptz);
DROP FUNCTION job_rate_queue_starts(text, bigint, timestamptz);

-- The starts after p_since of each key of p_keys of queue p_queue: its own rows and its
-- elements in the folded rows (both are at most the key rate within a key period).
CREATE FUNCTION job_rate_key_starts(p_queue text, p_keys text[], p_since timestamptz)
RETURNS TABLE (key text, n bigint) LANGUAGE sql STABLE AS $$
    SELECT s.key, sum(s.n)::bigint FROM (
        SELECT r.concurrency_key AS key, r.n FROM unnest(p_keys) AS k(key)
        JOIN job_rate AS r
          ON r.queue = p_queue AND r.concurrency_key = k.key AND r.at > p_since
        UNION ALL
        SELECT f.key, 1 FROM job_rate AS r CROSS JOIN LATERAL unnest(r.keys) AS f(key)
        WHERE r.queue = p_queue AND r.keys IS NOT NULL AND r.at > p_since
          AND f.key = ANY(p_keys)
    ) AS s
    GROUP BY s.key
$$;

-- How many more jobs of each key of p_keys queue `q` may start at p_at (NULL: no limit): within
-- its running limit per key when p_running, and within its rate per key when p_rated. A limit
-- left out is one that no key can reach in this claim (job_claimable).
CREATE FUNCTION job_key_allowances(
    q job_queue, p_keys text[], p_at timestamptz, p_running boolean, p_rated boolean
)
RETURNS TABLE (key text, n bigint) LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT k.key, least(
        CASE WHEN p_running THEN q.max_running_per_key - coalesce(h.n, 0) END,
        CASE WHEN p_rated THEN q.key_rate_max_starts - coalesce(w.n, 0) END)
    FROM unnest(p_keys) AS k(key)
    LEFT JOIN (
        SELECT r.concurrency_key, count(*) AS n FROM job_running AS r
        WHERE p_running AND r.queue = q.name AND r.concurrency_key = ANY(p_keys) GROUP BY 1
    ) AS h ON h.concurrency_key = k.key
    LEFT JOIN (
        SELECT s.key, s.n FROM job_rate_key_starts(q.name, p_keys, p_at - q.key_rate_period) AS s
        WHERE p_rated
    ) AS w ON w.key = k.key;
END $$;

-- Which jobs of the queues with limits the claim may take (`id`), and the time each claim counts
-- as its start (`claimed_at`): the queues and their free slots (p_queues, p_slots), at p_now.
-- The chosen jobs are locked and their starts written to the rate windows: the caller claims
-- every returned id in the same transaction.
--
-- The claims of a limited queue take turns (a transaction lock per queue, taken in a fixed
-- order), and each reads what the ones before it committed: a volatile function's statements
-- each take a fresh snapshot, after the lock. So a limit is never exceeded however many workers
-- claim at once. The queues' rows (paused, limits) are read once, before the turns, as the
-- calling statement reads them: a claim already under way when a pause commits may still start
-- its jobs (README, "Queues, limits and pause").
--
-- A queue's budget is its free slots within its own limits. Each per-key limit is checked only
-- when some key could reach it in this claim: the whole queue's running jobs plus the budget
-- exceed the running limit per key, or the queue's starts within the key period plus the
-- budget exceed the rate per key (a key's count is part of the queue's, so when the queue's
-- count stays within a per-key limit, every key's does). When neither can bind, the claim takes
-- its line as a queue without per-key limits does, and its start row folds its keys (see the
-- top of this file). Otherwise the budget goes to the first jobs of its line (priority, then
-- ripe_at) whose key has room: each key's allowance goes to its own first jobs. The claim reads
-- the head of the line (four times the budget); only when that head is held back too much to
-- fill the budget does it walk the queue's keys (job_key_idx), reading each key's allowance.
--
-- The first p_limit ripe jobs of queue p_queue's line (priority, then ripe_at), read one
-- priority at a time, highest first: one index probe finds the next priority and its first job,
-- then that priority's ripe jobs in order from there (job_claim_idx), past the index entries of
-- jobs already gone. Read as one range, `ripe_at <= p_now` would step over every job scheduled
-- later whenever fewer are ripe than p_limit (ten million reminders due next year: seconds per
-- idle claim). The same walk as the claim of a queue without limits
-- (jobq.queue.sql._claiming). No row is locked: job_claimable, whose settings it runs under,
-- locks the ones it takes (its claims of a queue take turns, so none is lost to another's lock).
CREATE FUNCTION job_line(p_queue text, p_now timestamptz, p_limit integer)
RETURNS TABLE (id bigint, concurrency_key text, priority smallint, ripe_at timestamptz)
LANGUAGE plpgsql STABLE
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH RECURSIVE priorities AS (
        (SELECT j.priority, j.ripe_at FROM job AS j WHERE j.queue = p_queue
         ORDER BY j.priority DESC, j.ripe_at LIMIT 1)
        UNION ALL
        SELECT n.priority, n.ripe_at FROM priorities AS p CROSS JOIN LATERAL (
            SELECT j.priority, j.ripe_at FROM job AS j
            WHERE j.queue = p_queue AND j.priority < p.priority
            ORDER BY j.priority DESC, j.ripe_at LIMIT 1) AS n
    )
    SELECT r.id, r.concurrency_key, r.priority, r.ripe_at FROM priorities AS p
    CROSS JOIN LATERAL (
        SELECT j.id, j.concurrency_key, j.priority, j.ripe_at FROM job AS j
        WHERE j.queue = p_queue AND j.priority = p.priority
          AND j.ripe_at >= p.ripe_at AND j.ripe_at <= p_now
        ORDER BY j.ripe_at LIMIT p_limit
    ) AS r
    LIMIT p_limit;
END $$;

-- A claim's start time in the rate windows is p_now, or the queue's last claim's if that is
-- later: a worker reads its clock before it waits for the queue's turn, so a claim that read it
-- earlier may come after one that read it later (and hosts' clocks differ a little). Taking the
-- later time keeps every window's starts in order, so the count is exact at every instant.
CREATE FUNCTION job_claimable(p_queues text[], p_slots integer[], p_now timestamptz)
RETURNS TABLE (id bigint, claimed_at timestamptz) LANGUAGE plpgsql VOLATILE
-- A claim never waits for a compiler, nor plans its statements anew at each call (as on the
-- worker's own session, jobq.queue.worker): planning them cost more than running them. Every
-- statement here is meant to probe an index: a plan kept from a session's first claim, made when
-- job_running was empty, would otherwise scan that table, and its dead rows pile up until the
-- next vacuum (the scan grew to 0.12 ms in 20,000 jobs).
SET jit = off SET plan_cache_mode = force_generic_plan SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    q job_queue;
    v_free integer;
    v_rated boolean;
    v_at timestamptz;
    v_seq bigint;
    v_running bigint;
    v_starts bigint;  -- the queue's starts within its rate period
    v_key_starts bigint;  -- the queue's starts within the key rate period (or a bound, below)
    v_budget integer;
    v_keys_running boolean;  -- some key could reach max_running_per_key in this claim
    v_keys_rated boolean;  -- some key could reach key_rate_max_starts in this claim
    v_ids bigint[];
    v_head integer;
BEGIN
    FOR q IN
        SELECT jq.* FROM job_queue AS jq
        WHERE jq.name = ANY(p_queues) AND NOT jq.paused ORDER BY jq.id
    LOOP
        v_free := p_slots[array_position(p_queues, q.name)];
        CONTINUE WHEN coalesce(v_free, 0) <= 0;
        PERFORM pg_advisory_xact_lock(1785684594, q.id);
        -- the queue's counts, after the turn (each statement takes its snapshot): its running
        -- jobs; its last start row (its time, and the queue's starts so far: `seq`), and the
        -- starts within each period: `seq` minus the seq before the period's first row
        IF q.max_running IS NOT NULL OR q.max_running_per_key IS NOT NULL THEN
            v_running := (SELECT count(*) FROM job_running AS r WHERE r.queue = q.name);
        END IF;
        v_rated := q.rate_max_starts IS NOT NULL OR q.key_rate_max_starts IS NOT NULL;
        v_at := p_now;
        v_seq := 0;
        v_starts := 0;
        v_key_starts := 0;
        IF v_rated THEN
            -- The starts within the key period are those within the queue's period when that
            -- is as long or longer and they leave room for every free slot: no key can then
            -- reach its rate whatever they are exactly (one index probe less).
            SELECT l.at, l.seq, w.starts, CASE
                WHEN q.key_rate_max_starts IS NULL THEN 0
                WHEN q.key_rate_period <= q.rate_period
                     AND w.starts + v_free <= q.key_rate_max_starts THEN w.starts
                ELSE l.seq - coalesce(
                    (SELECT r.seq - r.n FROM job_rate AS r
                     WHERE r.queue = q.name AND r.concurrency_key = ''
                       AND r.at > l.at - q.key_rate_period
                     ORDER BY r.at, r.seq LIMIT 1), l.seq) END
            INTO v_at, v_seq, v_starts, v_key_starts
            FROM (SELECT greatest(p_now, r.at) AS at, r.seq FROM job_rate AS r
                  WHERE r.queue = q.name AND r.concurrency_key = ''
                  ORDER BY r.at DESC, r.seq DESC LIMIT 1) AS l
            CROSS JOIN LATERAL (
                SELECT CASE WHEN q.rate_max_starts IS NOT NULL THEN l.seq - coalesce(
                    (SELECT r.seq - r.n FROM job_rate AS r
                     WHERE r.queue = q.name AND r.concurrency_key = ''
                       AND r.at > l.at - q.rate_period
                     ORDER BY r.at, r.seq LIMIT 1), l.seq) ELSE 0 END AS starts
                OFFSET 0  -- probed once, not once per use
            ) AS w;
            IF NOT FOUND THEN  -- no start row: no starts in any window
                v_at := p_now;
                v_seq := 0;
                v_starts := 0;
                v_key_starts := 0;
            END IF;
        END IF;
        v_budget := least(v_free, q.max_running - v_running, q.rate_max_starts - v_starts);
        CONTINUE WHEN v_budget <= 0;
        v_keys_running := coalesce(v_running + v_budget > q.max_running_per_key, false);
        v_keys_rated := coalesce(v_key_starts + v_budget > q.key_rate_max_starts, false);

        IF NOT (v_keys_running OR v_keys_rated) THEN
            -- no limit of a key can bind: the line, and one start row with the keys folded
            IF NOT v_rated THEN
                RETURN QUERY
                SELECT j.id, v_at FROM job AS j
                WHERE j.id = ANY(ARRAY(SELECT l.id FROM job_line(q.name, p_now, v_budget) AS l))
                FOR UPDATE SKIP LOCKED;
                CONTINUE;
            END IF;
            RETURN QUERY
            WITH c AS (
                SELECT j.id, j.concurrency_key FROM job AS j
                WHERE j.id = ANY(ARRAY(SELECT l.id FROM job_line(q.name, p_now, v_budget) AS l))
                FOR UPDATE SKIP LOCKED
            ), started AS (
                INSERT INTO job_rate (queue, concurrency_key, at, seq, n, keys)
                SELECT q.name, '', v_at, v_seq + count(*), count(*),
                       CASE WHEN q.key_rate_max_starts IS NOT NULL THEN
                           array_agg(c.concurrency_key)
                           FILTER (WHERE c.concurrency_key IS NOT NULL) END
                FROM c HAVING count(*) > 0
            )
            SELECT c.id, v_at FROM c;
            CONTINUE;
        END IF;

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

        -- lock the chosen jobs; write the start row, and the keys' starts: per key when a key's
        -- rate could bind (those claims read them by key), else folded into the start row
        RETURN QUERY
        WITH c AS (
            SELECT j.id, j.concurrency_key FROM job AS j
            WHERE j.id = ANY(v_ids) FOR UPDATE SKIP LOCKED
        ), started AS (
            INSERT INTO job_rate (queue, concurrency_key, at, seq, n, keys)
            SELECT q.name, '', v_at, v_seq + count(*), count(*),
                   CASE WHEN q.key_rate_max_starts IS NOT NULL AND NOT v_keys_rated THEN
                       array_agg(c.concurrency_key)
                       FILTER (WHERE c.concurrency_key IS NOT NULL) END
            FROM c WHERE v_rated HAVING count(*) > 0
            UNION ALL
            SELECT q.name, c.concurrency_key, v_at,
                   v_seq + (SELECT count(*) FROM c), count(*), NULL
            FROM c WHERE v_keys_rated AND c.concurrency_key IS NOT NULL
            GROUP BY c.concurrency_key
        )
        SELECT c.id, v_at FROM c;
    END LOOP;
END $$;

-- When a full rate window of the queues p_queues next lets one more job start after p_now (NULL
-- when none is full): when the first of its starts within the period leaves it. A key's starts
-- are its own rows and its elements in the folded rows.
CREATE OR REPLACE FUNCTION job_rate_opens_at(p_queues text[], p_now timestamptz)
RETURNS timestamptz LANGUAGE sql STABLE AS $$
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
    ), starts AS (
        SELECT w.queue, w.key, r.n, r.at
        FROM windows AS w JOIN job_queue AS jq ON jq.name = w.queue
        CROSS JOIN LATERAL (
            SELECT r.n, r.at FROM job_rate AS r
            WHERE r.queue = w.queue AND r.concurrency_key = w.key
              AND r.at > p_now - CASE WHEN w.key = '' THEN jq.rate_period
                                      ELSE jq.key_rate_period END
        ) AS r
        WHERE w.key IS NOT NULL
        UNION ALL
        SELECT jq.name, f.key, 1, r.at
        FROM job_queue AS jq
        JOIN job_rate AS r
          ON r.queue = jq.name AND r.keys IS NOT NULL AND r.at > p_now - jq.key_rate_period
        CROSS JOIN LATERAL unnest(r.keys) AS f(key)
        WHERE jq.name = ANY(p_queues)
    )
    SELECT min(s.first_at + CASE WHEN s.key = '' THEN jq.rate_period ELSE jq.key_rate_period END)
    FROM (SELECT s.queue, s.key, sum(s.n) AS n, min(s.at) AS first_at
          FROM starts AS s GROUP BY s.queue, s.key) AS s
    JOIN job_queue AS jq ON jq.name = s.queue
    WHERE s.n >= CASE WHEN s.key = '' THEN jq.rate_max_starts ELSE jq.key_rate_max_starts END
$$;
