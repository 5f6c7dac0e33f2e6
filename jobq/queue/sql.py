"""The queue's statements. Each state change is one statement; names are noun first.

Every time-based statement takes the time as a parameter (the app clock); none uses now().
Parameters are named (`:now`, `:worker_id`); `Query` numbers them for asyncpg, in the order
they first appear, so the fragments shared by several statements (`_RECORD`, `_ALIVE`,
`_back_to_queue`) never shift a number. `python -m jobq sql NAME` prints a statement
whole, as PostgreSQL receives it, with its parameters in order.
"""

from __future__ import annotations

import re
from typing import Any

from jobq.db import Connection

_PARAMETER = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)")


class Query:
    """A statement with named parameters (`:name`, never inside `::type` casts), sent with
    positional ones (`$1`...) in the order the names first appear in it."""

    def __init__(self, text: str) -> None:
        names: list[str] = []

        def number(match: re.Match[str]) -> str:
            if match.group(1) not in names:
                names.append(match.group(1))
            return f"${names.index(match.group(1)) + 1}"

        self.text = _PARAMETER.sub(number, text)
        self.params = tuple(names)

    def args(self, **values: Any) -> list[Any]:
        """The positional arguments for `values` (one per named parameter).
        Raises: `TypeError` when a parameter is missing or unknown."""
        if set(values) != set(self.params):
            missing, unknown = set(self.params) - set(values), set(values) - set(self.params)
            raise TypeError(f"parameters missing: {sorted(missing)}, unknown: {sorted(unknown)}")
        return [values[name] for name in self.params]

    async def fetch(self, conn: Connection, **values: Any) -> list[Any]:
        """Run it on `conn` and return its rows."""
        return await conn.fetch(self.text, *self.args(**values))

    async def fetchrow(self, conn: Connection, **values: Any) -> Any:
        """Run it on `conn` and return its first row, or None."""
        return await conn.fetchrow(self.text, *self.args(**values))

    async def fetchval(self, conn: Connection, **values: Any) -> Any:
        """Run it on `conn` and return the first column of its first row, or None."""
        return await conn.fetchval(self.text, *self.args(**values))

    async def execute(self, conn: Connection, **values: Any) -> str:
        """Run it on `conn` and return its status (`UPDATE 3`)."""
        return await conn.execute(self.text, *self.args(**values))


WORKER_LOCK_CLASS = 1785684593
"""classid ('jobq') of the session advisory locks that tell a worker is alive; objid = worker id."""

_COLUMNS = (
    "id, job_type, arguments, ripe_at, priority, attempts, max_retries, last_error, created_at,"
    " queue, concurrency_key, awaited, unique_mode, unique_key"
)

_KEY = "md5({t}job_type || coalesce('#' || {t}unique_key, {t}arguments::text))"
"""A job's uniqueness key (`job.md5` for the `queued` mode, `job_unique.md5` for the others),
over the columns of table alias `{t}` (with its dot)."""

# One job of the `Unique` modes `none` or `queued` (`store.enqueue`): the insert, whose md5
# job_md5_key checks for `queued`. Returns the new job's id, or its queued twin's with
# duplicate true; no row when the twin committed after this statement's snapshot, or was
# claimed meanwhile (the caller tries again).
job_enqueue = Query("""
WITH queued AS (
    INSERT INTO job (job_type, arguments, ripe_at, priority, max_retries, created_at, queue,
                     concurrency_key, unique_mode, unique_key)
    VALUES (:job_type, :arguments::jsonb, :ripe_at, :priority, :max_retries, :now, :queue,
            :concurrency_key, :unique_mode, :unique_key)
    ON CONFLICT (md5) DO NOTHING
    RETURNING id
)
SELECT id, false AS duplicate FROM queued
UNION ALL
SELECT id, true FROM job
WHERE md5 = md5(:job_type || coalesce('#' || :unique_key::text, :arguments::jsonb::text))
  AND :unique_mode = 'queued' AND NOT EXISTS (SELECT FROM queued)
""")

# One job of the modes `active` or `period`: first take its key in job_unique, or take it over
# when its job is no longer queued or running (`active`) or its period is over; then the job.
# Returns as `job_enqueue` does (the twin is the key's job).
job_enqueue_held = Query("""
WITH new AS (
    SELECT nextval(pg_get_serial_sequence('job', 'id')) AS id,
           md5(:job_type::text || coalesce('#' || :unique_key::text, :arguments::jsonb::text))
               AS md5
), held AS (
    INSERT INTO job_unique AS u (md5, job_id, until)
    SELECT new.md5, new.id,
           CASE WHEN :unique_mode::text = 'period' THEN :now::timestamptz + :period::interval END
    FROM new
    ON CONFLICT (md5) DO UPDATE SET job_id = EXCLUDED.job_id, until = EXCLUDED.until
    WHERE CASE WHEN u.until IS NULL THEN NOT job_is_active(u.job_id) ELSE u.until <= :now END
    RETURNING job_id
), queued AS (
    INSERT INTO job (id, job_type, arguments, ripe_at, priority, max_retries, created_at, queue,
                     concurrency_key, unique_mode, unique_key)
    SELECT held.job_id, :job_type, :arguments::jsonb, :ripe_at, :priority, :max_retries, :now,
           :queue, :concurrency_key, :unique_mode, :unique_key
    FROM held
    RETURNING id
)
SELECT id, false AS duplicate FROM queued
UNION ALL
SELECT u.job_id, true FROM job_unique AS u, new
WHERE u.md5 = new.md5 AND NOT EXISTS (SELECT FROM held)
""")

# A duplicate's twin, queued, ripens no later than :ripe_at (`Unique.on_conflict` `earlier`).
job_hasten = Query("UPDATE job SET ripe_at = :ripe_at WHERE id = :job_id AND ripe_at > :ripe_at")

# Many jobs of the modes `none` and `queued` (`store.enqueue_many`); the duplicates of queued
# jobs are skipped, and the twins of those with :hasten ripen no later than they would have.
job_enqueue_many = Query("""
WITH u AS (
    SELECT * FROM unnest(:job_types::text[], :arguments::text[], :ripe_ats::timestamptz[],
                         :priorities::smallint[], :max_retries::int[], :queues::text[],
                         :concurrency_keys::text[], :unique_modes::text[], :unique_keys::text[],
                         :hasten::boolean[]) AS u(t, a, r, p, m, q, k, um, uk, h)
), queued AS (
    INSERT INTO job (job_type, arguments, ripe_at, priority, max_retries, created_at, queue,
                     concurrency_key, unique_mode, unique_key)
    SELECT t, a::jsonb, r, p, m, :now, q, k, um, uk FROM u
    ON CONFLICT (md5) DO NOTHING
    RETURNING id, queue, job_type
), hastened AS (
    UPDATE job SET ripe_at = u.r
    FROM u
    WHERE u.h AND u.um = 'queued' AND job.md5 = md5(u.t || coalesce('#' || u.uk, u.a::jsonb::text))
      AND job.ripe_at > u.r
)
SELECT id, queue, job_type FROM queued
""")

_DEAD_COLUMNS = (
    "id, job_type, arguments, priority, attempts, max_retries, last_error, created_at, died_at,"
    " queue, concurrency_key"
)


_DONE_COLUMNS = (
    "id, job_type, queue, arguments, state, attempts, last_error, result, created_at, finished_at"
)

NOTIFY_ENDED = "(SELECT count(pg_notify('jobq_done', id::text)) FROM {source} WHERE awaited) >= 0"
"""A condition that notifies `jobq_done` with the id of each awaited job of CTE `{source}` (the
jobs that ended): `wait_for` hears it. PostgreSQL sends it at the commit."""


def _into_done(
    name: str,
    source: str,
    *,
    state: str,
    attempts: str,
    error: str = "s.last_error",
    result: str = "NULL",
) -> str:
    """CTE `name`: the rows of `source` (named `s`) into `job_done`, finished at `:now`, as
    `state` with `attempts`, `error` and `result`; nothing when `:retain` is false (retention
    off)."""
    return f"""{name} AS (
    INSERT INTO job_done ({_DONE_COLUMNS})
    SELECT s.id, s.job_type, s.queue, s.arguments, {state}, {attempts}, {error}, {result},
           s.created_at, :now::timestamptz
    FROM {source} AS s
    WHERE :retain::boolean
)"""


def _back_to_queue(
    source: str, *, ripe_at: str, attempts: str, error: str, now: str, ran: str = "s.attempts + 1"
) -> str:
    """CTEs that put the rows of CTE `source` back in `job`, ripe at `ripe_at`, except those
    cancelled meanwhile (`cancelled_at`: they end in `job_done`, CTE `cancelled`, with `ran`
    attempts). The expressions name the source's columns as `s.<column>`.

    A row identical to a job queued meanwhile (same md5) is merged into it: that job ripens
    no later than this one would have, and this one's end is recorded in `job_dead` as
    "merged into queued duplicate job N" — a job is never simply gone.
    """
    return f"""
live AS (
    SELECT * FROM {source} WHERE cancelled_at IS NULL
), {
        _into_done(
            "cancelled",
            f"(SELECT * FROM {source} WHERE cancelled_at IS NOT NULL)",
            state="'cancelled'",
            attempts=ran,
            error=error,
        )
    },
requeued AS (
    INSERT INTO job ({_COLUMNS})
    SELECT s.id, s.job_type, s.arguments, {ripe_at}, s.priority, {attempts}, s.max_retries,
           {error}, s.created_at, s.queue, s.concurrency_key, s.awaited, s.unique_mode,
           s.unique_key
    FROM live AS s
    ON CONFLICT (md5) DO NOTHING
    RETURNING id
), hastened AS (
    UPDATE job SET ripe_at = least(job.ripe_at, {ripe_at})
    FROM live AS s
    WHERE s.unique_mode = 'queued' AND job.md5 = {_KEY.format(t="s.")}
      AND s.id NOT IN (SELECT id FROM requeued)
    RETURNING job.id, s.id AS merged_id
), merged AS (
    INSERT INTO job_dead ({_DEAD_COLUMNS})
    SELECT s.id, s.job_type, s.arguments, s.priority, {attempts}, s.max_retries,
           coalesce('merged into queued duplicate job ' || h.id, 'merged into a queued duplicate'),
           s.created_at, {now}, s.queue, s.concurrency_key
    FROM live AS s LEFT JOIN hastened AS h ON h.merged_id = s.id
    WHERE s.id NOT IN (SELECT id FROM requeued)
)"""


# :completed tokens, :results (their results as JSON text, NULL: none), :retain, :now. A job
# cancelled while it ran ends `cancelled`, its result dropped.
_COMPLETED = f"""completed AS (
    DELETE FROM job_running WHERE token = ANY(:completed::bigint[])
    RETURNING token, id, job_type, queue, arguments, attempts, last_error, created_at, awaited,
              cancelled_at
), {
    _into_done(
        "succeeded",
        "(SELECT c.*, u.result FROM completed AS c JOIN unnest(:completed::bigint[],"
        " :results::text[]) AS u(token, result) USING (token))",
        state="CASE WHEN s.cancelled_at IS NULL THEN 'succeeded' ELSE 'cancelled' END",
        attempts="s.attempts + 1",
        result="CASE WHEN s.cancelled_at IS NULL THEN s.result::jsonb END",
    )
}"""

# :completed tokens; re-queued: :failed tokens, :failed_ripe_ats, :failed_errors (NULL: keep
# it), :failed_charges (attempts charged: 1 for a failure, 0 for a release or a snooze),
# :failed_ripe_ats NULL for a release (it keeps its place: its own ripe_at); :buried tokens,
# :buried_errors; :failed_tracebacks, :buried_tracebacks (NULL: none); :now.
# A failure (charged) and a burial write the attempt's error and traceback to job_attempt.
# Every outcome names its job's fencing token: a stale token (the job was rescued) matches no
# row and changes nothing. CTE `recorded` holds the tokens recorded.
_RECORD = f"""
{_COMPLETED}, failed AS (
    DELETE FROM job_running AS r
    USING unnest(:failed::bigint[], :failed_ripe_ats::timestamptz[], :failed_errors::text[],
                 :failed_charges::int[], :failed_tracebacks::text[])
          AS u(token, ripe_at, error, charge, traceback)
    WHERE r.token = u.token
    RETURNING r.token, r.id, r.job_type, r.arguments, r.priority,
              -- a release keeps the job's place in the queue; a retry waits its backoff, a
              -- snooze its delay
              coalesce(u.ripe_at, least(r.ripe_at, :now::timestamptz)) AS next_ripe_at,
              r.attempts + u.charge AS next_attempts, r.max_retries,
              coalesce(u.error, r.last_error) AS next_error, r.created_at, r.queue,
              r.concurrency_key, r.attempts, r.awaited, r.cancelled_at, r.unique_mode,
              r.unique_key, r.worker_id, u.charge, u.error AS attempt_error, u.traceback
), {
    _back_to_queue(
        "failed",
        ripe_at="s.next_ripe_at",
        attempts="s.next_attempts",
        error="s.next_error",
        now=":now::timestamptz",
    )
}, buried AS (
    DELETE FROM job_running AS r
    USING unnest(:buried::bigint[], :buried_errors::text[], :buried_tracebacks::text[])
          AS u(token, error, traceback)
    WHERE r.token = u.token
    RETURNING r.token, r.id, r.job_type, r.arguments, r.priority, r.attempts, r.max_retries,
              u.error, r.created_at, r.queue, r.concurrency_key, r.awaited, r.cancelled_at,
              r.worker_id, u.traceback
), attempted AS (
    INSERT INTO job_attempt (job_id, attempt, worker_id, error, traceback, failed_at)
    SELECT id, attempts + 1, worker_id, error, traceback, :now::timestamptz FROM (
        SELECT id, attempts, worker_id, attempt_error AS error, traceback FROM failed
        WHERE charge > 0
        UNION ALL SELECT id, attempts, worker_id, error, traceback FROM buried
    ) AS a
    WHERE :retain::boolean
), dead AS (
    INSERT INTO job_dead ({_DEAD_COLUMNS})
    SELECT id, job_type, arguments, priority, attempts + 1, max_retries, error, created_at, :now,
           queue, concurrency_key
    FROM buried WHERE cancelled_at IS NULL
), {
    _into_done(
        "buried_cancelled",
        "(SELECT * FROM buried WHERE cancelled_at IS NOT NULL)",
        state="'cancelled'",
        attempts="s.attempts + 1",
        error="s.error",
    )
}, recorded AS (
    SELECT token FROM completed
    UNION ALL SELECT token FROM failed
    UNION ALL SELECT token FROM buried
), ended AS (
    SELECT id, awaited FROM completed
    UNION ALL SELECT id, awaited FROM failed WHERE cancelled_at IS NOT NULL
    UNION ALL SELECT id, awaited FROM buried
)"""

# The usual claim's CTEs: the jobs that finished since the last one all succeeded.
_RECORD_COMPLETED = f"{_COMPLETED}, ended AS (SELECT id, awaited FROM completed)"

job_record = Query(f"""WITH {_RECORD}
SELECT token FROM recorded WHERE {NOTIFY_ENDED.format(source="ended")}""")


def _next_ripe_at(queues: str, rated: str | None) -> str:
    """When a claim of the queues named by `queues` (a query of a `name` column) may next find
    work after `:now`: the earliest `ripe_at` after it of their jobs (one probe of
    job_ripe_at_idx each), or the moment a full rate window of those named by `rated` opens
    (None: no rate windows), whichever comes first (NULL: neither). The rate windows are read
    only when `rated` names a queue: with them, a claim held back by a rate takes 0.3-0.6 ms
    (`python -m bench rate_held_claim`; job_rate_opens_at keeps its plan since
    sql/017_rate_opens_at_cached.sql), more when it walks many keys."""
    ripe = f"""(SELECT min(n.ripe_at) FROM ({queues}) AS u CROSS JOIN LATERAL (
         SELECT ripe_at FROM job WHERE job.queue = u.name AND ripe_at > :now
         ORDER BY ripe_at LIMIT 1) AS n)"""
    if rated is None:
        return ripe
    return f"""least(
    {ripe},
    CASE WHEN EXISTS ({rated}) THEN job_rate_opens_at(ARRAY({rated}), :now::timestamptz) END
)"""


def _claiming(record: str, recorded: str, *, limits: bool) -> Query:
    """A statement that records outcomes (CTEs `record`, tokens in CTE `recorded`) and claims
    ripe jobs for `worker` in one go: up to `slots[i]` jobs of queue `queues[i]` (the jobs whose
    outcome is recorded free the slots that the claim fills). Paused queues are skipped. Every
    queue is claimed from its line here (`job_claim_idx`).
    With `limits`, a queue with limits is claimed after its turn (`job_claimable`,
    sql/016_limits_budget.sql: the claims of a limited queue take turns, and each reads the
    counts its limits need after its turn), up to the budget its turn gives; when a key's limit
    may bind, the turn chooses the jobs itself (and writes their starts). The starts of the
    lines taken here are written to the rate windows (`job_rate`) here. `capacity[i]`, the
    worker's slots in queue i, asks its turn for a grant (sql/018_limits_grants.sql), written
    here as the queue's start row and returned as a row of its own (below).
    Without `limits` (a worker that serves no queue with limits, or claims each one under a
    grant: a smaller plan, 0.04 ms less to run), a queue that has limits and no grant that holds
    is skipped. With or without, `until[i]` is the end of the worker's grant in queue i (NULL:
    none); the queues skipped are named in the last row's `queue` (comma-separated): the worker
    claims them again with their turns.
    It returns the claimed jobs, then one row per recorded token (id NULL), then one row (id
    and token NULL) whose `ripe_at` is when a claim of the queues it did not fill (fewer ripe
    jobs than free slots) may next find work: their earliest `ripe_at` after `:now`, or the
    moment a full rate window of those that hold ripe jobs opens (NULL: neither); then one row
    per grant made (id and token NULL, `attempts` not NULL: `store.record_and_claim` reads it).
    """
    if limits:
        # a queue with limits takes its turn only when one of its jobs is ripe: the turn of an
        # empty queue (its lock, its counts) and its rate windows cost 1.5 ms of each claim of
        # a worker idle on the application's queues (`python -m bench pickup_latency`). Not
        # "or some of its jobs end in this claim" (no probe for a busy queue): reading CTE
        # `completed` here moves (part of) its DELETE before the turn, and the journal of
        # `make chaos`'s limits scenario then held up to 4 claims of a key at once (limit 2) in
        # 2 of 4 runs, against none in 9 without it (why, I did not find).
        # a queue under a grant takes its lock shared in job_claimable, in the turns' order
        source = """unnest(:queues::text[], :slots::int[], :capacity::int[],
                        :until::timestamptz[]) AS u(name, free, capacity, until)
    LEFT JOIN job_queue AS jq USING (name)"""
        columns = """coalesce(jq.limited, false) AS limited, u.capacity, u.until, jq,
    jq.limited AND EXISTS (
        SELECT FROM job WHERE job.queue = u.name AND job.ripe_at <= :now) AS ripe"""
        turns = """, turns AS (
    -- the limited queues' turns (job_claimable): per queue, its budget, or the jobs it chose
    -- when a key's limit may bind
    SELECT t.*
    FROM (SELECT array_agg(q.jq ORDER BY (q.jq).id) AS queues,
                 array_agg(q.free ORDER BY (q.jq).id) AS free,
                 array_agg(q.capacity ORDER BY (q.jq).id) AS capacity,
                 array_agg(q.until ORDER BY (q.jq).id) AS until
          FROM q WHERE q.ripe HAVING count(*) > 0) AS a
    CROSS JOIN LATERAL job_claimable(a.queues, a.free, a.capacity, a.until, :now) AS t
)"""
        lines = """        -- first (it may wait for the queues' turn): the jobs chosen in a turn
        SELECT unnest(t.ids) FROM turns AS t
        UNION ALL
        SELECT j.id FROM (
            -- how many jobs of its line each queue takes: its free slots, or its turn's budget
            -- (none when the turn chose its jobs, or left no budget)
            SELECT q.name, CASE WHEN q.limited THEN coalesce(t.budget, 0) ELSE q.free END AS n
            FROM q LEFT JOIN turns AS t ON t.queue = q.name
        ) AS l """
        claimed_at = "coalesce((SELECT t.claimed_at FROM turns AS t WHERE t.queue = c.queue), :now)"
        started = """, started AS (
    -- the start rows of the turns that took their line here (their keys folded in when
    -- `keyed`), or their grants; a turn that chose its jobs wrote theirs (job_claimable)
    INSERT INTO job_rate (queue, concurrency_key, at, seq, n, keys, until, reserved)
    SELECT t.queue, '', t.claimed_at, t.seq + coalesce(t.granted, s.n),
           coalesce(t.granted, s.n), CASE WHEN t.granted IS NULL THEN s.keys END, t.until,
           t.reserved
    FROM turns AS t CROSS JOIN LATERAL (
        SELECT count(*) AS n, CASE WHEN t.keyed THEN array_agg(r.concurrency_key)
                                   FILTER (WHERE r.concurrency_key IS NOT NULL) END AS keys
        FROM running AS r WHERE r.queue = t.queue
    ) AS s
    WHERE t.budget IS NOT NULL AND (t.granted > 0 OR t.rated AND s.n > 0)
)"""
        grants = """
UNION ALL
-- the grants (id and token NULL): `attempts` its starts, `max_retries` its span (ms), `ripe_at`
-- its time in the rate windows, `claimed_at` its end (`until`, the server's clock)
SELECT NULL, NULL, NULL, NULL, t.granted,
       (extract(epoch FROM job_grant_span()) * 1000)::int, t.claimed_at, t.until, t.queue, NULL
FROM turns AS t WHERE t.granted > 0"""
        # the queues whose grant ended as the claim took its lock
        skipped = "(SELECT string_agg(t.queue, ',') FROM turns AS t WHERE t.granted = 0)"
        rated = "SELECT name FROM unfilled WHERE ripe"
    else:
        source = """unnest(:queues::text[], :slots::int[], :until::timestamptz[])
        AS u(name, free, until)
    LEFT JOIN job_queue AS jq USING (name)"""
        # a queue under a grant of the worker's that holds takes its line as a queue without
        # limits does (sql/018_limits_grants.sql: its lock taken shared, never waited for);
        # other queues with limits are skipped (named below)
        columns = """coalesce(jq.limited, false)
        AND NOT (u.until IS NOT NULL AND job_grant_holds(jq.id, u.until)) AS limited"""
        turns = ""
        grants = ""
        lines = """        SELECT j.id FROM (
            SELECT q.name, q.free AS n FROM q WHERE NOT q.limited  -- (skipped: named below)
        ) AS l """
        claimed_at = ":now"
        started = ""
        skipped = "(SELECT string_agg(q.name, ',') FROM q WHERE q.limited)"
        rated = None
    return Query(f"""
WITH {record}, q AS (
    SELECT u.name, u.free, {columns}
    FROM {source}
    WHERE u.free > 0 AND NOT coalesce(jq.paused, false)
){turns}, claimed AS (
    DELETE FROM job
    WHERE id = ANY(ARRAY(
{lines}CROSS JOIN LATERAL (
            -- the queue's line one priority at a time, highest first (a skip scan: one index
            -- probe finds the next priority and its first job), so the claim reads the ripe
            -- jobs it takes and never walks the jobs scheduled later: one range scan of (queue,
            -- priority DESC, ripe_at) with `ripe_at <= :now` would read them all whenever fewer
            -- jobs are ripe than free slots. Each priority's scan starts at the first job its
            -- probe saw, past the index entries of jobs already gone (dead rows a long
            -- transaction elsewhere keeps from vacuum): they are stepped over once, not twice.
            WITH RECURSIVE priorities AS (
                (SELECT priority, ripe_at FROM job WHERE job.queue = l.name
                 ORDER BY priority DESC, ripe_at LIMIT 1)
                UNION ALL
                SELECT n.priority, n.ripe_at FROM priorities AS p CROSS JOIN LATERAL (
                    SELECT job.priority, job.ripe_at FROM job
                    WHERE job.queue = l.name AND job.priority < p.priority
                    ORDER BY job.priority DESC, job.ripe_at LIMIT 1) AS n
            )
            SELECT r.id FROM priorities AS p CROSS JOIN LATERAL (
                SELECT id FROM job
                WHERE job.queue = l.name AND job.priority = p.priority
                  AND ripe_at >= p.ripe_at AND ripe_at <= :now
                ORDER BY ripe_at
                LIMIT l.n
                FOR UPDATE SKIP LOCKED
            ) AS r
            LIMIT l.n  -- in the order of the priorities, then of ripe_at
        ) AS j
    ))
    RETURNING {_COLUMNS}
), running AS (
    INSERT INTO job_running ({_COLUMNS}, worker_id, claimed_at, lease_expires_at, token)
    SELECT {_COLUMNS}, :worker_id, {claimed_at}, :lease_expires_at, nextval('job_fencing_token')
    FROM claimed AS c  -- in the order of the claim (a join could reorder the jobs)
    RETURNING token, id, job_type, arguments, attempts, max_retries, ripe_at, claimed_at, queue,
              concurrency_key
){started}, unfilled AS (
    SELECT q.* FROM q
    WHERE q.free > (SELECT count(*) FROM running AS r WHERE r.queue = q.name)
      AND {"true" if limits else "NOT q.limited"}
), upcoming AS (
    -- when a claim of the queues this one left slots free in may next find work (the worker's
    -- timer), as `job_next_ripe_at` tells, with no second statement to ask it; the rate
    -- windows only of limited queues (none here without `limits`)
    SELECT {_next_ripe_at("SELECT name FROM unfilled", rated)} AS ripe_at
)
SELECT * FROM running
UNION ALL
SELECT token, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM {recorded}
WHERE {NOTIFY_ENDED.format(source="ended")}
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, ripe_at, NULL, {skipped}, NULL FROM upcoming{grants}
""")


# The usual claim: the jobs that finished since the last one all succeeded.
job_claim = _claiming(_RECORD_COMPLETED, "completed", limits=True)

# The claim when some of the jobs that finished failed or were released.
job_claim_recording = _claiming(_RECORD, "recorded", limits=True)

# The same two, for a worker that serves no queue with limits.
job_claim_unlimited = _claiming(_RECORD_COMPLETED, "completed", limits=False)
job_claim_unlimited_recording = _claiming(_RECORD, "recorded", limits=False)

worker_register = Query("""
INSERT INTO worker (id, host, pid, started_at, heartbeat_at)
VALUES (:worker_id, :host, :pid, :now, :now)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = EXCLUDED.heartbeat_at
""")

worker_next_id = Query("SELECT nextval(pg_get_serial_sequence('worker', 'id'))::int")

worker_lock = Query(f"SELECT pg_try_advisory_lock({WORKER_LOCK_CLASS}, :worker_id::int)")

worker_unregister = Query("DELETE FROM worker WHERE id = :worker_id")

# :tokens: those the worker holds. Returns how many leases were extended, the ids of the
# jobs among them that were cancelled (a worker that missed the notification hears it here),
# and whether this worker leads the upkeep (`job_leader`, sql/015_leader.sql) until
# :lead_expires_at: it renews its lead, or takes it from a leader whose lead ran out (hung) or
# whose liveness lock is gone (dead), with no statement of its own; unless not :offer (it is
# stopping).
# Its commit does not wait for the WAL to reach the disk (synchronous_commit off for its own
# transaction): 50 idle workers made 10 such flushes a second, each a wait on the disk that the
# commits of enqueues and claims queued behind (`python -m bench fleet`: 50 idle workers added
# 42-60 % to one worker's pickup p99, then 18-21 %). A crash of the server may lose the last
# beat (up to 3 x wal_writer_delay of commits): its heartbeat_at, leases and lead stay as the
# beat before left them, which hold for several intervals (a lease outlasts two: config), and
# after a restart every worker counts as alive for the grace (_ALIVE) while they beat again.
worker_heartbeat = Query(f"""
WITH beat AS (
    UPDATE worker SET heartbeat_at = :now WHERE id = :worker_id
), lead AS (
    INSERT INTO job_leader AS l (worker_id, expires_at)
    SELECT :worker_id, :lead_expires_at WHERE :offer
    ON CONFLICT (id) DO UPDATE SET worker_id = excluded.worker_id, expires_at = excluded.expires_at
    WHERE l.worker_id = excluded.worker_id OR l.expires_at < :now
       OR NOT EXISTS (
           SELECT FROM pg_locks
           WHERE locktype = 'advisory' AND classid = {WORKER_LOCK_CLASS} AND objsubid = 2
             AND objid = l.worker_id::oid AND granted
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))
    RETURNING worker_id
), leased AS (
    UPDATE job_running SET lease_expires_at = :lease_expires_at
    WHERE token = ANY(:tokens::bigint[]) AND worker_id = :worker_id
    RETURNING id, cancelled_at
)
SELECT count(*) AS leased,
       coalesce(array_agg(id) FILTER (WHERE cancelled_at IS NOT NULL), '{{}}') AS cancelled,
       EXISTS (SELECT FROM lead) AS leader
FROM leased
WHERE (SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL
""")

APPLICATION_NAME = "left('jobq/' || {w}.pid || '@' || {w}.host, 63)"
"""The `application_name` of every session of the worker process of row `{w}` (jobq.db)."""

# A worker is alive while it holds its liveness lock, or while
# its process still has a session and its heartbeat is recent (its listener is reconnecting).
# So a killed process (all its sessions gone at once) is dead at once, a dropped listener alone
# is not, and a hung worker is dead when its leases expire. After a restart of the server every
# session was cut at once and no heartbeat could be written: for the grace after the server's
# start, every worker is alive, so that each can reconnect and take its lock again.
# Behind a pooler both signs must come from direct sessions: a server connection of the pooler
# outlives its client, and with it a session lock or an application_name. So the listener
# connects directly (`Database.direct_dsn`) and pooled connections through a pooler send no
# application_name (`Database.open`): no pooled session ever carries a worker's name.
_ALIVE = f"""
    SELECT objid::bigint AS worker_id FROM pg_locks
    WHERE locktype = 'advisory' AND classid = {WORKER_LOCK_CLASS} AND objsubid = 2 AND granted
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
    UNION
    SELECT w.id FROM worker AS w
    WHERE w.heartbeat_at >= :now::timestamptz - :heartbeat_grace::interval
      AND EXISTS (SELECT FROM pg_stat_activity AS a
                  WHERE a.datname = current_database()
                    AND a.application_name = {APPLICATION_NAME.format(w="w")})
    UNION
    SELECT w.id FROM worker AS w
    WHERE pg_postmaster_start_time() >= :now::timestamptz - :heartbeat_grace::interval
"""

# :error: the last error of the rescued jobs. A rescue charges an attempt: a job that kills its
# worker every time must end in the dead letter rather than crash workers forever. A rescued
# job keeps its place in the queue (its own ripe_at), ahead of jobs that ripened since.
job_rescue = Query(f"""
WITH alive AS ({_ALIVE}
), lost AS (
    DELETE FROM job_running
    WHERE lease_expires_at < :now OR worker_id NOT IN (SELECT worker_id FROM alive)
    RETURNING {_COLUMNS}, cancelled_at, worker_id
), attempted AS (
    INSERT INTO job_attempt (job_id, attempt, worker_id, error, failed_at)
    SELECT id, attempts + 1, worker_id, :error, :now FROM lost WHERE :retain::boolean
), retrying AS (  -- the cancelled ones end in `job_done` (_back_to_queue)
    SELECT * FROM lost WHERE attempts < max_retries OR cancelled_at IS NOT NULL
), {
    _back_to_queue(
        "retrying",
        ripe_at="least(s.ripe_at, :now::timestamptz)",
        attempts="s.attempts + 1",
        error=":error::text",
        now=":now::timestamptz",
    )
}, buried AS (
    INSERT INTO job_dead ({_DEAD_COLUMNS})
    SELECT id, job_type, arguments, priority, attempts + 1, max_retries, :error, created_at, :now,
           queue, concurrency_key
    FROM lost WHERE attempts >= max_retries AND cancelled_at IS NULL
), gone AS (
    DELETE FROM worker WHERE id NOT IN (SELECT worker_id FROM alive)
), ended AS (
    SELECT id, awaited FROM lost WHERE attempts >= max_retries OR cancelled_at IS NOT NULL
)
SELECT count(*) FROM lost WHERE {NOTIFY_ENDED.format(source="ended")}
""")

# :tokens: those the worker holds. Claims of the worker whose answer never
# reached it (its connection was cut as the claim committed): it never started those jobs. They
# go back to the queue at their place, with no attempt charged.
job_release_orphans = Query(f"""
WITH orphans AS (
    DELETE FROM job_running WHERE worker_id = :worker_id AND NOT (token = ANY(:tokens::bigint[]))
    RETURNING {_COLUMNS}, cancelled_at
), {
    _back_to_queue(
        "orphans",
        ripe_at="least(s.ripe_at, :now::timestamptz)",
        attempts="s.attempts",
        error="s.last_error",
        now=":now::timestamptz",
        ran="s.attempts",
    )
}, ended AS (
    SELECT id, awaited FROM orphans WHERE cancelled_at IS NOT NULL
)
SELECT count(*) FROM orphans WHERE {NOTIFY_ENDED.format(source="ended")}
""")

# When the next claim of these queues may find work: the earliest ripe_at
# after now, or the moment a full rate window (`job_rate`) lets one more job start.
job_next_ripe_at = Query(f"""
SELECT {_next_ripe_at("SELECT unnest(:queues::text[]) AS name", "SELECT unnest(:queues::text[])")}
""")

# Forget the starts older than their window's period, and a minute more: a claim that read its
# clock up to a minute before this one's still finds the starts it counts. A queue's '' rows
# (all its starts) bound its keys' starts too (job_claimable): they stay for the longer period.
job_rate_prune = Query("""
DELETE FROM job_rate AS r USING job_queue AS jq
WHERE jq.name = r.queue
  AND r.at <= :now::timestamptz - interval '1 minute' - coalesce(CASE
      WHEN r.concurrency_key = '' THEN greatest(jq.rate_period, jq.key_rate_period)
      ELSE jq.key_rate_period END, interval '0')
""")

job_stats = Query("""
SELECT job_type,
       count(*) FILTER (WHERE state = 'queued' AND ripe_at <= :now) AS ripe,
       count(*) FILTER (WHERE state = 'queued' AND ripe_at > :now) AS scheduled,
       count(*) FILTER (WHERE state = 'running') AS running,
       count(*) FILTER (WHERE state = 'dead') AS dead
FROM (
    SELECT job_type, 'queued' AS state, ripe_at FROM job
    UNION ALL SELECT job_type, 'running', NULL FROM job_running
    UNION ALL SELECT job_type, 'dead', NULL FROM job_dead
) AS jobs
GROUP BY job_type
ORDER BY job_type
""")

# Whether `job` holds more than :max_count jobs (reads at most :max_count + 1 rows).
job_count_over = Query("""
SELECT count(*) > :max_count::bigint FROM (SELECT FROM job LIMIT :max_count::bigint + 1) AS j
""")

# The time of the last depth snapshot (`job_depth_take`; NULL: none yet).
job_depth_taken_at = Query("SELECT max(taken_at) FROM job_depth")

# `job_stats` with the queued jobs as the last depth snapshot counted them (job_type_depth), and
# the running and dead ones counted now.
job_stats_counted = Query("""
SELECT job_type, sum(ripe)::bigint AS ripe, sum(scheduled)::bigint AS scheduled,
       sum(running)::bigint AS running, sum(dead)::bigint AS dead
FROM (
    SELECT job_type, ripe, scheduled, 0 AS running, 0 AS dead FROM job_type_depth
    UNION ALL SELECT job_type, 0, 0, count(*), 0 FROM job_running GROUP BY job_type
    UNION ALL SELECT job_type, 0, 0, 0, count(*) FROM job_dead GROUP BY job_type
) AS jobs
GROUP BY job_type
ORDER BY job_type
""")

# -- the invariants' check (`jobq.check`): read-only, run in one REPEATABLE READ snapshot -------

# :max_sample: ids returned at most. Jobs in more than one of job, job_running, job_dead.
check_places = Query("""
WITH twice AS (
    SELECT id FROM job JOIN job_running USING (id)
    UNION SELECT id FROM job JOIN job_dead USING (id)
    UNION SELECT id FROM job_running JOIN job_dead USING (id)
)
SELECT count(*) AS violations,
       coalesce((array_agg(id ORDER BY id))[1:(:max_sample)], '{}') AS sample
FROM twice
""")

# Running jobs that no live
# worker holds and that the rescue should have returned more than `rescue grace` ago: their
# lease expired, or their worker is dead (as the rescue judges it, `_ALIVE`) and its last sign
# of life (heartbeat, or the claim when its row is gone) is that old.
check_running = Query(f"""
WITH alive AS ({_ALIVE}
), overdue AS (
    SELECT r.id FROM job_running AS r LEFT JOIN worker AS w ON w.id = r.worker_id
    WHERE r.lease_expires_at < :now::timestamptz - :rescue_grace::interval
       OR (r.worker_id NOT IN (SELECT worker_id FROM alive)
           AND coalesce(w.heartbeat_at, r.claimed_at)
               < :now::timestamptz - :rescue_grace::interval)
)
SELECT count(*) AS violations,
       coalesce((array_agg(id ORDER BY id))[1:(:max_sample)], '{{}}') AS sample
FROM overdue
""")

# Queued or running jobs past their last attempt (they belong in job_dead): the queued ones
# through the partial index job_over_attempts_idx, empty while the invariant holds.
check_attempts = Query("""
WITH over AS (
    SELECT id FROM job WHERE attempts > max_retries
    UNION ALL SELECT id FROM job_running WHERE attempts > max_retries
)
SELECT count(*) AS violations,
       coalesce((array_agg(id ORDER BY id))[1:(:max_sample)], '{}') AS sample
FROM over
""")

# Running jobs of a queue or a key that has more running than its concurrency limit allows
# (the claim never lets that happen; lowering a limit does, until the jobs over it end).
check_limits = Query("""
WITH counted AS (
    SELECT r.id, q.max_running, q.max_running_per_key, r.concurrency_key,
           count(*) OVER (PARTITION BY r.queue) AS in_queue,
           count(*) OVER (PARTITION BY r.queue, r.concurrency_key) AS in_key
    FROM job_running AS r JOIN job_queue AS q ON q.name = r.queue
    WHERE q.max_running IS NOT NULL OR q.max_running_per_key IS NOT NULL
), over AS (
    SELECT id FROM counted
    WHERE in_queue > max_running
       OR (concurrency_key IS NOT NULL AND in_key > max_running_per_key)
)
SELECT count(*) AS violations,
       coalesce((array_agg(id ORDER BY id))[1:(:max_sample)], '{}') AS sample
FROM over
""")

# Jobs per state, and workers alive or not (as the rescue judges); the queued ones as the last
# depth snapshot counted them when :counted (each subquery runs only if its branch is taken).
check_counts = Query(f"""
WITH alive AS ({_ALIVE}
)
SELECT CASE WHEN :counted::boolean THEN (SELECT coalesce(sum(ripe), 0) FROM job_type_depth)
            ELSE (SELECT count(*) FROM job WHERE ripe_at <= :now) END AS queued_ripe,
       CASE WHEN :counted::boolean THEN (SELECT coalesce(sum(scheduled), 0) FROM job_type_depth)
            ELSE (SELECT count(*) FROM job WHERE ripe_at > :now) END AS queued_scheduled,
       (SELECT count(*) FROM job_running) AS running,
       (SELECT count(*) FROM job_running WHERE lease_expires_at < :now) AS running_lease_expired,
       (SELECT count(*) FROM job_dead) AS dead,
       (SELECT count(*) FROM worker WHERE id IN (SELECT worker_id FROM alive)) AS workers_alive,
       (SELECT count(*) FROM worker WHERE id NOT IN (SELECT worker_id FROM alive)) AS workers_dead
""")

# -- what pins the vacuum horizon (`/jobs/stats`) ---------------------------------------------

# Age of the oldest transaction open in this database, other than the caller's: while
# it lasts, vacuum can remove no row deleted after it began, so the queue tables' dead tuples
# pile up (a claim then steps over them).
job_stats_oldest_transaction = Query("""
SELECT greatest(0, extract(epoch FROM :now::timestamptz - min(xact_start)))::float8
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL
""")

# Live and dead tuples of the queue tables (as the statistics collector last heard), and their
# last autovacuum.
job_stats_tables = Query("""
SELECT relname AS table, n_live_tup, n_dead_tup, last_autovacuum AS last_autovacuum_at
FROM pg_stat_user_tables
WHERE relname IN ('job', 'job_running', 'job_dead') AND schemaname = current_schema()
ORDER BY relname
""")

# Each queue table, its partitions summed: on-disk size (bytes: heap, indexes and TOAST), live
# and dead rows and last autovacuum (as the statistics last saw them), from the catalog and the
# statistics alone (cheap whatever their size).
job_stats_sizes = Query("""
SELECT t.name AS table,
       sum(pg_total_relation_size(p.relid))::bigint AS total_bytes,
       sum(s.n_live_tup)::bigint AS n_live_tup,
       sum(s.n_dead_tup)::bigint AS n_dead_tup,
       max(s.last_autovacuum) AS last_autovacuum_at
FROM unnest(ARRAY['job', 'job_running', 'job_dead', 'job_done', 'job_attempt']) AS t(name)
CROSS JOIN LATERAL pg_partition_tree(to_regclass(t.name)) AS p
LEFT JOIN pg_stat_user_tables AS s ON s.relid = p.relid
WHERE to_regclass(t.name) IS NOT NULL
GROUP BY t.name
ORDER BY t.name
""")

# The cumulative event counters (`job_counter`, of the metrics) summed per queue and event
# per queue and event (enqueued, started, succeeded, retried, failed, cancelled, snoozed).
job_counter_sums = Query("""
SELECT queue, event, sum(count)::bigint AS count FROM job_counter GROUP BY queue, event
""")

# -- queues -----------------------------------------------------------------------------------

# Arrays, one item per queue (NULL: no such limit). A queue's limits as its code
# declares them; its paused state is left as it is. Names sorted: concurrent starts never deadlock.
job_queue_declare = Query("""
INSERT INTO job_queue AS q (name, max_running, max_running_per_key, rate_max_starts, rate_period,
                            key_rate_max_starts, key_rate_period)
SELECT * FROM unnest(:names::text[], :max_running::int[], :max_running_per_key::int[],
                     :rate_max_starts::int[], :rate_periods::interval[],
                     :key_rate_max_starts::int[], :key_rate_periods::interval[]) AS u
ORDER BY 1
ON CONFLICT (name) DO UPDATE
SET max_running = EXCLUDED.max_running, max_running_per_key = EXCLUDED.max_running_per_key,
    rate_max_starts = EXCLUDED.rate_max_starts, rate_period = EXCLUDED.rate_period,
    key_rate_max_starts = EXCLUDED.key_rate_max_starts, key_rate_period = EXCLUDED.key_rate_period
WHERE (q.max_running, q.max_running_per_key, q.rate_max_starts, q.rate_period,
       q.key_rate_max_starts, q.key_rate_period)
      IS DISTINCT FROM (EXCLUDED.max_running, EXCLUDED.max_running_per_key,
                        EXCLUDED.rate_max_starts, EXCLUDED.rate_period,
                        EXCLUDED.key_rate_max_starts, EXCLUDED.key_rate_period)
""")

# Returns the name, or no row for an unknown queue.
job_queue_pause = Query("UPDATE job_queue SET paused = :paused WHERE name = :name RETURNING name")

# Every queue with its state, limits and jobs (ripe, scheduled, running). Each queued count stops
# at :max_count (NULL: none), so that a page over millions of jobs stays cheap.
job_queue_list = Query("""
SELECT q.name, q.paused, q.max_running, q.max_running_per_key, q.rate_max_starts, q.rate_period,
       q.key_rate_max_starts, q.key_rate_period,
       (SELECT count(*) FROM (SELECT FROM job WHERE job.queue = q.name AND ripe_at <= :now
                              LIMIT :max_count::bigint) AS j) AS ripe,
       (SELECT count(*) FROM (SELECT FROM job WHERE job.queue = q.name AND ripe_at > :now
                              LIMIT :max_count::bigint) AS j) AS scheduled,
       (SELECT count(*) FROM job_running AS r WHERE r.queue = q.name) AS running
FROM job_queue AS q
ORDER BY q.name
""")

# -- job control: cancel, find, await (`jobq.queue.control`) -----------------------------------

# A queued (or scheduled) job leaves the queue now and ends `cancelled`; a running one is marked
# (`cancelled_at`) and its worker told (NOTIFY jobq_cancel). Returns how many of each: none
# when the job is elsewhere (or moved after this statement's snapshot: the caller looks again),
# with the queue and job type of the job cancelled (for the metrics).
job_cancel = Query(f"""
WITH queued AS (
    DELETE FROM job WHERE id = :job_id
    RETURNING id, job_type, queue, arguments, attempts, last_error, created_at, awaited
), {_into_done("cancelled", "queued", state="'cancelled'", attempts="s.attempts")},
running AS (
    UPDATE job_running SET cancelled_at = :now WHERE id = :job_id AND cancelled_at IS NULL
    RETURNING id, job_type, queue
), cancelled_job AS (
    SELECT job_type, queue FROM queued UNION ALL SELECT job_type, queue FROM running
)
SELECT (SELECT count(*) FROM queued) AS queued,
       (SELECT count(pg_notify('jobq_cancel', id::text)) FROM running) AS running,
       (SELECT queue FROM cancelled_job LIMIT 1) AS queue,
       (SELECT job_type FROM cancelled_job LIMIT 1) AS job_type
WHERE {NOTIFY_ENDED.format(source="queued")}
""")

# Someone awaits the job's end: mark it, where it is queued or running (the statement that ends
# it notifies jobq_done). Returns how many rows were marked (0: it is elsewhere, or moved).
job_await = Query("""
WITH queued AS (
    UPDATE job SET awaited = true WHERE id = :job_id RETURNING id
), running AS (
    UPDATE job_running SET awaited = true WHERE id = :job_id RETURNING id
)
SELECT (SELECT count(*) FROM queued) + (SELECT count(*) FROM running)
""")


def _views(where: str, tail: str = "") -> str:
    """The jobs of every table as `jobq.queue.control.JobView` rows: each table's rows that
    match `where` (SQL over the columns every table has; `{state}` stands for the table's state
    expression, `{states}` for the array of the states the table can hold), then `tail`
    (ORDER BY, LIMIT) per table. A queued job is `scheduled` before its
    ripe_at (`:now`); `attempts` counts the attempts started (the one running too)."""
    queued = "CASE WHEN ripe_at > :now THEN 'scheduled' ELSE 'queued' END"
    return f"""
(SELECT id, job_type, queue, {queued} AS state, arguments, priority, attempts, max_retries,
        last_error, created_at, ripe_at, NULL::timestamptz AS started_at,
        NULL::timestamptz AS finished_at, NULL::timestamptz AS cancelled_at, NULL::jsonb AS result
 FROM job
 WHERE {where.replace("{state}", queued).replace("{states}", "'{queued,scheduled}'")} {tail})
UNION ALL
(SELECT id, job_type, queue, 'running', arguments, priority, attempts + 1, max_retries,
        last_error, created_at, ripe_at, claimed_at, NULL, cancelled_at, NULL
 FROM job_running
 WHERE {where.replace("{state}", "'running'").replace("{states}", "'{running}'")} {tail})
UNION ALL
(SELECT id, job_type, queue, 'failed', arguments, priority, attempts, max_retries, last_error,
        created_at, NULL, NULL, died_at, NULL, NULL
 FROM job_dead
 WHERE {where.replace("{state}", "'failed'").replace("{states}", "'{failed}'")} {tail})
UNION ALL
(SELECT id, job_type, queue, state, arguments, NULL, attempts, NULL, last_error, created_at,
        NULL, NULL, finished_at, CASE WHEN state = 'cancelled' THEN finished_at END, result
 FROM job_done
 WHERE {where.replace("{state}", "state").replace("{states}", "'{succeeded,cancelled}'")} {tail})"""


# The job wherever it is.
job_find = Query(f"SELECT * FROM ({_views('id = :job_id')}) AS j LIMIT 1")

# Job :job_id's failed attempts, in order (kept as long as finished jobs are).
job_attempts = Query("""
SELECT attempt, worker_id, error, traceback, failed_at FROM job_attempt
WHERE job_id = :job_id
ORDER BY failed_at, attempt
""")

# A page of jobs, newest (highest id) first, below id :after (NULL: from the newest), of queue
# :queue, type :job_type, state :state (each NULL: any). Each table gives its own page first,
# through its index on id; a table that cannot hold :state is not read at all (the condition on
# the parameter alone is a one-time filter), so a search for failed jobs never walks job_done.
job_list = Query(f"""
SELECT * FROM ({
    _views(
        "id < coalesce(:after::bigint, 9223372036854775807)"
        " AND (:queue::text IS NULL OR queue = :queue)"
        " AND (:job_type::text IS NULL OR job_type = :job_type)"
        " AND (:state::text IS NULL OR :state = ANY({states}::text[]))"
        " AND (:state::text IS NULL OR {state} = :state)",
        "ORDER BY id DESC LIMIT :limit",
    )
}) AS j
ORDER BY id DESC
LIMIT :limit
""")

# -- retention: finished jobs and failed attempts by day (`jobq.queue.maintenance`) -----------

# :parent (job_done or job_attempt). Its partitions but the default one, named `<parent>_p<day>`.
job_day_partitions = Query("""
SELECT c.relname FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
WHERE i.inhparent = :parent::text::regclass
  AND c.relname LIKE replace(:parent, '_', '\\_') || '\\_p%'
ORDER BY c.relname
""")

# :cutoff, :batch. Delete up to `batch` rows of the default partitions finished (failed) before
# `cutoff`; returns how many.
job_done_prune_default = Query("""
WITH gone AS (
    DELETE FROM job_done_default WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM job_done_default WHERE finished_at < :cutoff LIMIT :batch))
    RETURNING 1
)
SELECT count(*) FROM gone
""")
job_attempt_prune_default = Query("""
WITH gone AS (
    DELETE FROM job_attempt_default WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM job_attempt_default WHERE failed_at < :cutoff LIMIT :batch))
    RETURNING 1
)
SELECT count(*) FROM gone
""")

# :now, :batch. Forget up to `batch` keys of job_unique that are free (their period is over, or
# their job is neither queued nor running); returns how many.
job_unique_prune = Query("""
WITH gone AS (
    DELETE FROM job_unique WHERE ctid = ANY(ARRAY(
        SELECT u.ctid FROM job_unique AS u
        WHERE CASE WHEN u.until IS NULL THEN NOT job_is_active(u.job_id)
                   ELSE u.until <= :now END
        LIMIT :batch))
    RETURNING 1
)
SELECT count(*) FROM gone
""")

# -- schedules (`jobq.queue.schedule`) ----------------------------------------------------------

# Whether job_schedule exists (a database from before schedules has none); every schedule.
schedule_table = Query("SELECT to_regclass('job_schedule') IS NOT NULL")
schedule_list = Query("SELECT * FROM job_schedule ORDER BY 1")

# :names. Delete the code schedules not among them.
schedule_forget_code = Query("""
DELETE FROM job_schedule WHERE source = 'code' AND NOT (name = ANY(:names::text[]))
""")

# A schedule as declared: new, or changed (its spec differs: it starts again at :next_at), or
# as it was (nothing changes, its next_at neither).
schedule_declare = Query("""
INSERT INTO job_schedule AS s (name, source, job_type, arguments, occurrence_arg, queue, cron,
                              every_s, rrule, tz, starts_at, misfire, backfill, next_at, spec,
                              concurrency_key)
VALUES (:name, :source, :job_type, :arguments::jsonb, :occurrence_arg, :queue, :cron, :every_s,
        :rrule, :tz, :starts_at, :misfire, :backfill, :next_at, :spec, :concurrency_key)
ON CONFLICT (name) DO UPDATE
SET source = EXCLUDED.source, job_type = EXCLUDED.job_type, arguments = EXCLUDED.arguments,
    occurrence_arg = EXCLUDED.occurrence_arg, queue = EXCLUDED.queue, cron = EXCLUDED.cron,
    every_s = EXCLUDED.every_s, rrule = EXCLUDED.rrule, tz = EXCLUDED.tz,
    starts_at = EXCLUDED.starts_at, misfire = EXCLUDED.misfire, backfill = EXCLUDED.backfill,
    next_at = EXCLUDED.next_at, spec = EXCLUDED.spec, concurrency_key = EXCLUDED.concurrency_key
WHERE s.spec IS DISTINCT FROM EXCLUDED.spec
""")

# The schedules (not paused) whose next occurrence is due by :horizon, locked for this
# transaction; those another scheduler holds are skipped.
schedule_due = Query("""
SELECT * FROM job_schedule
WHERE NOT paused AND next_at <= :horizon
ORDER BY next_at
LIMIT :limit
FOR UPDATE SKIP LOCKED
""")

schedule_advance = Query("UPDATE job_schedule SET next_at = :next_at WHERE name = :name")

# The occurrences :ats of schedule :name (:at_texts: the same in ISO 8601, for :occurrence_arg)
# not enqueued before: one job each, ripe at its time, every enqueue its own job
# (unique_mode none: the occurrence's row is its uniqueness). Returns the new jobs' ids.
schedule_enqueue = Query("""
WITH occurrence AS (
    INSERT INTO job_occurrence (schedule, at, job_id)
    SELECT :name, u.at, nextval(pg_get_serial_sequence('job', 'id'))
    FROM unnest(:ats::timestamptz[]) AS u(at)
    ON CONFLICT (schedule, at) DO NOTHING
    RETURNING at, job_id
)
INSERT INTO job (id, job_type, arguments, ripe_at, max_retries, created_at, queue, unique_mode,
                 concurrency_key)
SELECT o.job_id, :job_type,
       CASE WHEN :occurrence_arg::text IS NULL THEN :arguments::jsonb
            ELSE :arguments::jsonb || jsonb_build_object(:occurrence_arg::text, t.text) END,
       o.at, :max_retries, :now, :queue, 'none', :concurrency_key
FROM occurrence AS o
JOIN unnest(:ats::timestamptz[], :at_texts::text[]) AS t(at, text) ON t.at = o.at
RETURNING id
""")

# :cutoff, :batch. Forget up to `batch` occurrences older than `cutoff` (a schedule never goes
# back that far); returns how many.
job_occurrence_prune = Query("""
WITH gone AS (
    DELETE FROM job_occurrence WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM job_occurrence WHERE at < :cutoff LIMIT :batch))
    RETURNING 1
)
SELECT count(*) FROM gone
""")

# Pause (or resume, at :next_at) schedule :name; returns its name, or no row.
schedule_pause = Query("""
UPDATE job_schedule SET paused = :paused, next_at = coalesce(:next_at, next_at)
WHERE name = :name RETURNING name
""")

schedule_drop = Query("DELETE FROM job_schedule WHERE name = :name")

# The jobs of schedule :name's occurrences still queued or running.
schedule_pending_jobs = Query("""
SELECT o.job_id FROM job_occurrence AS o
WHERE o.schedule = :name
  AND (EXISTS (SELECT FROM job WHERE id = o.job_id)
       OR EXISTS (SELECT FROM job_running WHERE id = o.job_id))
""")

# -- metrics (`jobq.queue.metrics`) and trace contexts (`jobq.tracing`) ------------------------

# Add to the cumulative counts: arrays, one item per (queue, job type, event), sorted by it (two
# processes adding to the same rows lock them in the same order: no deadlock).
job_counter_add = Query("""
INSERT INTO job_counter AS c (queue, job_type, event, count)
SELECT * FROM unnest(:queues::text[], :job_types::text[], :events::text[], :counts::bigint[])
ORDER BY 1, 2, 3
ON CONFLICT (queue, job_type, event) DO UPDATE SET count = c.count + EXCLUDED.count
""")

# Add one histogram's observations (:buckets, not cumulative, under :bounds) and their :sum;
# a row of other bounds starts afresh (a counter reset, which Prometheus' rate() handles).
job_histogram_add = Query("""
INSERT INTO job_histogram AS h (queue, job_type, metric, bounds, buckets, sum)
VALUES (:queue, :job_type, :metric, :bounds::float8[], :buckets::bigint[], :sum)
ON CONFLICT (queue, job_type, metric) DO UPDATE
SET buckets = CASE WHEN h.bounds = EXCLUDED.bounds
                   THEN ARRAY(SELECT a + b FROM unnest(h.buckets, EXCLUDED.buckets)
                                  WITH ORDINALITY AS u(a, b, i) ORDER BY i)
                   ELSE EXCLUDED.buckets END,
    sum = CASE WHEN h.bounds = EXCLUDED.bounds THEN h.sum + EXCLUDED.sum ELSE EXCLUDED.sum END,
    bounds = EXCLUDED.bounds
""")

METRICS_LOCK = (WORKER_LOCK_CLASS, -12)
"""The transaction-level advisory lock (classid 'jobq', objid -12: no worker's id) of the
process that takes the depth snapshot."""

# Whether this transaction takes the depth snapshot: it holds the metrics lock, and the last
# snapshot is older than :fresh_for before :now and than 20 times the time it took (a count
# that takes long, over a big queue, costs at most 5% of a core).
job_depth_elect = Query(f"""
SELECT pg_try_advisory_xact_lock({METRICS_LOCK[0]}, {METRICS_LOCK[1]})
       AND NOT EXISTS (
           SELECT FROM job_depth
           WHERE taken_at > :now::timestamptz
                            - greatest(:fresh_for::interval, took_s * interval '20 s'))
""")

# The time the snapshot taken at :now took.
job_depth_took = Query("UPDATE job_depth SET took_s = :took_s WHERE taken_at = :now")

# Count, per queue, its ripe and scheduled jobs at :now and the ripe ones its concurrency limits
# hold back (the queue's max_running reached, or their key's max_running_per_key), into
# job_depth, and per queue and job type its ripe and scheduled jobs into job_type_depth. One
# pass over `job`: a second or so per million jobs, every few seconds, in one process.
job_depth_take = Query("""
WITH running_queue AS (
    SELECT queue, count(*) AS n FROM job_running GROUP BY queue
), running_key AS (
    SELECT queue, concurrency_key, count(*) AS n FROM job_running
    WHERE concurrency_key IS NOT NULL GROUP BY queue, concurrency_key
), by_type AS (
    SELECT j.queue, j.job_type,
           count(*) FILTER (WHERE j.ripe_at <= :now) AS ripe,
           count(*) FILTER (WHERE j.ripe_at > :now) AS scheduled,
           count(*) FILTER (WHERE j.ripe_at <= :now
                              AND (rq.n >= q.max_running OR rk.n >= q.max_running_per_key))
               AS held
    FROM job AS j
    LEFT JOIN job_queue AS q ON q.name = j.queue
    LEFT JOIN running_queue AS rq ON rq.queue = j.queue
    LEFT JOIN running_key AS rk
        ON rk.queue = j.queue AND rk.concurrency_key = j.concurrency_key
    GROUP BY j.queue, j.job_type
), counted AS (
    SELECT queue, sum(ripe) AS ripe, sum(scheduled) AS scheduled, sum(held) AS held
    FROM by_type GROUP BY queue
), types AS (
    INSERT INTO job_type_depth AS d (queue, job_type, ripe, scheduled, taken_at)
    SELECT queue, job_type, ripe, scheduled, :now FROM by_type
    ON CONFLICT (queue, job_type) DO UPDATE
    SET ripe = EXCLUDED.ripe, scheduled = EXCLUDED.scheduled, taken_at = EXCLUDED.taken_at
), types_gone AS (
    DELETE FROM job_type_depth AS d
    WHERE NOT EXISTS (SELECT FROM by_type AS b WHERE b.queue = d.queue AND b.job_type = d.job_type)
), gone AS (
    DELETE FROM job_depth WHERE queue NOT IN (SELECT name FROM job_queue)
)
INSERT INTO job_depth AS d (queue, ripe, scheduled, held, taken_at)
SELECT q.name, coalesce(c.ripe, 0), coalesce(c.scheduled, 0), coalesce(c.held, 0), :now
FROM job_queue AS q LEFT JOIN counted AS c ON c.queue = q.name
ON CONFLICT (queue) DO UPDATE
SET ripe = EXCLUDED.ripe, scheduled = EXCLUDED.scheduled, held = EXCLUDED.held,
    taken_at = EXCLUDED.taken_at
""")

metrics_counters = Query("SELECT queue, job_type, event, count FROM job_counter")

metrics_histograms = Query(
    "SELECT queue, job_type, metric, bounds, buckets, sum FROM job_histogram"
)

# Per queue: paused or not, the last depth snapshot (NULL: none yet), and the age at :now of its
# oldest ripe job (NULL: none), one probe of job_ripe_at_idx.
metrics_queues = Query("""
SELECT q.name AS queue, q.paused, d.ripe, d.scheduled, d.held, d.taken_at,
       extract(epoch FROM :now::timestamptz - (
           SELECT min(j.ripe_at) FROM job AS j WHERE j.queue = q.name AND j.ripe_at <= :now
       ))::float8 AS oldest_ripe_s
FROM job_queue AS q LEFT JOIN job_depth AS d ON d.queue = q.name
ORDER BY q.name
""")

# Running jobs per queue and job type (job_running holds only the claimed jobs: small).
metrics_running = Query("""
SELECT queue, job_type, count(*) AS running FROM job_running GROUP BY queue, job_type
""")

# Workers alive, as the rescue judges.
metrics_workers_alive = Query(f"""
WITH alive AS ({_ALIVE}
)
SELECT count(*) FROM worker WHERE id IN (SELECT worker_id FROM alive)
""")

# The trace context of the span that enqueued :job_ids (the jobs of one enqueue).
job_trace_add = Query("""
INSERT INTO job_trace (job_id, traceparent, created_at)
SELECT unnest(:job_ids::bigint[]), :traceparent, :now
ON CONFLICT (job_id) DO NOTHING
""")

job_trace_of = Query("""
SELECT job_id, traceparent FROM job_trace WHERE job_id = ANY(:job_ids::bigint[])
""")

# Forget up to :batch trace contexts written before :cutoff; returns how many.
job_trace_prune = Query("""
WITH gone AS (
    DELETE FROM job_trace WHERE job_id = ANY(ARRAY(
        SELECT job_id FROM job_trace WHERE created_at < :cutoff LIMIT :batch))
    RETURNING 1
)
SELECT count(*) FROM gone
""")
