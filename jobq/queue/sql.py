"""The queue's statements. Each state change is one statement; names are noun first.

Every time-based statement takes the time as a parameter (the app clock); none uses now().
"""

WORKER_LOCK_CLASS = 1785684593
"""classid ('jobq') of the session advisory locks that tell a worker is alive; objid = worker id."""

_COLUMNS = (
    "id, job_type, arguments, ripe_at, priority, attempts, max_retries, last_error, created_at"
)

job_enqueue = """
WITH queued AS (
    INSERT INTO job (job_type, arguments, ripe_at, priority, max_retries, created_at)
    VALUES ($1, $2::jsonb, $3, $4, $5, $6)
    ON CONFLICT (md5) DO NOTHING
    RETURNING id
)
SELECT id, false AS duplicate FROM queued
UNION ALL
SELECT id, true FROM job
WHERE md5 = md5($1 || $2::jsonb::text) AND NOT EXISTS (SELECT FROM queued)
"""

job_enqueue_many = """
INSERT INTO job (job_type, arguments, ripe_at, priority, max_retries, created_at)
SELECT t, a::jsonb, r, p, m, $6
FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::smallint[], $5::int[])
     AS u(t, a, r, p, m)
ON CONFLICT (md5) DO NOTHING
RETURNING id
"""

# $1 now, $2 max jobs, $3 worker id, $4 lease expiry
job_claim = f"""
WITH claimed AS (
    DELETE FROM job
    WHERE id = ANY(ARRAY(
        SELECT id FROM job
        WHERE ripe_at <= $1
        ORDER BY priority DESC, ripe_at
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING {_COLUMNS}
)
INSERT INTO job_running ({_COLUMNS}, worker_id, claimed_at, lease_expires_at, token)
SELECT {_COLUMNS}, $3, $1, $4, nextval('job_fencing_token')
FROM claimed
RETURNING id, job_type, arguments, attempts, max_retries, token, ripe_at, claimed_at
"""

# $1 tokens
job_complete = """
DELETE FROM job_running WHERE token = ANY($1::bigint[]) RETURNING id
"""

# $1 token, $2 ripe_at, $3 last error, $4 attempts charged (1 for a failure, 0 for a release)
job_retry = f"""
WITH failed AS (
    DELETE FROM job_running WHERE token = $1 RETURNING {_COLUMNS}
), queued AS (
    INSERT INTO job ({_COLUMNS})
    SELECT id, job_type, arguments, $2, priority, attempts + $4, max_retries,
           coalesce($3, last_error), created_at
    FROM failed
    ON CONFLICT (md5) DO NOTHING
)
SELECT count(*) FROM failed
"""

# $1 token, $2 now, $3 last error
job_bury = """
WITH failed AS (
    DELETE FROM job_running WHERE token = $1
    RETURNING id, job_type, arguments, priority, attempts, max_retries, created_at
), buried AS (
    INSERT INTO job_dead
        (id, job_type, arguments, priority, attempts, max_retries, last_error, created_at, died_at)
    SELECT id, job_type, arguments, priority, attempts + 1, max_retries, $3, created_at, $2
    FROM failed
)
SELECT count(*) FROM failed
"""

# $1 worker id, $2 host, $3 pid, $4 now
worker_register = """
INSERT INTO worker (id, host, pid, started_at, heartbeat_at)
VALUES ($1, $2, $3, $4, $4)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = EXCLUDED.heartbeat_at
"""

worker_next_id = "SELECT nextval(pg_get_serial_sequence('worker', 'id'))::int"

worker_lock = "SELECT pg_try_advisory_lock($1::int, $2::int)"

worker_unregister = "DELETE FROM worker WHERE id = $1"

# $1 worker id, $2 now, $3 lease expiry, $4 tokens held
worker_heartbeat = """
WITH beat AS (
    UPDATE worker SET heartbeat_at = $2 WHERE id = $1
)
UPDATE job_running SET lease_expires_at = $3
WHERE token = ANY($4::bigint[]) AND worker_id = $1
"""

_LIVE_WORKERS = f"""
    SELECT objid::bigint AS worker_id FROM pg_locks
    WHERE locktype = 'advisory' AND classid = {WORKER_LOCK_CLASS} AND objsubid = 2 AND granted
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""

# $1 now, $2 last error. A rescue charges an attempt: a job that kills its worker every time
# must end in the dead letter rather than crash workers forever.
job_rescue = f"""
WITH live AS ({_LIVE_WORKERS}
), lost AS (
    DELETE FROM job_running
    WHERE lease_expires_at < $1 OR worker_id NOT IN (SELECT worker_id FROM live)
    RETURNING {_COLUMNS}
), queued AS (
    INSERT INTO job ({_COLUMNS})
    SELECT id, job_type, arguments, $1, priority, attempts + 1, max_retries, $2, created_at
    FROM lost WHERE attempts < max_retries
    ON CONFLICT (md5) DO NOTHING
), buried AS (
    INSERT INTO job_dead
        (id, job_type, arguments, priority, attempts, max_retries, last_error, created_at, died_at)
    SELECT id, job_type, arguments, priority, attempts + 1, max_retries, $2, created_at, $1
    FROM lost WHERE attempts >= max_retries
), gone AS (
    DELETE FROM worker WHERE id NOT IN (SELECT worker_id FROM live)
)
SELECT count(*) FROM lost
"""

# $1 now
job_next_ripe_at = "SELECT min(ripe_at) FROM job WHERE ripe_at > $1"

# $1 now
job_stats = """
SELECT job_type,
       count(*) FILTER (WHERE state = 'queued' AND ripe_at <= $1) AS ripe,
       count(*) FILTER (WHERE state = 'queued' AND ripe_at > $1) AS scheduled,
       count(*) FILTER (WHERE state = 'running') AS running,
       count(*) FILTER (WHERE state = 'dead') AS dead
FROM (
    SELECT job_type, 'queued' AS state, ripe_at FROM job
    UNION ALL SELECT job_type, 'running', NULL FROM job_running
    UNION ALL SELECT job_type, 'dead', NULL FROM job_dead
) AS jobs
GROUP BY job_type
ORDER BY job_type
"""
