"""The history: once a minute the leader copies each queue's cumulative counts and timing
histograms into `job_history` (`sql.job_history_take`), for the dashboard's charts
(`jobq.queue.history`), and forgets the rows older than `KEEP`.

A row holds the counts as they stand, not a minute's increments, so two leaders at once write
one row (the minute is the key), and a minute no leader wrote only makes one step of a chart
twice as long. The table holds at most one row per queue and minute of the last `KEEP`.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from jobq import clock
from jobq.db import Database
from jobq.queue import sql
from jobq.queue.metrics import BOUNDS
from jobq.queue.service import Service

EVERY = timedelta(minutes=1)
"""How often the leader offers to write a minute's rows."""

KEEP = timedelta(hours=25)
"""How long rows are kept: the longest chart (24 h) and its first step."""


def minute_of(now: datetime) -> datetime:
    """`now` rounded down to its minute."""
    return now.replace(second=0, microsecond=0)


async def take_history(database: Database, *, now: datetime) -> int:
    """Write the rows of `now`'s minute (none when written already) and forget those older
    than `KEEP`; return how many rows were written. Raises: `asyncpg.PostgresError`."""
    async with database.pool.acquire() as conn:
        written: int = await sql.job_history_take.fetchval(
            conn, at=minute_of(now), bounds=list(BOUNDS), num_buckets=len(BOUNDS) + 1
        )
        await sql.job_history_prune.execute(conn, cutoff=now - KEEP)
    return written


def history_writer(database: Database) -> Service:
    """The service that writes the history every `EVERY` (`take_history`)."""

    async def once() -> int:
        return await take_history(database, now=clock.now())

    return Service("history", EVERY, once)
