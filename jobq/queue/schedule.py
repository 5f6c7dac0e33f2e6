"""Recurring schedules: each occurrence enqueued once, ahead of its time, ripe at it.

Schedules live in `job_schedule`: those declared in code (`Registry.periodic`) are written
there at every worker's start (`declare`), the others by the application (recurring
reminders). When their occurrences are: `jobq.queue.recurrence` (cron, interval, RRULE; time
zones and DST; misfires).

Every worker runs the scheduler (`enqueue_due`, every `Settings.schedule_interval`): it locks
the schedules whose next occurrence falls within `LOOK_AHEAD` (`FOR UPDATE SKIP LOCKED`: each
is handled by one worker at a time), enqueues their occurrences as jobs ripe at their times,
each with its row in `job_occurrence` (primary key: schedule and time), and advances `next_at`,
in one transaction. So an occurrence makes exactly one job whatever the number of workers, and
that job waits in the queue for its time like any scheduled job: its lateness is the queue's.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from jobq import db
from jobq.db import Connection, Database
from jobq.queue import sql, store
from jobq.queue.recurrence import LOOK_AHEAD, ScheduleSpec, due, recurrence_of

if TYPE_CHECKING:
    from jobq.queue.registry import Registry


async def declare(conn: Connection, specs: Iterable[ScheduleSpec], *, now: datetime) -> None:
    """Make the code schedules of `job_schedule` those of `specs`: add the new ones, restart
    the changed ones from `now` (their next occurrence after it), leave the unchanged ones as
    they are (their `next_at` too), delete the others (their queued jobs stay). In the
    caller's transaction, names sorted: workers starting together never deadlock.
    Raises: `asyncpg.PostgresError`."""
    ordered = sorted(specs, key=lambda s: s.name)
    await sql.schedule_forget_code.execute(conn, names=[s.name for s in ordered])
    for spec in ordered:
        first = recurrence_of(spec.row()).after(now)
        await sql.schedule_declare.execute(
            conn, **spec.row(), source="code", occurrence_arg=None, next_at=first, spec=spec.text()
        )


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
            ats, next_at = due(
                recurrence_of(row),
                row["next_at"],
                now=now,
                horizon=now + look_ahead,
                misfire=row["misfire"],
                backfill=row["backfill"],
            )
            if ats:
                enqueued += await _occurrences(conn, row, ats, handlers, now)
            await sql.schedule_advance.execute(conn, name=row["name"], next_at=next_at)
        if enqueued:
            store.wake_workers_after_commit()
    return enqueued


async def _occurrences(
    conn: Connection, row: Any, ats: list[datetime], handlers: Registry, now: datetime
) -> int:
    """Enqueue the occurrences `ats` of schedule `row` not enqueued before; return how many."""
    job_type = row["job_type"]
    rows = await sql.schedule_enqueue.fetch(
        conn,
        name=row["name"],
        ats=ats,
        at_texts=[at.astimezone(UTC).isoformat() for at in ats],
        job_type=job_type,
        arguments=row["arguments"],
        occurrence_arg=row["occurrence_arg"],
        queue=row["queue"] or handlers.queue_of(job_type),
        max_retries=handlers.max_retries_of(job_type),
        now=now,
    )
    return len(rows)
