"""Admin operations on the dead letter and the workers: thin verbs over their statements
(`sql/queries/dead.sql`, `worker_list` in `sql/queries/worker.sql`); a worker's liveness is the
rescue's own rule (`job_worker_alive`). The verbs take the connection of the caller's
transaction.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, NamedTuple

from jobq.db import Connection
from jobq.errors import Conflict, NotFound
from jobq.queue import sql, wakeup

MAX_TRIES = 3


async def list_dead(
    conn: Connection, *, limit: int, after: int | None, where: DeadFilter | None = None
) -> list[dict[str, Any]]:
    """Return up to `limit` dead jobs, newest (highest id) first; with `after`, those whose id
    is lower than `after` (the last id of the previous page); those `where` matches."""
    rows = await sql.job_dead_list.fetch(
        conn, limit=limit, after=after, **(where or DeadFilter())._asdict()
    )
    return [dict(r) for r in rows]


async def count(conn: Connection, *, max_count: int) -> int:
    """Return how many jobs the dead letter holds, counted up to `max_count` + 1 (more than
    `max_count`: "more than")."""
    found: int = await sql.job_dead_count.fetchval(conn, max_count=max_count)
    return found


class DeadFilter(NamedTuple):
    """Which dead jobs: of `queue`, of `job_type`, whose last error contains `error`, whose
    arguments contain `arguments` (JSON containment); None: any."""

    queue: str | None = None
    job_type: str | None = None
    error: str | None = None
    arguments: dict[str, Any] | None = None


async def matching(
    conn: Connection, where: DeadFilter, *, limit: int, after: int | None = None
) -> list[int]:
    """Return the ids of up to `limit` dead jobs `where` matches, below `after` (None: from the
    newest), newest first: a batch of a bulk retry or discard."""
    rows = await sql.job_dead_matching.fetch(conn, limit=limit, after=after, **where._asdict())
    return [r["id"] for r in rows]


async def retry(conn: Connection, job_id: int, *, now: datetime) -> dict[str, Any]:
    """Move dead job `job_id` back to the queue, ripe at `now`, with `attempts` reset to 0 (a
    full retry budget again) and its `last_error` kept; return the queued row. The workers are
    woken when the caller's transaction commits.

    Raises: `NotFound` when there is no such dead job (never was, or retried or discarded
    meanwhile); `Conflict` (with `queued_job_id`, the twin's id) when an identical job is
    queued: the dead job stays where it is (discard it, or retry it once the twin has run).
    """
    for _ in range(MAX_TRIES):
        row = await sql.job_dead_retry.fetchrow(conn, job_id=job_id, now=now)
        if row is not None:
            wakeup.wake_workers_after_commit()
            return dict(row)
        twin = await sql.job_dead_twin.fetchrow(conn, job_id=job_id)
        if twin is None:
            raise NotFound("no such dead job", job_id=job_id)
        if twin["twin_id"] is not None:
            raise Conflict("an identical job is queued", queued_job_id=twin["twin_id"])
        # The twin was claimed between the two statements: try again.
    raise Conflict("an identical job keeps being queued and claimed; try again")


async def discard(conn: Connection, job_id: int) -> None:
    """Delete dead job `job_id` for good. Raises: `NotFound`."""
    if await sql.job_dead_discard.fetchval(conn, job_id=job_id) is None:
        raise NotFound("no such dead job", job_id=job_id)


async def list_workers(
    conn: Connection, *, now: datetime, heartbeat_grace: timedelta
) -> list[dict[str, Any]]:
    """Return every registered worker by id, with `alive` (by the rescue's rule,
    at `now` with `heartbeat_grace`) and `running_jobs` (its rows in `job_running`)."""
    return [
        dict(r) for r in await sql.worker_list.fetch(conn, now=now, heartbeat_grace=heartbeat_grace)
    ]
