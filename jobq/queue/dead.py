"""Admin operations on the dead letter and the workers: statements, and thin verbs over them.

The statements follow `jobq.queue.sql` (one statement per state change, noun-first names, the
time passed as a parameter); a worker's liveness is `sql._ALIVE`, the very rule the rescue uses.
The verbs take the connection of the caller's transaction.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from jobq.db import Connection
from jobq.errors import Conflict, NotFound
from jobq.queue import sql, store
from jobq.queue.sql import Query

_DEAD_COLUMNS = sql._DEAD_COLUMNS
_QUEUED_COLUMNS = sql._COLUMNS

# :after: list ids below this one (NULL: from the newest). Newest (highest id) first.
job_dead_list = Query(f"""
SELECT {_DEAD_COLUMNS} FROM job_dead
WHERE id < coalesce(:after::bigint, 9223372036854775807)
ORDER BY id DESC
LIMIT :limit
""")

# Back to `job`, ripe now, with its retries reset (`attempts` 0) and its last
# error kept. The dead row is locked first, so a concurrent retry or discard of the same job
# waits and then finds it gone. When an identical job is queued (same md5), nothing changes.
job_dead_retry = Query(f"""
WITH requeued AS (
    INSERT INTO job ({_QUEUED_COLUMNS})
    SELECT id, job_type, arguments, :now::timestamptz, priority, 0, max_retries, last_error,
           created_at, queue, concurrency_key, false, 'queued', NULL
    FROM (SELECT * FROM job_dead WHERE id = :job_id FOR UPDATE) AS dead
    ON CONFLICT (md5) DO NOTHING
    RETURNING {_QUEUED_COLUMNS}
), revived AS (
    DELETE FROM job_dead WHERE id IN (SELECT id FROM requeued)
)
SELECT {_QUEUED_COLUMNS} FROM requeued
""")

# The queued job identical to the dead job, if any (one row while the dead job exists).
job_dead_twin = Query("""
SELECT j.id AS twin_id
FROM job_dead AS d LEFT JOIN job AS j ON j.md5 = md5(d.job_type || d.arguments::text)
WHERE d.id = :job_id
""")

job_dead_discard = Query("DELETE FROM job_dead WHERE id = :job_id RETURNING id")

# alive: as the rescue judges (`sql._ALIVE`)
worker_list = Query(f"""
WITH alive AS ({sql._ALIVE}
)
SELECT w.id, w.host, w.pid, w.started_at, w.heartbeat_at,
       w.id IN (SELECT worker_id FROM alive) AS alive,
       (SELECT count(*) FROM job_running AS r WHERE r.worker_id = w.id) AS running_jobs
FROM worker AS w
ORDER BY w.id
""")

MAX_TRIES = 3


async def list_dead(conn: Connection, *, limit: int, after: int | None) -> list[dict[str, Any]]:
    """Return up to `limit` dead jobs, newest (highest id) first; with `after`, those whose id
    is lower than `after` (the last id of the previous page)."""
    return [dict(r) for r in await job_dead_list.fetch(conn, limit=limit, after=after)]


async def retry(conn: Connection, job_id: int, *, now: datetime) -> dict[str, Any]:
    """Move dead job `job_id` back to the queue, ripe at `now`, with `attempts` reset to 0 (a
    full retry budget again) and its `last_error` kept; return the queued row. The workers are
    woken when the caller's transaction commits.

    Raises: `NotFound` when there is no such dead job (never was, or retried or discarded
    meanwhile); `Conflict` (with `queued_job_id`, the twin's id) when an identical job is
    queued: the dead job stays where it is (discard it, or retry it once the twin has run).
    """
    for _ in range(MAX_TRIES):
        row = await job_dead_retry.fetchrow(conn, job_id=job_id, now=now)
        if row is not None:
            store.wake_workers_after_commit()
            return dict(row)
        twin = await job_dead_twin.fetchrow(conn, job_id=job_id)
        if twin is None:
            raise NotFound("no such dead job", job_id=job_id)
        if twin["twin_id"] is not None:
            raise Conflict("an identical job is queued", queued_job_id=twin["twin_id"])
        # The twin was claimed between the two statements: try again.
    raise Conflict("an identical job keeps being queued and claimed; try again")


async def discard(conn: Connection, job_id: int) -> None:
    """Delete dead job `job_id` for good. Raises: `NotFound`."""
    if await job_dead_discard.fetchval(conn, job_id=job_id) is None:
        raise NotFound("no such dead job", job_id=job_id)


async def list_workers(
    conn: Connection, *, now: datetime, heartbeat_grace: timedelta
) -> list[dict[str, Any]]:
    """Return every registered worker by id, with `alive` (by the rescue's rule, `sql._ALIVE`,
    at `now` with `heartbeat_grace`) and `running_jobs` (its rows in `job_running`)."""
    return [
        dict(r) for r in await worker_list.fetch(conn, now=now, heartbeat_grace=heartbeat_grace)
    ]
