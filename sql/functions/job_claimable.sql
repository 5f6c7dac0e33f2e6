-- How queues with limits are claimed, at p_now: p_queues, their rows in the order of their ids,
-- as the claim statement read them; p_slots, the free slots of each (> 0); p_capacity[i], when
-- not NULL, the claiming worker's slots in queue i, which asks for a grant; p_until[i], when not
-- NULL, the end of the grant the worker claims queue i under. One row per queue with jobs to
-- claim:
--
-- * `budget`: no key's limit can bind in this claim: the caller takes the first `budget` jobs
--   of the queue's line (`ids` NULL), and writes their start row when `rated` (at
--   `claimed_at`, `seq` plus the jobs it took; their keys folded in when `keyed`: no key's
--   rate can bind);
-- * `ids`: the jobs chosen within the keys' limits, locked, their starts written here (`budget`
--   NULL): a claim near a key's limits is the rarer one, and the caller's plan stays small.
--
-- A row that grants has `granted` (the grant's starts, this claim's included: at least
-- `budget`), `until` and `reserved`; the caller writes it as the queue's start row (`seq` plus
-- `granted`). Every count of a turn adds the grants': the reservations to the running jobs, and
-- to each window's starts the grants made before the window that overlap it (those made within
-- it are in its `seq`). Grants are described with job_rate in sql/schema.sql.
--
-- The claims of a limited queue take turns (a transaction lock per queue, taken in a fixed
-- order), and each reads what the ones before it committed: a volatile function's statements
-- each take a fresh snapshot, after the lock. So a limit is never exceeded however many workers
-- claim at once. The queues' rows (paused, limits) are read once, before the turns, by the
-- calling statement: a claim already under way when a pause commits may still start its jobs
-- (README, "Queues, limits and pause"). A grant's lock is taken shared in the turns' order (by
-- the queues' ids), never before a turn of a queue that comes later: a claim that held one
-- queue's lock shared while it waited for another's turn could wait for a claim that waits for
-- it. A grant that cannot take its lock shared (a turn is under way) takes the turn.
--
-- A queue's budget is its free slots within its own limits. Each per-key limit is checked only
-- when some key could reach it in this claim: the whole queue's running jobs plus the budget
-- exceed the running limit per key, or the queue's starts within the key period plus the
-- budget exceed the rate per key (a key's count is part of the queue's, so when the queue's
-- count stays within a per-key limit, every key's does). When neither can bind, the claim takes
-- its line as a queue without per-key limits does, and its start row folds its keys (see
-- job_rate in sql/schema.sql). Otherwise the budget goes to the first jobs of its line
-- (priority, then ripe_at) whose key has room: each key's allowance goes to its own first
-- jobs. The claim reads the head of the line (four times the budget, job_line); only when that
-- head is held back too much to fill the budget does it walk the queue's keys (job_key_idx),
-- reading each key's allowance.
--
-- A claim's start time in the rate windows is p_now, or the queue's last claim's if that is
-- later: a worker reads its clock before it waits for the queue's turn, so a claim that read it
-- earlier may come after one that read it later (and hosts' clocks differ a little). Taking the
-- later time keeps every window's starts in order, so the count is exact at every instant.
CREATE OR REPLACE FUNCTION job_claimable(
    p_queues job_queue[], p_slots integer[], p_capacity integer[], p_until timestamptz[],
    p_now timestamptz
)
RETURNS TABLE (
    queue text, claimed_at timestamptz, budget integer, seq bigint, rated boolean,
    keyed boolean, ids bigint[], granted integer, until timestamptz, reserved integer
) LANGUAGE plpgsql VOLATILE
ROWS 1  -- one row per queue with limits that has jobs to claim: the claim plans for a few
-- A claim never waits for a compiler, nor plans its statements anew at each call (as on the
-- worker's own session, jobq.queue.worker): planning them costs more than running them. Every
-- statement here is meant to probe an index: a plan kept from a session's first claim, made when
-- job_running was empty, would otherwise scan that table, whose dead rows pile up until the
-- next vacuum; a bitmap scan of its index would not mark the entries of dead rows either, so
-- each count would step over them again.
SET jit = off SET plan_cache_mode = force_generic_plan SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    q job_queue;
    v_free integer;
    v_capacity integer;
    v_rated boolean;
    v_at timestamptz;
    v_seq bigint;
    v_running bigint;
    v_reserved bigint;  -- the running jobs the grants that may still claim count for
    v_starts bigint;  -- the queue's starts within its rate period
    v_key_starts bigint;  -- the queue's starts within the key rate period (or a bound, below)
    v_budget integer;
    v_grant integer;
    v_keys_running boolean;  -- some key could reach max_running_per_key in this claim
    v_keys_rated boolean;  -- some key could reach key_rate_max_starts in this claim
    v_ids bigint[];
    v_head integer;
BEGIN
    FOR i IN 1 .. coalesce(cardinality(p_queues), 0) LOOP
        q := p_queues[i];
        v_free := p_slots[i];
        v_capacity := p_capacity[i];
        CONTINUE WHEN coalesce(v_free, 0) <= 0;
        -- (`IS NOT NULL` first: NULL AND the lock would still take the lock)
        IF p_until[i] IS NOT NULL AND p_until[i] > clock_timestamp()
           AND pg_try_advisory_xact_lock_shared(1785684594, q.id) THEN
            -- a claim under the worker's grant: the line, up to the free slots, no count. Its
            -- end is read again after the lock (job_grant_holds); passed meanwhile, the queue is
            -- skipped (`granted` 0: the worker claims it again with its turn), for this claim
            -- holds the lock shared now and must not wait for it whole (two such claims would
            -- wait for each other).
            queue := q.name;
            claimed_at := p_now;
            seq := NULL;
            rated := false;
            keyed := NULL;
            ids := NULL;
            until := NULL;
            reserved := NULL;
            IF p_until[i] > clock_timestamp() THEN
                budget := v_free;
                granted := NULL;
            ELSE
                budget := 0;
                granted := 0;
            END IF;
            RETURN NEXT;
            CONTINUE;
        END IF;
        IF NOT pg_try_advisory_xact_lock(1785684594, q.id) THEN  -- a simple expression first:
            PERFORM pg_advisory_xact_lock(1785684594, q.id);      -- no statement to run
        END IF;
        v_rated := q.rate_max_starts IS NOT NULL OR q.key_rate_max_starts IS NOT NULL;
        v_at := p_now;
        v_seq := 0;
        v_starts := 0;
        v_key_starts := 0;
        -- the queue's counts, after the turn (one statement, its own snapshot): its running
        -- jobs, and those the grants that may still claim count for; with a rate, its last start
        -- row (its time, and the queue's starts so far: `seq`), the starts within each period
        -- (`seq` minus the seq before the period's first row), plus the grants made before the
        -- period that overlap it
        IF NOT v_rated THEN
            SELECT CASE WHEN q.max_running IS NOT NULL OR q.max_running_per_key IS NOT NULL THEN
                       (SELECT count(*) FROM job_running AS r WHERE r.queue = q.name) END,
                   (SELECT coalesce(sum(g.reserved), 0) FROM job_rate AS g
                    WHERE g.queue = q.name AND g.until > clock_timestamp())
            INTO v_running, v_reserved;
        ELSE
            SELECT CASE WHEN q.max_running IS NOT NULL OR q.max_running_per_key IS NOT NULL THEN
                       (SELECT count(*) FROM job_running AS r WHERE r.queue = q.name) END,
                   (SELECT coalesce(sum(g.reserved), 0) FROM job_rate AS g
                    WHERE g.queue = q.name AND g.until > clock_timestamp()),
                   coalesce(l.at, p_now), coalesce(l.seq, 0), coalesce(w.starts, 0) + e.starts,
                   coalesce(CASE
                WHEN q.key_rate_max_starts IS NULL THEN 0
                WHEN q.key_rate_period <= q.rate_period
                     AND w.starts + v_free <= q.key_rate_max_starts THEN w.starts
                ELSE l.seq - coalesce(
                    (SELECT r.seq - r.n FROM job_rate AS r
                     WHERE r.queue = q.name AND r.concurrency_key = ''
                       AND r.at > l.at - q.key_rate_period
                     ORDER BY r.at, r.seq LIMIT 1), l.seq) END, 0) + e.key_starts
            INTO v_running, v_reserved, v_at, v_seq, v_starts, v_key_starts
            FROM (SELECT) AS one
            LEFT JOIN LATERAL (
                SELECT greatest(p_now, r.at) AS at, r.seq FROM job_rate AS r
                WHERE r.queue = q.name AND r.concurrency_key = ''
                ORDER BY r.at DESC, r.seq DESC LIMIT 1) AS l ON true
            LEFT JOIN LATERAL (
                SELECT CASE WHEN q.rate_max_starts IS NOT NULL THEN l.seq - coalesce(
                    (SELECT r.seq - r.n FROM job_rate AS r
                     WHERE r.queue = q.name AND r.concurrency_key = ''
                       AND r.at > l.at - q.rate_period
                     ORDER BY r.at, r.seq LIMIT 1), l.seq) ELSE 0 END AS starts
                OFFSET 0  -- probed once, not once per use
            ) AS w ON l.seq IS NOT NULL
            CROSS JOIN LATERAL (
                SELECT coalesce(sum(g.n) FILTER (
                           WHERE g.at <= l.at - q.rate_period
                             AND g.at > l.at - q.rate_period - 2 * job_grant_span()), 0) AS starts,
                       coalesce(sum(g.n) FILTER (
                           WHERE g.at <= l.at - q.key_rate_period
                             AND g.at > l.at - q.key_rate_period - 2 * job_grant_span()), 0)
                           AS key_starts
                FROM job_rate AS g
                WHERE g.queue = q.name AND g.until IS NOT NULL
                  AND g.at > l.at - greatest(q.rate_period, q.key_rate_period)
                             - 2 * job_grant_span()
                  AND g.at <= l.at - least(q.rate_period, q.key_rate_period)
            ) AS e;
        END IF;
        v_running := v_running + v_reserved;
        v_budget := least(v_free, q.max_running - v_running, q.rate_max_starts - v_starts);
        CONTINUE WHEN v_budget <= 0;
        v_keys_running := coalesce(v_running + v_budget > q.max_running_per_key, false);
        v_keys_rated := coalesce(v_key_starts + v_budget > q.key_rate_max_starts, false);

        IF NOT (v_keys_running OR v_keys_rated) THEN
            -- no limit of a key can bind: the calling statement takes the queue's line, up to
            -- the budget (its start row folds the keys, or is the grant's)
            queue := q.name;
            claimed_at := v_at;
            budget := v_budget;
            seq := v_seq;
            rated := v_rated;
            keyed := q.key_rate_max_starts IS NOT NULL;
            ids := NULL;
            -- a grant of up to 32 claims of all the worker's slots, within half of each rate's
            -- room, when the running limits leave room for all its slots besides
            v_grant := least(32 * v_capacity, (q.rate_max_starts - v_starts) / 2,
                             (q.key_rate_max_starts - v_key_starts) / 2);
            IF v_capacity IS NOT NULL AND v_grant >= v_free
               AND coalesce(v_running + v_capacity <= q.max_running, true)
               AND coalesce(v_running + v_capacity <= q.max_running_per_key, true) THEN
                IF NOT v_rated THEN  -- its row takes the next `seq`, at no earlier a time
                    SELECT greatest(p_now, r.at), r.seq INTO v_at, v_seq FROM job_rate AS r
                    WHERE r.queue = q.name AND r.concurrency_key = ''
                    ORDER BY r.at DESC, r.seq DESC LIMIT 1;
                    claimed_at := coalesce(v_at, p_now);
                    seq := coalesce(v_seq, 0);
                END IF;
                granted := v_grant;
                until := clock_timestamp() + job_grant_span();
                reserved := v_capacity;
            ELSE
                granted := NULL;
                until := NULL;
                reserved := NULL;
            END IF;
            RETURN NEXT;
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
                v_keys_running, v_keys_rated, v_reserved
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
                        v_keys_running, v_keys_rated, v_reserved) AS a
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

        -- lock the chosen jobs (the calling statement claims them) and write their starts:
        -- per key when a key's rate could bind (those claims read them by key), else folded
        -- into the start row
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
        SELECT q.name, v_at, NULL::integer, v_seq, v_rated, NULL::boolean,
               ARRAY(SELECT c.id FROM c), NULL::integer, NULL::timestamptz, NULL::integer;
    END LOOP;
END $$;
