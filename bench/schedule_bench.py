"""The schedules' workload: `schedule_lateness`. One run, returning its lines' figures (see
`bench.queue_bench` for the set-up: worker processes `python -m jobq worker`, this process
the observer).

What is timed, exactly:

- `schedule_lateness`: one worker process importing `bench.schedule_handlers`: 100 schedules
  of `bench_stamp` firing every 2 s, all on the same even seconds, declared as the worker
  starts; its scheduler (every 1 s) enqueues each occurrence 10 s ahead as a job ripe at the
  occurrence's time (`jobq.queue.schedule`). Measured: the first 5 occurrences of every
  schedule at least `LEAD_S` after the worker registered (500 jobs, 100 ripe at each of 5
  instants). Lateness: the handler's first reading of the wall clock minus the occurrence's
  time (`job_occurrence.at`, joined by job id), both wall clock on the same machine. One line
  per number of slots of the worker (`concurrency`): 16 (the default) drains each instant's
  100 jobs in 7 claims, each after earlier jobs freed their slots; 128 claims them at once.
  `direct_*`: the same, in the same run, for 500 `bench_stamp` jobs enqueued directly
  (`enqueue_many`, before the first instant) ripe at the same 5 instants, 100 each, with no
  schedule: the queue's own lateness for 100 jobs ripe at one instant.

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
from bench.schedule_handlers import EVERY_S, PREFIX, SCHEDULES
from jobq.db import Connection
from jobq.queue import Job, enqueue_many
from tests.toolkit.procs import Proc, check_running, registered

OCCURRENCES = 5
"""Occurrences measured per schedule."""
CONCURRENCIES = (16, 128)
"""The worker's slots in each line: the default, and enough for a whole instant's jobs."""
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
    for slots in CONCURRENCIES:
        lateness = await _lateness_with(ctx, slots, schedules=True)
        direct = await _lateness_with(ctx, slots, schedules=False)
        lines.append(
            {
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


async def _lateness_with(ctx: Context, slots: int, *, schedules: bool) -> list[float]:
    """The lateness (s) of `OCCURRENCES` instants of `SCHEDULES` jobs each, run by one worker
    with `slots` slots: the schedules' occurrences, or (not `schedules`) as many `bench_stamp`
    jobs enqueued with `enqueue_many`, ripe at the same instants."""
    await ctx.database.reset()
    async with ctx.connection() as conn:
        await _forget_schedules(conn)
        modules = "bench.handlers" + (",bench.schedule_handlers" if schedules else "")
        proc = ctx.spawn(
            "worker",
            f"schedules-c{slots}" if schedules else f"schedules-direct-c{slots}",
            JOBQ_JOB_MODULES=modules,
            JOBQ_MAX_CONCURRENT_JOBS=str(slots),
        )
        try:
            await registered(conn, proc)
            first_s = math.ceil((time.time() + LEAD_S) / EVERY_S) * EVERY_S
            ats = [datetime.fromtimestamp(first_s + k * EVERY_S, UTC) for k in range(OCCURRENCES)]
            query: tuple[Any, ...] = (SCHEDULED, PREFIX, ats)
            if not schedules:
                await _enqueue_at(ctx, ats)
                query = (DIRECT,)
            within = first_s - time.time() + OCCURRENCES * EVERY_S + 20
            return await _lateness(conn, *query, within_s=within, proc=proc)
        finally:
            await proc.stop()
            await _forget_schedules(conn)


async def _enqueue_at(ctx: Context, ats: list[datetime]) -> None:
    """Enqueue `SCHEDULES` `bench_stamp` jobs ripe at each of `ats`, in one `enqueue_many`."""
    jobs = [
        Job(
            job_type=STAMP,
            arguments={"seq": seq, "due_s": at.timestamp(), "run": str(ctx.run)},
            ripe_at=at,
        )
        for at in ats
        for seq in range(SCHEDULES)
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
