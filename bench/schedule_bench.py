"""The schedules' workload: `schedule_lateness`. One run, returning its lines' figures (see
`bench.queue_bench` for the set-up: worker processes `python -m jobq worker`, this process
the observer).

What is timed, exactly:

- `schedule_lateness`: one worker process importing `bench.schedule_handlers`: 100 schedules
  of `bench_stamp`, declared as the worker starts; its scheduler (every 1 s) enqueues each
  occurrence 10 s ahead as a job ripe at the occurrence's time (`jobq.queue.schedule`).
  Measured: the first 5 occurrences of every schedule at least `LEAD_S` after the worker
  registered (500 jobs). Lateness: the handler's first reading of the wall clock minus the
  occurrence's time (`job_occurrence.at`, joined by job id), both wall clock on the same
  machine. Lines by `shape` and the worker's slots (`concurrency`):
  `spread` (the target's line): every 10 s, 10 schedules on each second of the period, so 10
  jobs ripe each second for 50 s, 16 slots (the default). `burst`: every 2 s, all 100 on the
  same even seconds, so 100 jobs ripe at each of 5 instants: with 16 slots an instant's jobs
  take 7 claims, each after earlier jobs freed their slots; with 128 one claim takes them all.
  `direct_*`: the same, in the same run, for as many `bench_stamp` jobs enqueued directly
  (`enqueue_many`, before the first instant) ripe at the same instants, with no schedule: the
  queue's own lateness for that shape.

`job_schedule` and `job_occurrence` are emptied before and after the run (`BenchDatabase.reset`
does not), so that no other workload's worker sees these schedules.
"""

from __future__ import annotations

import asyncio
import math
import time
from datetime import UTC, datetime
from typing import Any

from bench.context import Context, Figures
from bench.handlers import STAMP
from bench.loadgen import percentile
from bench.schedule_handlers import PREFIX, SCHEDULES, SHAPES
from jobq.db import Connection
from jobq.queue import Job, enqueue_many
from tests.toolkit.procs import Proc, check_running, registered

OCCURRENCES = 5
"""Occurrences measured per schedule."""
LINES = (("spread", 16), ("burst", 16), ("burst", 128))
"""Each line's shape and the worker's slots: the default, and enough for a burst's jobs."""
LEAD_S = 1.0
"""The first occurrence measured is at least this long after the worker registered: it is
enqueued by then and the worker idle, as it is in a steady state."""

SCHEDULED = """
SELECT e.started_s - extract(epoch FROM o.at) AS lateness_s
FROM job_occurrence AS o JOIN bench_event AS e ON e.job_id = o.job_id
WHERE starts_with(o.schedule, $1) AND o.at = ANY($2::timestamptz[])
"""
"""The lateness of every execution of the occurrences `$2` of the benchmark's schedules
(`$1`: their names' prefix)."""

DIRECT = "SELECT started_s - due_s AS lateness_s FROM bench_event WHERE due_s IS NOT NULL"
"""The same for the jobs enqueued directly (the run's only jobs with a due time)."""


async def schedule_lateness(ctx: Context) -> list[Figures]:
    """One run at each number of slots (16, the default, and 128): the schedules, then the same
    jobs enqueued directly."""
    lines = []
    for shape, slots in LINES:
        lateness = await _lateness_with(ctx, shape, slots, schedules=True)
        direct = await _lateness_with(ctx, shape, slots, schedules=False)
        lines.append(
            {
                "shape": shape,
                "concurrency": slots,
                "occurrences": len(lateness),
                "p50_ms": _ms(percentile(lateness, 50)),
                "p99_ms": _ms(percentile(lateness, 99)),
                "max_ms": _ms(max(lateness)),
                "min_ms": _ms(min(lateness)),
                "direct_p50_ms": _ms(percentile(direct, 50)),
                "direct_p99_ms": _ms(percentile(direct, 99)),
            }
        )
    return lines


async def _lateness_with(ctx: Context, shape: str, slots: int, *, schedules: bool) -> list[float]:
    """The lateness (s) of `OCCURRENCES` occurrences of each of `SCHEDULES` schedules of
    `shape`, run by one worker with `slots` slots: the schedules' occurrences, or (not
    `schedules`) as many `bench_stamp` jobs enqueued with `enqueue_many`, ripe at the same
    times."""
    period = SHAPES[shape]
    await ctx.database.reset()
    async with ctx.connection() as conn:
        await _forget_schedules(conn)
        modules = "bench.handlers" + (",bench.schedule_handlers" if schedules else "")
        what = f"schedules-{shape}-c{slots}" + ("" if schedules else "-direct")
        proc = ctx.spawn(
            "worker",
            what,
            JOBQ_JOB_MODULES=modules,
            JOBQ_MAX_CONCURRENT_JOBS=str(slots),
            JOBQ_BENCH_SHAPE=shape,
        )
        try:
            await registered(conn, proc)
            first_s = math.ceil((time.time() + LEAD_S) / period) * period
            # every second of the period has occurrences (spread) or the first one alone (burst)
            seconds = range(OCCURRENCES * period) if shape == "spread" else range(0, 10, 2)
            ats = [datetime.fromtimestamp(first_s + k, UTC) for k in seconds]
            query: tuple[Any, ...] = (SCHEDULED, PREFIX, ats)
            if not schedules:
                await _enqueue_at(ctx, ats, per_instant=SCHEDULES * OCCURRENCES // len(ats))
                query = (DIRECT,)
            within = first_s - time.time() + OCCURRENCES * period + 20
            return await _lateness(conn, *query, within_s=within, proc=proc)
        finally:
            await proc.stop()
            await _forget_schedules(conn)


async def _enqueue_at(ctx: Context, ats: list[datetime], *, per_instant: int) -> None:
    """Enqueue `per_instant` `bench_stamp` jobs ripe at each of `ats`, in one `enqueue_many`."""
    jobs = [
        Job(
            job_type=STAMP,
            arguments={"seq": seq, "due_s": at.timestamp(), "run": str(ctx.run)},
            ripe_at=at,
        )
        for at in ats
        for seq in range(per_instant)
    ]
    async with ctx.jobq_database():
        assert len(await enqueue_many(jobs)) == len(jobs), "unexpected duplicates"


async def _forget_schedules(conn: Connection) -> None:
    await conn.execute("TRUNCATE job_schedule, job_occurrence")


async def _lateness(
    conn: Connection, query: str, *args: Any, within_s: float, proc: Proc
) -> list[float]:
    """Wait until `query` (with `args`) returns the lateness of the `OCCURRENCES` instants'
    `SCHEDULES` jobs each; return it (s)."""
    count = SCHEDULES * OCCURRENCES
    deadline = time.monotonic() + within_s
    while len(rows := await conn.fetch(query, *args)) < count:
        check_running((proc,))
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(rows)} of {count} jobs ran within {within_s:g} s")
        await asyncio.sleep(0.05)
    assert len(rows) == count, f"{len(rows)} executions of {count} jobs"
    return [r["lateness_s"] for r in rows]


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)
