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

_DEAD_COLUMNS = (
    "id, job_type, arguments, priority, attempts, max_retries, last_error, created_at, died_at"
)


def _back_to_queue(source: str, *, ripe_at: str, attempts: str, error: str, now: str) -> str:
    """CTEs that put the rows of CTE `source` back in `job`, ripe at `ripe_at`.

    A row identical to a job queued meanwhile (same md5) is merged into it: that job ripens
    no later than this one would have, and this one's end is recorded in `job_dead` as
    "merged into queued duplicate job N" — a job is never simply gone.
    """
    return f"""
requeued AS (
    INSERT INTO job ({_COLUMNS})
    SELECT id, job_type, arguments, {ripe_at}, priority, {attempts}, max_retries, {error},
           created_at
    FROM {source}
    ON CONFLICT (md5) DO NOTHING
    RETURNING id
), hastened AS (
    UPDATE job SET ripe_at = least(job.ripe_at, {ripe_at})
    FROM {source} AS s
    WHERE job.md5 = md5(s.job_type || s.arguments::text)
      AND s.id NOT IN (SELECT id FROM requeued)
    RETURNING job.id, s.id AS merged_id
), merged AS (
    INSERT INTO job_dead ({_DEAD_COLUMNS})
    SELECT s.id, s.job_type, s.arguments, s.priority, {attempts}, s.max_retries,
           coalesce('merged into queued duplicate job ' || h.id, 'merged into a queued duplicate'),
           s.created_at, {now}
    FROM {source} AS s LEFT JOIN hastened AS h ON h.merged_id = s.id
    WHERE s.id NOT IN (SELECT id FROM requeued)
)"""


# $1 token, $2 ripe_at, $3 last error (NULL: keep it), $4 attempts charged (1 for a failure,
# 0 for a release), $5 now
job_retry = f"""
WITH failed AS (
    DELETE FROM job_running WHERE token = $1 RETURNING {_COLUMNS}
), {
    _back_to_queue(
        "failed",
        ripe_at="$2::timestamptz",
        attempts="attempts + $4",
        error="coalesce($3, last_error)",
        now="$5::timestamptz",
    )
}
SELECT count(*) FROM failed
"""

# $1 token, $2 now, $3 last error
job_bury = f"""
WITH failed AS (
    DELETE FROM job_running WHERE token = $1
    RETURNING id, job_type, arguments, priority, attempts, max_retries, created_at
), buried AS (
    INSERT INTO job_dead ({_DEAD_COLUMNS})
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

APPLICATION_NAME = "left('jobq/' || {w}.pid || '@' || {w}.host, 63)"
"""The `application_name` of every session of the worker process of row `{w}` (jobq.db)."""

# $1 now, $2 heartbeat grace. A worker is alive while it holds its liveness lock, or while
# its process still has a session and its heartbeat is recent (its listener is reconnecting).
# So a killed process (all its sessions gone at once) is dead at once, a dropped listener alone
# is not, and a hung worker is dead when its leases expire.
_ALIVE = f"""
    SELECT objid::bigint AS worker_id FROM pg_locks
    WHERE locktype = 'advisory' AND classid = {WORKER_LOCK_CLASS} AND objsubid = 2 AND granted
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
    UNION
    SELECT w.id FROM worker AS w
    WHERE w.heartbeat_at >= $1::timestamptz - $2::interval
      AND EXISTS (SELECT FROM pg_stat_activity AS a
                  WHERE a.datname = current_database()
                    AND a.application_name = {APPLICATION_NAME.format(w="w")})
"""

# $1 now, $2 heartbeat grace, $3 last error. A rescue charges an attempt: a job that kills its
# worker every time must end in the dead letter rather than crash workers forever.
job_rescue = f"""
WITH alive AS ({_ALIVE}
), lost AS (
    DELETE FROM job_running
    WHERE lease_expires_at < $1 OR worker_id NOT IN (SELECT worker_id FROM alive)
    RETURNING {_COLUMNS}
), retrying AS (
    SELECT * FROM lost WHERE attempts < max_retries
), {
    _back_to_queue(
        "retrying",
        ripe_at="$1::timestamptz",
        attempts="attempts + 1",
        error="$3::text",
        now="$1::timestamptz",
    )
}, buried AS (
    INSERT INTO job_dead ({_DEAD_COLUMNS})
    SELECT id, job_type, arguments, priority, attempts + 1, max_retries, $3, created_at, $1
    FROM lost WHERE attempts >= max_retries
), gone AS (
    DELETE FROM worker WHERE id NOT IN (SELECT worker_id FROM alive)
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
