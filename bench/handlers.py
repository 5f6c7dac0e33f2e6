"""The benchmark's job handlers, imported by worker processes through
`JOBQ_JOB_MODULES=bench.handlers` (with `PYTHONPATH` at the project root).

- `bench_noop` does nothing: the drain measures the queue alone.
- `bench_sleep` sleeps `seconds`: a slow job that holds its slot.
- `bench_stamp` reads the wall clock (`time.time()`) first thing, then records it in
  `bench_event` in a transaction of its own (after the reading, so the insert never delays it).
  The producer records its own wall-clock reading right after the enqueue's COMMIT returned;
  both run on the same machine, so the two readings compare.
"""

from __future__ import annotations

import asyncio
import time

from pydantic import BaseModel

from jobq.db import transaction
from jobq.queue import JobContext, handler

NOOP = "bench_noop"
STAMP = "bench_stamp"
SLEEP = "bench_sleep"

TABLES_SQL = """
CREATE TABLE IF NOT EXISTS bench_event (
    job_id     bigint           NOT NULL,
    seq        integer          NOT NULL,
    started_s  double precision NOT NULL,
    due_s      double precision
);
CREATE TABLE IF NOT EXISTS bench_bare (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message    text        NOT NULL,
    created_at timestamptz NOT NULL
);
"""
"""The benchmark's own tables, created beside jobq's in the benchmark database:
`bench_event` (one row per `bench_stamp` run: when its handler started, in epoch seconds, and
when it was due, for scheduled jobs) and `bench_bare` (the bare endpoint's inserts)."""


class NoopArgs(BaseModel):
    """`i` only tells otherwise identical jobs apart (dedup)."""

    i: int = 0


class StampArgs(BaseModel):
    """`seq`: the job's number in its batch; `due_s`: its `ripe_at` in epoch seconds (None for
    an immediate job); `run` tells the jobs of different runs apart (dedup)."""

    seq: int
    due_s: float | None = None
    run: str = ""


@handler(NOOP, args=NoopArgs)
async def bench_noop(args: NoopArgs, job: JobContext) -> None:
    """Do nothing."""


@handler(STAMP, args=StampArgs)
async def bench_stamp(args: StampArgs, job: JobContext) -> None:
    """Record when this handler started (wall clock, epoch seconds) in `bench_event`."""
    started_s = time.time()
    async with transaction() as conn:
        await conn.execute(
            "INSERT INTO bench_event (job_id, seq, started_s, due_s) VALUES ($1, $2, $3, $4)",
            job.id,
            args.seq,
            started_s,
            args.due_s,
        )


class SleepArgs(BaseModel):
    """`seconds` to sleep; `i` tells otherwise identical jobs apart (dedup)."""

    seconds: float
    i: int = 0


@handler(SLEEP, args=SleepArgs)
async def bench_sleep(args: SleepArgs, job: JobContext) -> None:
    """Sleep `seconds`."""
    await asyncio.sleep(args.seconds)
