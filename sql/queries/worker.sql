-- name: worker_register!
INSERT INTO worker (id, host, pid, started_at, heartbeat_at)
VALUES (:worker_id, :host, :pid, :now, :now)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = EXCLUDED.heartbeat_at;

-- name: worker_next_id
SELECT nextval(pg_get_serial_sequence('worker', 'id'))::int;

-- name: worker_lock
SELECT pg_try_advisory_lock(1785684593, :worker_id::int);

-- name: worker_unregister!
DELETE FROM worker WHERE id = :worker_id;

-- name: worker_heartbeat
-- :tokens: those the worker holds. Returns how many leases were extended, the ids of the jobs
-- among them that were cancelled (a worker that missed the notification hears it here), and
-- whether this worker leads the upkeep (`job_leader`, sql/schema.sql) until :lead_expires_at: it
-- renews its lead, or takes it from a leader whose lead ran out (hung) or whose liveness lock is
-- gone (dead), with no statement of its own; unless not :offer (it is stopping). Its commit does
-- not wait for the WAL to reach the disk (synchronous_commit off for its own transaction): a
-- fleet's idle workers beat many times a second, and each flush would be a wait on the disk that
-- the commits of enqueues and claims queue behind (`python -m bench fleet`). A crash of the
-- server may lose the last beat (up to 3 x wal_writer_delay of commits): its heartbeat_at,
-- leases and lead stay as the beat before left them, which hold for several intervals (a lease
-- outlasts two: config), and after a restart every worker counts as alive for the grace
-- (job_workers_alive) while they beat again.
WITH beat AS (
    UPDATE worker SET heartbeat_at = :now WHERE id = :worker_id
), lead AS (
    INSERT INTO job_leader AS l (worker_id, expires_at)
    SELECT :worker_id, :lead_expires_at WHERE :offer
    ON CONFLICT (id) DO UPDATE SET worker_id = excluded.worker_id, expires_at = excluded.expires_at
    WHERE l.worker_id = excluded.worker_id OR l.expires_at < :now
       OR NOT EXISTS (
           SELECT FROM pg_locks
           WHERE locktype = 'advisory' AND classid = 1785684593 AND objsubid = 2
             AND objid = l.worker_id::oid AND granted
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))
    RETURNING worker_id
), leased AS (
    UPDATE job_running SET lease_expires_at = :lease_expires_at
    WHERE token = ANY(:tokens::bigint[]) AND worker_id = :worker_id
    RETURNING id, cancelled_at
)
SELECT count(*) AS leased,
       coalesce(array_agg(id) FILTER (WHERE cancelled_at IS NOT NULL), '{}') AS cancelled,
       EXISTS (SELECT FROM lead) AS leader
FROM leased
WHERE (SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL;

-- name: worker_list
-- alive: as the rescue judges (job_workers_alive)
WITH alive AS (
    SELECT worker_id FROM job_workers_alive(:now, :heartbeat_grace)
)
SELECT w.id, w.host, w.pid, w.started_at, w.heartbeat_at,
       w.id IN (SELECT worker_id FROM alive) AS alive,
       (SELECT count(*) FROM job_running AS r WHERE r.worker_id = w.id) AS running_jobs
FROM worker AS w
ORDER BY w.id;

-- name: worker_wake
-- Wake the workers listening on :channel (an empty notification, sent when the transaction
-- commits).
SELECT pg_notify(:channel, '');
