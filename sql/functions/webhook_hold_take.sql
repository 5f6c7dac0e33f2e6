-- A hold on one of webhook address p_address's delivery slots (jobq.domain.shares), taken in
-- an order that makes the limits exact across processes: 1. lock the address (a
-- transaction-level advisory lock, class 1785684595, on the address's hash); 2. drop its holds
-- past their deadline (p_now) and count the others; 3. drop its starts before the rate window
-- (p_period before p_now) and count the others; 4. take one, held until p_held_until, unless
-- p_max_running are running or p_max_starts started in the window.
-- Returns (hold_id, retry_at): the new hold's id and NULL, or NULL and when one may be free
-- (the earliest end of a running hold, or when the oldest start leaves the window).
--
-- A take reads as many rows as the address has holds running, and two of its starts however
-- many the window holds: the address's takes run one at a time (the lock), and each numbers its
-- start one more than the last and records it no earlier than the last (at its own p_now, or at
-- the last start's time when its process's clock is behind), so the starts in the window are
-- those numbered from the window's first to its last. A clock behind another's only counts
-- more (a start recorded later than its take, a start another clock dropped counted still),
-- never fewer. Its plans use no bitmap scan: a plain index scan marks the entries of the rows
-- gone dead the first time it meets them, so that the next take does not read again every
-- hold and start that ended since the table's last vacuum. A marked entry is still stepped
-- over, so the starts before the window are dropped from the last start's kept_from on: no
-- start of the address was older when it was recorded, and each take records as its own the
-- first start it left (or its own start, the window being empty), so that the entries of the
-- starts dropped before lie behind it and no take walks them again.
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
SET enable_bitmapscan = off
AS $$
DECLARE
    running integer;
    v_started_at timestamptz;
    first_start webhook_start;
    last_start webhook_start;
BEGIN
    IF pg_current_xact_id_if_assigned() IS NOT NULL THEN
        RAISE EXCEPTION 'webhook_hold_take runs alone, in autocommit: it commits asynchronously';
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM pg_advisory_xact_lock(1785684595, hashtext(p_address));
    DELETE FROM webhook_hold WHERE address = p_address AND held_until <= p_now;
    SELECT count(*), min(held_until) INTO running, retry_at
    FROM webhook_hold WHERE address = p_address;
    IF running >= p_max_running THEN
        RETURN;
    END IF;
    SELECT * INTO last_start FROM webhook_start
    WHERE address = p_address
    ORDER BY started_at DESC, start_no DESC LIMIT 1;
    DELETE FROM webhook_start
    WHERE address = p_address AND started_at >= last_start.kept_from
      AND started_at <= p_now - p_period;
    SELECT * INTO first_start FROM webhook_start
    WHERE address = p_address AND started_at > p_now - p_period
    ORDER BY started_at, start_no LIMIT 1;
    IF last_start.start_no - first_start.start_no + 1 >= p_max_starts THEN
        retry_at := first_start.started_at + p_period;
        RETURN;
    END IF;
    retry_at := NULL;
    v_started_at := greatest(p_now, last_start.started_at);
    INSERT INTO webhook_start (address, started_at, start_no, kept_from)
    VALUES (p_address, v_started_at, coalesce(last_start.start_no, 0) + 1,
            coalesce(first_start.started_at, v_started_at));
    INSERT INTO webhook_hold (address, held_until)
    VALUES (p_address, p_held_until)
    RETURNING id INTO hold_id;
END
$$;
