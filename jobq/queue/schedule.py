"""Recurring schedules: what they are and how they change (declare, save, pause, drop).

Schedules live in `job_schedule`: those declared in code (`Registry.periodic`) are written
there at every worker's start (`declare`), the others by the application (recurring
reminders, `save`). When their occurrences are: `jobq.queue.recurrence` (cron, interval, RRULE;
time zones and DST; misfires). The elected leader alone enqueues their occurrences, each once
(`jobq.queue.leader.schedules`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterable
from datetime import datetime
from typing import Any

from jobq.db import Connection
from jobq.errors import Conflict, NotFound
from jobq.queue import control, rrules, sql
from jobq.queue.recurrence import OverBudget, ScheduleSpec, after_or_end, recurrence_of


async def read_schedules(conn: Connection) -> list[dict[str, Any]]:
    """Every row of `job_schedule`, all its columns, by its first column; none when the table
    does not exist (a database from before schedules)."""
    if not await sql.schedule_table.fetchval(conn):
        return []
    return [dict(r) for r in await sql.schedule_list.fetch(conn)]


def next_occurrences(row: Any, count: int) -> list[datetime]:
    """The next `count` occurrences (aware UTC) of schedule `row` (a `job_schedule` row) from
    its `next_at` on (that one first, stored: a count of 1 computes nothing); fewer when it
    ends or the others are over budget (`jobq.queue.rrules`), none when paused or ended."""
    at: datetime | None = row["next_at"]
    if row["paused"] or at is None:
        return []
    found = [at]
    recurrence = recurrence_of(row) if count > 1 else None
    with contextlib.suppress(OverBudget):
        while recurrence is not None and at is not None and len(found) < count:
            at = recurrence.after(at)
            if at is not None:
                found.append(at)
    return found


async def upcoming(
    conn: Connection, names: Collection[str], count: int
) -> dict[str, list[datetime]]:
    """The next `count` occurrences of each schedule of `names` that exists, by name (none: it
    has ended, or is paused), read in one statement however many there are
    (`schedule_next_at`); beyond the stored next one, computed off the event loop
    (`next_occurrences`, `rrules.off_loop`)."""
    if not names:
        return {}
    rows = await sql.schedule_next_at.fetch(conn, names=list(names))
    if count > 1:
        return {r["name"]: await rrules.off_loop(next_occurrences, r, count) for r in rows}
    return {r["name"]: next_occurrences(r, count) for r in rows}


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
    first: datetime | None,
) -> None:
    """Write a run-time schedule (source `reminder`): `job_type` with `arguments` (and
    `occurrence_arg` set to each occurrence's time) at each occurrence of `rrule` from
    `starts_at` in zone `tz`, the first at `first` (worked out by the caller, off the event
    loop; None: it has none), one catch-up after a misfire. In the caller's transaction.
    Raises: `asyncpg.PostgresError`."""
    row = {"cron": None, "every_s": None, "rrule": rrule, "tz": tz, "starts_at": starts_at}
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


async def pause(conn: Connection, name: str, *, paused: bool, now: datetime) -> None:
    """Pause schedule `name` (its occurrences queued are cancelled, none is enqueued until it
    resumes), or resume it from its first occurrence after `now` (none of those of the pause
    is made up). In the caller's transaction. Raises: `KeyError` for an unknown schedule."""
    row = await sql.schedule_lock.fetchrow(conn, name=name)
    if row is None:
        raise KeyError(name)
    next_at = None if paused else after_or_end(recurrence_of(row), now, name)
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
