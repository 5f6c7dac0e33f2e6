"""The scheduler: each schedule's occurrences enqueued once, ahead of their time, ripe at it.

Each round (`enqueue_due`, every `Settings.schedule_interval`, in the elected leader) locks
the schedules whose next occurrence falls within `LOOK_AHEAD` (`FOR UPDATE SKIP LOCKED`: should
two rounds run at once, as when the lead changes hands during one, each schedule is handled by
one of them), enqueues their occurrences as jobs ripe at their times, each with its row in
`job_occurrence` (primary key: schedule and time), and advances `next_at`, in one transaction.
So an occurrence makes exactly one job however many processes look, and that job waits in the
queue for its time like any scheduled job: its lateness is the queue's. The schedules
themselves (declared in code, saved by the application) are `jobq.queue.schedule`'s; when
their occurrences are, `jobq.queue.recurrence`'s.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from jobq import clock, db
from jobq.config import Settings
from jobq.db import Connection, Database
from jobq.queue import metrics, sql, wakeup
from jobq.queue.recurrence import LOOK_AHEAD, OverBudget, due, recurrence_of
from jobq.queue.registry import Registry
from jobq.queue.service import Service

log = logging.getLogger(__name__)


def scheduler(database: Database, settings: Settings, handlers: Registry) -> Service:
    """The scheduler (`enqueue_due`), every `settings.schedule_interval`, for the job types
    of `handlers` (their queues and retries). Its round returns how many jobs were enqueued."""

    async def schedule() -> int:
        return await enqueue_due(database, handlers, now=clock.now())

    return Service("schedule", settings.schedule_interval, schedule)


async def enqueue_due(
    database: Database, handlers: Registry, *, now: datetime, look_ahead: timedelta = LOOK_AHEAD
) -> int:
    """One round of the scheduler: for each schedule (not paused) whose next occurrence falls
    before `now + look_ahead`, locked for this worker alone, enqueue its occurrences due
    (`due`) as jobs ripe at their times, each recorded in `job_occurrence`, and advance its
    `next_at`, in one transaction. Return how many jobs were enqueued.
    Raises: `asyncpg.PostgresError` / `OSError` (then nothing is enqueued).
    """
    enqueued = 0
    db.bind(database)  # in the caller's context (a service's own)
    async with db.transaction() as conn:
        for row in await sql.schedule_due.fetch(conn, horizon=now + look_ahead, limit=100):
            try:
                ats, next_at = due(
                    recurrence_of(row),
                    row["next_at"],
                    now=now,
                    horizon=now + look_ahead,
                    misfire=row["misfire"],
                    backfill=row["backfill"],
                )
            except OverBudget as exc:  # its rule's next occurrence: too far, or too costly
                log.warning("schedule %s ends: %s", row["name"], exc)
                ats, next_at = [], None
            if ats:
                enqueued += await _occurrences(conn, row, ats, handlers, now)
            await sql.schedule_advance.execute(conn, name=row["name"], next_at=next_at)
        if enqueued:
            wakeup.wake_workers_after_commit()
    return enqueued


async def _occurrences(
    conn: Connection, row: Any, ats: list[datetime], handlers: Registry, now: datetime
) -> int:
    """Enqueue the occurrences `ats` of schedule `row` not enqueued before; return how many."""
    job_type = row["job_type"]
    queue = row["queue"] or handlers.queue_of(job_type)
    rows = await sql.schedule_enqueue.fetch(
        conn,
        name=row["name"],
        ats=ats,
        at_texts=[at.astimezone(UTC).isoformat() for at in ats],
        job_type=job_type,
        arguments=row["arguments"],
        occurrence_arg=row["occurrence_arg"],
        queue=queue,
        max_retries=handlers.max_retries_of(job_type),
        now=now,
        concurrency_key=row["concurrency_key"],
    )
    metrics.count_after_commit([(queue, job_type)] * len(rows), "enqueued")
    return len(rows)
