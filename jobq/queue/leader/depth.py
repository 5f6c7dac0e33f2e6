"""The depth snapshot: the queue depths counted into `job_depth`, by one process at a time.

Counting the queue depths reads all of `job`, so a scrape never counts them: the leader's
`depth_snapshot` offers every `Settings.metrics_snapshot_interval`, and a process counts only
when it wins the election (`elect`): the metrics lock is its, and the last snapshot is stale.
A count that took long makes the next one wait 20 times as long (5% of a core at most).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from jobq import clock
from jobq.config import Settings
from jobq.db import Connection, Database
from jobq.queue import sql
from jobq.queue.service import Service


async def elect(conn: Connection, *, now: datetime, fresh_for: timedelta) -> bool:
    """Whether the transaction in progress on `conn` takes the depth snapshot at `now`: it
    holds the metrics lock (`sql.job_depth_lock`, until it ends), and then, in a statement
    begun after the lock was taken, the last snapshot is older than `fresh_for` and than 20
    times the time it took (`sql.job_depth_stale`). In one statement, the check would read
    the database as of that statement's start, which may be before the last holder of the
    lock committed its snapshot: two processes would count. The transaction must be READ
    COMMITTED (the default). Raises: `asyncpg.PostgresError`."""
    if not await sql.job_depth_lock.fetchval(conn):
        return False
    return bool(await sql.job_depth_stale.fetchval(conn, now=now, fresh_for=fresh_for))


async def take_depth_snapshot(
    database: Database, *, now: datetime, interval: timedelta, retention: timedelta
) -> int:
    """Count the queue depths into `job_depth` (`sql.job_depth_take`) if this process wins the
    election (`elect`: the last snapshot is older than half an `interval` and than 20 times the
    time its count took); then forget the trace contexts (`job_trace`) older than `retention`
    (and a day), 5,000 at a time. Return how many queues were counted (0: another process did,
    or will). Raises: `asyncpg.PostgresError`."""
    async with database.pool.acquire() as conn:
        async with conn.transaction():
            if not await elect(conn, now=now, fresh_for=interval / 2):
                return 0
            started = time.perf_counter()
            status = await sql.job_depth_take.execute(conn, now=now)
            took_s = time.perf_counter() - started
            await sql.job_depth_took.execute(conn, took_s=took_s, now=now)
        cutoff = now - max(retention, timedelta(days=1))
        while await sql.job_trace_prune.fetchval(conn, cutoff=cutoff, batch=5000) == 5000:
            pass
    return int(status.split()[-1])


def depth_snapshot(database: Database, settings: Settings) -> Service:
    """The service that offers to take the depth snapshot (`take_depth_snapshot`) every
    `settings.metrics_snapshot_interval`, and forgets the trace contexts older than
    `settings.retention`. Its round returns how many queues were counted."""

    async def once() -> int:
        return await take_depth_snapshot(
            database,
            now=clock.now(),
            interval=settings.metrics_snapshot_interval,
            retention=settings.retention,
        )

    return Service("metrics snapshot", settings.metrics_snapshot_interval, once)
