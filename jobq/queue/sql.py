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

_DEAD_COLUMNS = (
    "id, job_type, arguments, priority, attempts, max_retries, last_error, created_at, died_at"
)


def _back_to_queue(source: str, *, ripe_at: str, attempts: str, error: str, now: str) -> str:
    """CTEs that put the rows of CTE `source` back in `job`, ripe at `ripe_at`. The
    expressions name the source's columns as `s.<column>`.

    A row identical to a job queued meanwhile (same md5) is merged into it: that job ripens
    no later than this one would have, and this one's end is recorded in `job_dead` as
    "merged into queued duplicate job N" — a job is never simply gone.
    """
    return f"""
requeued AS (
    INSERT INTO job ({_COLUMNS})
    SELECT s.id, s.job_type, s.arguments, {ripe_at}, s.priority, {attempts}, s.max_retries,
           {error}, s.created_at
    FROM {source} AS s
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


# $1 completed tokens
_COMPLETED = """completed AS (
    DELETE FROM job_running WHERE token = ANY($1::bigint[]) RETURNING token
)"""

# $1 completed tokens; re-queued: $2 tokens, $3 ripe_at, $4 last errors (NULL: keep it),
# $5 attempts charged (1 for a failure, 0 for a release); buried: $6 tokens, $7 errors; $8 now.
# Every outcome names its job's fencing token: a stale token (the job was rescued) matches no
# row and changes nothing. CTE `recorded` holds the tokens recorded.
_RECORD = f"""
{_COMPLETED}, failed AS (
    DELETE FROM job_running AS r
    USING unnest($2::bigint[], $3::timestamptz[], $4::text[], $5::int[])
          AS u(token, ripe_at, error, charge)
    WHERE r.token = u.token
    RETURNING r.token, r.id, r.job_type, r.arguments, r.priority,
              -- a release keeps the job's place in the queue; a retry waits its backoff
              CASE WHEN u.charge = 0 THEN least(r.ripe_at, u.ripe_at) ELSE u.ripe_at END
                  AS next_ripe_at,
              r.attempts + u.charge AS next_attempts, r.max_retries,
              coalesce(u.error, r.last_error) AS next_error, r.created_at
), {
    _back_to_queue(
        "failed",
        ripe_at="s.next_ripe_at",
        attempts="s.next_attempts",
        error="s.next_error",
        now="$8::timestamptz",
    )
}, buried AS (
    DELETE FROM job_running AS r
    USING unnest($6::bigint[], $7::text[]) AS u(token, error)
    WHERE r.token = u.token
    RETURNING r.token, r.id, r.job_type, r.arguments, r.priority, r.attempts, r.max_retries,
              u.error, r.created_at
), dead AS (
    INSERT INTO job_dead ({_DEAD_COLUMNS})
    SELECT id, job_type, arguments, priority, attempts + 1, max_retries, error, created_at, $8
    FROM buried
), recorded AS (
    SELECT token FROM completed
    UNION ALL SELECT token FROM failed
    UNION ALL SELECT token FROM buried
)"""

job_record = f"WITH {_RECORD}\nSELECT token FROM recorded"


def _claiming(record: str, recorded: str, *, now: str, limit: str, worker: str, lease: str) -> str:
    """A statement that records outcomes (CTEs `record`, tokens in CTE `recorded`) and claims up
    to `limit` ripe jobs for `worker` in one go: the jobs whose outcome is recorded free the slots
    that the claim fills. It returns the claimed jobs, then one row per recorded token (id NULL).
    """
    return f"""
WITH {record}, claimed AS (
    DELETE FROM job
    WHERE id = ANY(ARRAY(
        SELECT id FROM job
        WHERE ripe_at <= {now}
        ORDER BY priority DESC, ripe_at
        LIMIT {limit}
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING {_COLUMNS}
), running AS (
    INSERT INTO job_running ({_COLUMNS}, worker_id, claimed_at, lease_expires_at, token)
    SELECT {_COLUMNS}, {worker}, {now}, {lease}, nextval('job_fencing_token')
    FROM claimed
    RETURNING token, id, job_type, arguments, attempts, max_retries, ripe_at, claimed_at
)
SELECT * FROM running
UNION ALL
SELECT token, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM {recorded}
"""


# $1 completed tokens, $2 now, $3 max jobs, $4 worker id, $5 lease expiry. The usual claim: the
# jobs that finished since the last one all succeeded.
job_claim = _claiming(_COMPLETED, "completed", now="$2", limit="$3", worker="$4", lease="$5")

# $1..$8 outcomes and now (as in `_RECORD`), $9 max jobs, $10 worker id, $11 lease expiry. The
# claim when some of the jobs that finished failed or were released.
job_claim_recording = _claiming(
    _RECORD, "recorded", now="$8", limit="$9", worker="$10", lease="$11"
)

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
# is not, and a hung worker is dead when its leases expire. After a restart of the server every
# session was cut at once and no heartbeat could be written: for the grace after the server's
# start, every worker is alive, so that each can reconnect and take its lock again.
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
    UNION
    SELECT w.id FROM worker AS w
    WHERE pg_postmaster_start_time() >= $1::timestamptz - $2::interval
"""

# $1 now, $2 heartbeat grace, $3 last error. A rescue charges an attempt: a job that kills its
# worker every time must end in the dead letter rather than crash workers forever. A rescued
# job keeps its place in the queue (its own ripe_at), ahead of jobs that ripened since.
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
        ripe_at="least(s.ripe_at, $1::timestamptz)",
        attempts="s.attempts + 1",
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

# $1 worker id, $2 tokens the worker holds, $3 now. Claims of the worker whose answer never
# reached it (its connection was cut as the claim committed): it never started those jobs. They
# go back to the queue at their place, with no attempt charged.
job_release_orphans = f"""
WITH orphans AS (
    DELETE FROM job_running WHERE worker_id = $1 AND NOT (token = ANY($2::bigint[]))
    RETURNING {_COLUMNS}
), {
    _back_to_queue(
        "orphans",
        ripe_at="least(s.ripe_at, $3::timestamptz)",
        attempts="s.attempts",
        error="s.last_error",
        now="$3::timestamptz",
    )
}
SELECT count(*) FROM orphans
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

# -- the invariants' check (`jobq.check`): read-only, run in one REPEATABLE READ snapshot -------

# $1 max ids returned. Jobs in more than one of job, job_running, job_dead.
check_places = """
WITH twice AS (
    SELECT id FROM job JOIN job_running USING (id)
    UNION SELECT id FROM job JOIN job_dead USING (id)
    UNION SELECT id FROM job_running JOIN job_dead USING (id)
)
SELECT count(*) AS violations, coalesce((array_agg(id ORDER BY id))[1:$1], '{}') AS sample
FROM twice
"""

# $1 now, $2 heartbeat grace, $3 rescue grace, $4 max ids returned. Running jobs that no live
# worker holds and that the rescue should have returned more than `rescue grace` ago: their
# lease expired, or their worker is dead (as the rescue judges it, `_ALIVE`) and its last sign
# of life (heartbeat, or the claim when its row is gone) is that old.
check_running = f"""
WITH alive AS ({_ALIVE}
), overdue AS (
    SELECT r.id FROM job_running AS r LEFT JOIN worker AS w ON w.id = r.worker_id
    WHERE r.lease_expires_at < $1::timestamptz - $3::interval
       OR (r.worker_id NOT IN (SELECT worker_id FROM alive)
           AND coalesce(w.heartbeat_at, r.claimed_at) < $1::timestamptz - $3::interval)
)
SELECT count(*) AS violations, coalesce((array_agg(id ORDER BY id))[1:$4], '{{}}') AS sample
FROM overdue
"""

# $1 max ids returned. Queued or running jobs past their last attempt (they belong in job_dead).
check_attempts = """
WITH over AS (
    SELECT id FROM job WHERE attempts > max_retries
    UNION ALL SELECT id FROM job_running WHERE attempts > max_retries
)
SELECT count(*) AS violations, coalesce((array_agg(id ORDER BY id))[1:$1], '{}') AS sample
FROM over
"""

# $1 now, $2 heartbeat grace. Jobs per state, and workers alive or not (as the rescue judges).
check_counts = f"""
WITH alive AS ({_ALIVE}
)
SELECT (SELECT count(*) FROM job WHERE ripe_at <= $1) AS queued_ripe,
       (SELECT count(*) FROM job WHERE ripe_at > $1) AS queued_scheduled,
       (SELECT count(*) FROM job_running) AS running,
       (SELECT count(*) FROM job_running WHERE lease_expires_at < $1) AS running_lease_expired,
       (SELECT count(*) FROM job_dead) AS dead,
       (SELECT count(*) FROM worker WHERE id IN (SELECT worker_id FROM alive)) AS workers_alive,
       (SELECT count(*) FROM worker WHERE id NOT IN (SELECT worker_id FROM alive)) AS workers_dead
"""

# -- what pins the vacuum horizon (`/jobs/stats`) ---------------------------------------------

# $1 now. Age of the oldest transaction open in this database, other than the caller's: while
# it lasts, vacuum can remove no row deleted after it began, so the queue tables' dead tuples
# pile up (a claim then steps over them).
job_stats_oldest_transaction = """
SELECT greatest(0, extract(epoch FROM $1::timestamptz - min(xact_start)))::float8
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL
"""

# Live and dead tuples of the queue tables (as the statistics collector last heard), and their
# last autovacuum.
job_stats_tables = """
SELECT relname AS table, n_live_tup, n_dead_tup, last_autovacuum AS last_autovacuum_at
FROM pg_stat_user_tables
WHERE relname IN ('job', 'job_running', 'job_dead') AND schemaname = current_schema()
ORDER BY relname
"""
