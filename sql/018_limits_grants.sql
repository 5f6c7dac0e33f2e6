-- Grants: limits that do not bind cost a claim nothing (issue 8). A queue's turn that finds every
-- limit of the queue far away grants the claiming worker the right to claim up to `n` jobs of the
-- queue's line during the next job_grant_span(), with no turn: the worker's claims under the grant
-- take the line as a queue without limits does. The turn writes the grant as one row of job_rate:
--
-- * its `n` starts, as the queue's starts at `at` (the turn's time) in the '' rows' `seq`, but
--   counted in every rate window that overlaps [at, at + 2 * job_grant_span()] (each claim under
--   the grant is made before `until` by the server's clock; the second span covers the worker's
--   clock, which sets `at`, running a little apart from the server's): a grant's starts may be
--   made at any time of its span, so a window counts them all when it overlaps that span;
-- * `reserved`: the worker's slots in the queue, counted by every turn as that many running jobs
--   of the queue, and of each of its keys, until `until` (the server's clock, read after the
--   turn's lock by both the turn and each claim under the grant).
--
-- Exactness. Every turn counts, besides the rows it counted before, every grant whose starts
-- may fall in its windows and every grant that may still claim. A turn grants only when each
-- limit holds with the grant's whole `n` and `reserved` added, so every window and every instant
-- that a grant can reach was checked with all of it. A worker holds at most its slots of
-- job_running rows of a queue, so a grant's jobs running at once are at most `reserved`; a grant's
-- starts are at most `n` (the worker counts them down, and asks each claim for no more). A claim
-- under a grant takes the queue's turn lock shared (pg_try_advisory_xact_lock_shared, never
-- waiting: a turn under way sends the claim through its own turn instead; and in the turns'
-- order when the same claim takes turns too, job_claimable), then checks `until`: a turn that
-- follows sees its rows, and a turn that went first counted its grant (the turn read the clock
-- before the claim did). So limits still hold through any number of workers, a SIGKILL (the
-- grant ends at `until`; its jobs are rows), a rescue and a database restart (grants are rows).
--
-- What it costs. A grant is granted only when it takes at most half of each rate's room and the
-- running limits leave room for the reservations: a grant's unused starts stay counted until its
-- span and the period pass, so near a limit turns grant nothing and each claim takes its turn, as
-- before. A pause holds at once (each claim reads the queue's row); a lowered limit, and a queue
-- that gains limits, hold for grants within a span.

ALTER TABLE job_rate ADD COLUMN until timestamptz, ADD COLUMN reserved integer;
COMMENT ON COLUMN job_rate.until IS
    'a grant''s end (the server''s clock): its worker may claim without a turn until then';
COMMENT ON COLUMN job_rate.reserved IS 'a grant''s slots, counted as running jobs until `until`';
ALTER TABLE job_rate ADD CHECK ((until IS NULL) = (reserved IS NULL));
-- The grants that may still claim (their reservations), and those that overlap a window.
CREATE INDEX job_rate_grant_until_idx ON job_rate (queue, until) WHERE until IS NOT NULL;
CREATE INDEX job_rate_grant_at_idx ON job_rate (queue, at) WHERE until IS NOT NULL;

-- How long a grant lasts. Short: a lowered limit waits this long for the grants made before it,
-- and a grant's unused starts stay counted for its period and twice this. Long enough that a
-- worker claiming every few milliseconds takes its turn once in tens of claims.
CREATE FUNCTION job_grant_span() RETURNS interval LANGUAGE sql IMMUTABLE
AS $$ SELECT interval '100 milliseconds' $$;

-- Whether a worker's grant in the queue with id p_queue_id, ending at p_until, still lets it
-- claim now: taken the turn lock shared (never waiting), its end not passed by the server's
-- clock. False sends the claim through the queue's turn.
CREATE FUNCTION job_grant_holds(p_queue_id integer, p_until timestamptz) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN pg_try_advisory_xact_lock_shared(1785684594, p_queue_id)
           AND p_until > clock_timestamp();
END $$;

-- A key's starts (sql/013_limits_cheaper.sql), plus every grant whose span overlaps the period:
-- its starts may all be the key's.
CREATE OR REPLACE FUNCTION job_rate_key_starts(p_queue text, p_keys text[], p_since timestamptz)
RETURNS TABLE (key text, n bigint) LANGUAGE sql STABLE AS $$
    SELECT s.key, sum(s.n)::bigint FROM (
        SELECT r.concurrency_key AS key, r.n FROM unnest(p_keys) AS k(key)
        JOIN job_rate AS r
          ON r.queue = p_queue AND r.concurrency_key = k.key AND r.at > p_since
        UNION ALL
        SELECT f.key, 1 FROM job_rate AS r CROSS JOIN LATERAL unnest(r.keys) AS f(key)
        WHERE r.queue = p_queue AND r.keys IS NOT NULL AND r.at > p_since
          AND f.key = ANY(p_keys)
        UNION ALL
        SELECT k.key, r.n FROM unnest(p_keys) AS k(key)
        JOIN job_rate AS r
          ON r.queue = p_queue AND r.until IS NOT NULL
         AND r.at > p_since - 2 * job_grant_span()
    ) AS s
    GROUP BY s.key
$$;

-- A key's allowance (sql/013_limits_cheaper.sql), its running limit less p_reserved: the
-- running jobs the queue's grants count for (each grant's jobs may all be the key's).
DROP FUNCTION job_key_allowances(job_queue, text[], timestamptz, boolean, boolean);
CREATE FUNCTION job_key_allowances(
    q job_queue, p_keys text[], p_at timestamptz, p_running boolean, p_rated boolean,
    p_reserved bigint
)
RETURNS TABLE (key text, n bigint) LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT k.key, least(
        CASE WHEN p_running THEN q.max_running_per_key - coalesce(h.n, 0) - p_reserved END,
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

DROP FUNCTION job_claimable(job_queue[], integer[], timestamptz);

-- job_claimable (sql/016_limits_budget.sql), with grants: p_capacity[i], when not NULL, is the
-- claiming worker's slots in queue i, and asks for a grant; p_until[i], when not NULL, is the end
-- of the grant the worker claims queue i under. A grant's lock is taken shared in the turns'
-- order (by the queues' ids), never before a turn of a queue that comes later: a claim that held
-- one queue's lock shared while it waited for another's turn could wait for a claim that waits
-- for it. A grant that cannot take its lock shared (a turn is under way) takes the turn. A row
-- that grants has `granted` (the grant's starts, this claim's included: at least `budget`),
-- `until` and `reserved`; the caller writes it as the queue's start row (`seq` plus `granted`).
-- Every count of a turn adds the grants': the reservations to the running jobs, and to each
-- window's starts the grants made before the window that overlap it (those made within it are
-- in its `seq`).
CREATE FUNCTION job_claimable(
    p_queues job_queue[], p_slots integer[], p_capacity integer[], p_until timestamptz[],
    p_now timestamptz
)
RETURNS TABLE (
    queue text, claimed_at timestamptz, budget integer, seq bigint, rated boolean,
    keyed boolean, ids bigint[], granted integer, until timestamptz, reserved integer
) LANGUAGE plpgsql VOLATILE
ROWS 1
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
