"""Queues as the database holds them: their limits declared from code (`Registry.queue`),
paused and resumed by an operator, listed with their counts, and what holds their queued jobs
back — a paused queue, a concurrency limit reached (the queue's, or a key's), a full rate
window. The claim itself enforces the limits (`sql/queries/claim.sql`)."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import datetime
from typing import Any

from jobq.db import Connection
from jobq.queue import sql
from jobq.queue.registry import QueueSpec
from jobq.queue.wakeup import wake_workers_after_commit


async def declare_queues(conn: Connection, specs: Iterable[QueueSpec]) -> None:
    """Write the limits of `specs` to `job_queue` (creating the queues unknown there), leaving
    their paused state as it is. Raises: `asyncpg.PostgresError`."""
    ordered = sorted(specs, key=lambda q: q.name)
    await sql.job_queue_declare.execute(
        conn,
        names=[q.name for q in ordered],
        max_running=[q.max_running for q in ordered],
        max_running_per_key=[q.max_running_per_key for q in ordered],
        rate_max_starts=[q.rate.max_starts if q.rate else None for q in ordered],
        rate_periods=[q.rate.period if q.rate else None for q in ordered],
        key_rate_max_starts=[
            q.rate_per_key.max_starts if q.rate_per_key else None for q in ordered
        ],
        key_rate_periods=[q.rate_per_key.period if q.rate_per_key else None for q in ordered],
    )


async def pause_queue(conn: Connection, name: str, *, paused: bool) -> bool:
    """Pause (`paused=True`) or resume queue `name` for every worker: a paused queue is
    claimed by none (its running jobs finish; enqueueing still works). A resume wakes the
    workers after the caller's commit. Return False for an unknown queue."""
    found = await sql.job_queue_pause.fetchval(conn, name=name, paused=paused) is not None
    if found and not paused:
        wake_workers_after_commit()
    return found


async def list_queues(
    conn: Connection, *, now: datetime, max_count: int | None = None
) -> list[dict[str, Any]]:
    """Return every queue by name: `paused`, its limits (None: none; periods as timedelta),
    and its jobs `ripe` and `scheduled` (queued, ripe by `now` or not; each counted up to
    `max_count`, None: all) and `running`."""
    return [dict(r) for r in await sql.job_queue_list.fetch(conn, now=now, max_count=max_count)]


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
