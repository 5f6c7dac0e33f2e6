"""`python -m jobq check`: verify the queue's invariants on a live database.

The check reads (it never writes) in one REPEATABLE READ snapshot, so the three queue tables
are seen at one instant, as the single-statement moves between them leave them:

- `one_place`: no job is in two of `job`, `job_running`, `job_dead`, `job_waiting`
  (guarantee 2).
- `running_held`: every running job is held by a live worker, or awaits a rescue that is not
  overdue: its worker died, or its lease expired, less than `rescue_grace` ago. A live worker
  is one that holds its liveness lock, or whose process still has a session and heartbeated
  within `heartbeat_grace` (the rescue's own rule: `job_workers_alive`). A violation means
  jobs stuck in `job_running`: no worker is rescuing them.
- `attempts_within_limit`: no queued or running job is past its last attempt (it belongs in the
  dead letter).
- `limits_held`: no queue, and no concurrency key of a queue, has more jobs in `job_running`
  than its concurrency limit (`job_queue.max_running`, `max_running_per_key`).

It also counts the jobs per state and the workers alive or dead (the queued jobs as the last
depth snapshot counted them once `job` holds more than `metrics.LIVE_COUNT_MAX`: counting ten
million rows would take seconds; every invariant is still checked whole, through indexes). The
command prints the report as JSON and exits 1 when an invariant fails, 0 otherwise.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import asyncpg
from pydantic import AwareDatetime, BaseModel

from jobq.db import Connection
from jobq.queue import metrics, sql

RESCUE_GRACE = timedelta(seconds=60)
"""Default: how long a running job of a dead or hung worker may wait for its rescue."""

MAX_SAMPLE = 20
"""How many offending job ids a failed invariant lists."""


class StateCounts(BaseModel):
    """Jobs per state (queued ripe or scheduled, running, dead) and workers alive or dead."""

    queued_ripe: int
    queued_scheduled: int
    running: int
    running_lease_expired: int
    dead: int
    workers_alive: int
    workers_dead: int
    queued_counted_at: AwareDatetime | None
    """None: the queued jobs were counted in the check's snapshot; else `job` holds more than
    `metrics.LIVE_COUNT_MAX` jobs and they are as the last depth snapshot counted them, at this
    time."""


class Invariant(BaseModel):
    """One invariant: whether it holds, and if not how many jobs break it (and some ids)."""

    name: str
    description: str
    ok: bool
    violations: int
    sample_job_ids: list[int]


class CheckReport(BaseModel):
    """The outcome of `check`: `ok` when every invariant holds."""

    ok: bool
    checked_at: AwareDatetime
    counts: StateCounts
    invariants: list[Invariant]


async def check(
    conn: Connection,
    *,
    now: datetime,
    heartbeat_grace: timedelta,
    rescue_grace: timedelta = RESCUE_GRACE,
) -> CheckReport:
    """Check the queue's invariants on `conn` at `now` (aware UTC) and return the report.

    `heartbeat_grace`: how recent a heartbeat keeps a worker without its lock alive (the
    workers use 3 heartbeat intervals). `rescue_grace`: how long a job of a dead or hung worker
    may stay in `job_running` before its rescue counts as overdue.
    Raises: `asyncpg.PostgresError` (e.g. an unmigrated database).
    """
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        counted_at = await metrics.snapshot_counts(conn)
        counts = await sql.check_counts.fetchrow(
            conn, now=now, heartbeat_grace=heartbeat_grace, counted=counted_at is not None
        )
        places = await sql.check_places.fetchrow(conn, max_sample=MAX_SAMPLE)
        running = await sql.check_running.fetchrow(
            conn,
            now=now,
            heartbeat_grace=heartbeat_grace,
            rescue_grace=rescue_grace,
            max_sample=MAX_SAMPLE,
        )
        attempts = await sql.check_attempts.fetchrow(conn, max_sample=MAX_SAMPLE)
        limits = await sql.check_limits.fetchrow(conn, max_sample=MAX_SAMPLE)
    assert limits is not None
    assert counts is not None
    assert places is not None
    assert running is not None
    assert attempts is not None
    invariants = [
        _invariant("one_place", "no job is in two of job, job_running, job_dead at once", places),
        _invariant(
            "running_held",
            "every running job is held by a live worker, or its worker died or its lease "
            f"expired less than {rescue_grace.total_seconds():g} s ago (rescue not overdue)",
            running,
        ),
        _invariant(
            "attempts_within_limit",
            "no queued or running job is past its last attempt (attempts <= max_retries)",
            attempts,
        ),
        _invariant(
            "limits_held",
            "no queue or concurrency key has more jobs running than its concurrency limit",
            limits,
        ),
    ]
    return CheckReport(
        ok=all(i.ok for i in invariants),
        checked_at=now,
        counts=StateCounts.model_validate({**counts, "queued_counted_at": counted_at}),
        invariants=invariants,
    )


def _invariant(name: str, description: str, row: asyncpg.Record) -> Invariant:
    violations: int = row["violations"]
    sample: list[int] = list(row["sample"])
    return Invariant(
        name=name,
        description=description,
        ok=violations == 0,
        violations=violations,
        sample_job_ids=sample,
    )
