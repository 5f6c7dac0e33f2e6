"""What holds queued jobs back, for the operator's views: a paused queue, a concurrency limit
reached (the queue's, or a key's), a full rate window (`sql.job_held_reasons`,
`sql.job_queue_holds`)."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from jobq.db import Connection
from jobq.queue import sql


async def held_reasons(
    conn: Connection, job_ids: Collection[int], *, now: datetime
) -> dict[int, dict[str, Any]]:
    """Return, by id, why each of `job_ids` that is queued and ripe at `now` is held back:
    `{"id", "reason": "paused" | "limit" | "key limit" | "rate", "until"}` (`until`: when a
    full rate window opens, else None). A job held by nothing (it waits for a free worker), or
    not queued and ripe, is absent."""
    if not job_ids:
        return {}
    rows = await sql.job_held_reasons.fetch(conn, job_ids=list(job_ids), now=now)
    return {r["id"]: dict(r) for r in rows}


async def queue_holds(conn: Connection, *, now: datetime) -> dict[str, dict[str, Any]]:
    """Return, by queue, what holds its ripe jobs back at `now`: `paused`, `held` (those its
    concurrency limits hold, as the last depth snapshot counted; None before one) and
    `rate_until` (when a full rate window opens; None: none is full)."""
    return {r["queue"]: dict(r) for r in await sql.job_queue_holds.fetch(conn, now=now)}
