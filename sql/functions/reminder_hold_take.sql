-- Take a hold on one more unsent reminder of user p_user_id, whose unsent reminders plus holds
-- may number p_max: returns the hold's id (the id its reminder will have, from the reminders'
-- sequence); hold_id NULL when the user is at the cap; no row for an unknown user. It runs
-- alone, in autocommit (asserted), and commits asynchronously.
--
-- Why it is exact (READ COMMITTED): every take updates the user's row of reminder_quotas, so
-- takes of one user run one at a time, each from its UPDATE to its commit. The fast path's
-- UPDATE re-checks `taken < p_max` on the row's newest version once it has the row, and `taken`
-- is never below the committed unsent reminders plus holds (a request's commit swaps its hold for
-- its reminder: the sum does not move; sends, deletes and releases only lower it). The slow path
-- takes the row's lock first, then counts in later statements, each with a snapshot taken after
-- the lock was granted: it sees every earlier take's hold, every committed reminder.
--
-- Why nobody waits on a request's commit: the row is held only by this short transaction, never
-- by the request's. Its commit does not wait for the WAL flush (synchronous_commit off), so the
-- next take of the user does not wait for it either; a crash can lose the hold only with every
-- later record, the request's commit included (WAL is replayed in order).
--
-- A hold whose request died (a killed process) stays until a slow path drops it: older than
-- p_grace and not locked (a request's transaction locks its hold when it deletes it).
CREATE OR REPLACE FUNCTION reminder_hold_take(
    p_user_id bigint, p_max integer, p_now timestamptz, p_grace interval
) RETURNS TABLE (hold_id bigint) LANGUAGE plpgsql AS $$
DECLARE
    v_held bigint;
BEGIN
    IF pg_current_xact_id_if_assigned() IS NOT NULL THEN
        RAISE EXCEPTION 'reminder_hold_take runs alone, in autocommit: it commits asynchronously';
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    UPDATE reminder_quotas AS q SET taken = q.taken + 1
    WHERE q.user_id = p_user_id AND q.taken < p_max;
    IF NOT FOUND THEN
        PERFORM FROM users AS u WHERE u.id = p_user_id;
        IF NOT FOUND THEN
            RETURN;
        END IF;
        INSERT INTO reminder_quotas AS q (user_id, taken) VALUES (p_user_id, 0)
        ON CONFLICT (user_id) DO UPDATE SET taken = q.taken;
        DELETE FROM reminder_holds AS h
        WHERE h.id IN (SELECT d.id FROM reminder_holds AS d
                       WHERE d.user_id = p_user_id AND d.taken_at < p_now - p_grace
                       FOR UPDATE SKIP LOCKED);
        SELECT (SELECT count(*) FROM reminders AS r
                WHERE r.user_id = p_user_id AND r.sent_at IS NULL)
             + (SELECT count(*) FROM reminder_holds AS h WHERE h.user_id = p_user_id)
        INTO v_held;
        IF v_held >= p_max THEN
            UPDATE reminder_quotas AS q SET taken = v_held WHERE q.user_id = p_user_id;
            RETURN QUERY SELECT NULL::bigint;
            RETURN;
        END IF;
        UPDATE reminder_quotas AS q SET taken = v_held + 1 WHERE q.user_id = p_user_id;
    END IF;
    RETURN QUERY
    INSERT INTO reminder_holds AS h (id, user_id, taken_at)
    VALUES (nextval('reminders_id_seq'), p_user_id, p_now)
    RETURNING h.id;
END
$$;
