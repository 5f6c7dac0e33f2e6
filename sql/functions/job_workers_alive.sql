-- The workers alive at p_now, as the rescue judges them (job_rescue; also the check, the metrics
-- and the list of workers): a worker is alive while it holds its liveness lock (a session
-- advisory lock, class 1785684593, on its listener), or while its process still has a session
-- (its application_name, `jobq/<pid>@<host>`) and its heartbeat is within p_grace. So a killed
-- process (all its sessions gone at once) is dead at once, a dropped listener alone is not, and a
-- hung worker is dead when its leases expire. After a restart of the server every session was cut
-- at once and no heartbeat could be written: for p_grace after the server's start, every worker
-- is alive, so that each can reconnect and take its lock again.
-- Behind a pooler both signs must come from direct sessions: a server connection of the pooler
-- outlives its client, and with it a session lock or an application_name. So the listener
-- connects directly (`Database.direct_dsn`) and pooled connections through a pooler send no
-- application_name (`Database.open`).
CREATE OR REPLACE FUNCTION job_workers_alive(p_now timestamptz, p_grace interval)
RETURNS TABLE (worker_id bigint) LANGUAGE sql STABLE AS $$
    SELECT objid::bigint FROM pg_locks
    WHERE locktype = 'advisory' AND classid = 1785684593 AND objsubid = 2 AND granted
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
    UNION
    SELECT w.id FROM worker AS w
    WHERE w.heartbeat_at >= p_now - p_grace
      AND EXISTS (SELECT FROM pg_stat_activity AS a
                  WHERE a.datname = current_database()
                    AND a.application_name = left('jobq/' || w.pid || '@' || w.host, 63))
    UNION
    SELECT w.id FROM worker AS w
    WHERE pg_postmaster_start_time() >= p_now - p_grace
$$;
