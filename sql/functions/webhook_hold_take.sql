-- A hold on one of webhook address p_address's delivery slots (jobq.domain.shares), taken in
-- an order that makes the limits exact across processes: 1. lock the address (a
-- transaction-level advisory lock, class 1785684595, on the address's hash); 2. drop its rows
-- that ended and started before the rate window (p_period before p_now); 3. count its holds
-- running (held_until after p_now) and those started within the window; 4. take one, held
-- until p_held_until, unless p_max_running are running or p_max_starts started in the window.
-- Returns (hold_id, retry_at): the new hold's id and NULL, or NULL and when one may be free
-- (the earliest end of a running hold, or when the oldest start leaves the window).
--
-- It runs alone, in autocommit (asserted), and commits asynchronously: the address's lock is
-- held until the commit, and a commit that waited for the WAL flush would make the takes of one
-- address wait for each other's flushes. A new hold is made durable before its attempt starts,
-- by the caller (webhook_hold_confirm, with the flushes of every concurrent commit): a crash
-- loses only holds whose attempts have not started.
CREATE OR REPLACE FUNCTION webhook_hold_take(
    p_address text, p_now timestamptz, p_held_until timestamptz, p_max_running integer,
    p_max_starts integer, p_period interval, OUT hold_id bigint, OUT retry_at timestamptz)
LANGUAGE plpgsql
AS $$
DECLARE
    running integer;
    started integer;
BEGIN
    IF pg_current_xact_id_if_assigned() IS NOT NULL THEN
        RAISE EXCEPTION 'webhook_hold_take runs alone, in autocommit: it commits asynchronously';
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM pg_advisory_xact_lock(1785684595, hashtext(p_address));
    DELETE FROM webhook_hold
    WHERE address = p_address AND held_until <= p_now AND started_at <= p_now - p_period;
    SELECT count(*) FILTER (WHERE held_until > p_now),
           count(*) FILTER (WHERE started_at > p_now - p_period),
           CASE WHEN count(*) FILTER (WHERE held_until > p_now) >= p_max_running
                THEN min(held_until) FILTER (WHERE held_until > p_now)
                ELSE min(started_at) FILTER (WHERE started_at > p_now - p_period) + p_period
           END
    INTO running, started, retry_at
    FROM webhook_hold WHERE address = p_address;
    IF running >= p_max_running OR started >= p_max_starts THEN
        RETURN;
    END IF;
    retry_at := NULL;
    INSERT INTO webhook_hold (address, started_at, held_until)
    VALUES (p_address, p_now, p_held_until)
    RETURNING id INTO hold_id;
END
$$;
