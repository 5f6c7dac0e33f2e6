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

import contextlib
from collections.abc import Collection, Iterable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from jobq import db
from jobq.db import Connection, Database
from jobq.errors import Conflict, NotFound
from jobq.queue import control, metrics, sql, store
from jobq.queue.recurrence import LOOK_AHEAD, ScheduleSpec, due, recurrence_of

if TYPE_CHECKING:
    from jobq.queue.registry import Registry


async def read_schedules(conn: Connection) -> list[dict[str, Any]]:
    """Every row of `job_schedule`, all its columns, by its first column; none when the table
    does not exist (a database from before schedules)."""
    if not await sql.schedule_table.fetchval(conn):
        return []
    return [dict(r) for r in await sql.schedule_list.fetch(conn)]


def next_occurrences(row: Any, count: int) -> list[datetime]:
    """The next `count` occurrences (aware UTC) of schedule `row` (a `job_schedule` row) from
    its `next_at` on (that one first); fewer when it ends, none when paused or ended."""
    at: datetime | None = row["next_at"]
    if row["paused"] or at is None:
        return []
    recurrence = recurrence_of(row)
    found: list[datetime] = []
    while at is not None and len(found) < count:
        found.append(at)
        at = recurrence.after(at)
    return found


async def next_at(conn: Connection, names: Collection[str]) -> dict[str, datetime | None]:
    """Return the next occurrence of each schedule of `names` that exists, by name (None: it has
    ended), in one statement however many there are (`schedule_next_at`)."""
    if not names:
        return {}
    rows = await sql.schedule_next_at.fetch(conn, names=list(names))
    return {r["name"]: r["next_at"] for r in rows}


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
            conn,
            **spec.row(),
            source="code",
            occurrence_arg=None,
            next_at=first,
            spec=spec.text(),
            concurrency_key=None,
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


async def save(
    conn: Connection,
    *,
    name: str,
    job_type: str,
    arguments: dict[str, Any],
    rrule: str,
    tz: str,
    starts_at: datetime,
    queue: str,
    concurrency_key: str | None,
    occurrence_arg: str,
) -> datetime | None:
    """Write a run-time schedule (source `reminder`): `job_type` with `arguments` (and
    `occurrence_arg` set to each occurrence's time) at each occurrence of `rrule` from
    `starts_at` in zone `tz`, one catch-up after a misfire. In the caller's transaction.
    Return its first occurrence (None: it has none).
    Raises: `ValueError` for an invalid RRULE or zone; `asyncpg.PostgresError`."""
    row = {"cron": None, "every_s": None, "rrule": rrule, "tz": tz, "starts_at": starts_at}
    first = recurrence_of(row).after(starts_at - timedelta(microseconds=1))
    await sql.schedule_declare.execute(
        conn,
        name=name,
        source="reminder",
        job_type=job_type,
        arguments=arguments,
        occurrence_arg=occurrence_arg,
        queue=queue,
        misfire="one",
        backfill=None,
        next_at=first,
        spec=f"{rrule} {tz} {starts_at.isoformat()}",
        concurrency_key=concurrency_key,
        **row,
    )
    return first


async def pause(conn: Connection, name: str, *, paused: bool, now: datetime) -> None:
    """Pause schedule `name` (its occurrences queued are cancelled, none is enqueued until it
    resumes), or resume it from its first occurrence after `now` (none of those of the pause
    is made up). In the caller's transaction. Raises: `KeyError` for an unknown schedule."""
    row = await sql.schedule_lock.fetchrow(conn, name=name)
    if row is None:
        raise KeyError(name)
    next_at = None if paused else recurrence_of(row).after(now)
    await sql.schedule_pause.execute(conn, name=name, paused=paused, next_at=next_at)
    if paused:
        await _cancel_pending(conn, name, now=now)


async def drop(conn: Connection, name: str, *, now: datetime) -> None:
    """Delete schedule `name` and cancel its occurrences queued or running (in the caller's
    transaction)."""
    await sql.schedule_drop.execute(conn, name=name)
    await _cancel_pending(conn, name, now=now)


async def _cancel_pending(conn: Connection, name: str, *, now: datetime) -> None:
    for r in await sql.schedule_pending_jobs.fetch(conn, name=name):
        with contextlib.suppress(NotFound, Conflict):  # it ended meanwhile
            await control.cancel(conn, r["job_id"], now=now, retain=True)
