"""Job control's workloads: `retention_overhead`, `cancel_latency` and `wait_wakeup`. Each
function is one run and returns its lines' figures (see `bench.queue_bench` for the set-up:
worker processes `python -m jobq worker` with `bench.handlers`, this process the producer).

What is timed, exactly:

- `retention_overhead`: `bench.queue_bench`'s throughput drain at concurrency 16 (20,000
  `bench_noop` jobs), once with `JOBQ_RETENTION_S=0` (finished jobs not kept) and once with the
  default 7 days (each one's row and result written to `job_done`), in the same run, in that
  order. `ratio_to_off`: jobs_per_s with retention over without.
- `cancel_latency`: an idle worker (16 slots); 100 times, one `bench_sleep` job of 60 s is
  enqueued, seen running, and cancelled (`jobq.queue.control.cancel`, autocommit). Latency:
  the job's `finished_at` (the worker's clock when it records the cancelled handler's outcome,
  after the handler has stopped) minus this process's wall clock right after the cancel's
  COMMIT returned.
- `wait_wakeup`: an idle worker (16 slots); 200 times, one `bench_noop` job is enqueued ripe
  50 ms later and awaited (`jobq.queue.control.await_end`, whose listener is connected
  beforehand). Wake-up: the waiter's wall clock when `await_end` returns minus the job's
  `finished_at` (the worker's clock as its outcome statement is built, just before it runs and
  commits): so it also counts the outcome statement and its commit.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from bench.context import Context, Figures
from bench.handlers import NOOP, SLEEP
from bench.loadgen import percentile
from bench.queue_bench import _worker_drain
from jobq import clock
from jobq.queue import Job, enqueue
from jobq.queue.control import JobState, await_end, cancel, waiters
from tests.toolkit.procs import eventually, registered

CANCELS = 100
WAITS = 200


async def retention_overhead(ctx: Context) -> list[Figures]:
    """Throughput at concurrency 16 without retention, then with it."""
    off = await _worker_drain(ctx, 16, JOBQ_RETENTION_S="0")
    on = await _worker_drain(ctx, 16)
    return [
        {
            "concurrency": 16,
            "jobs_per_s": on["jobs_per_s"],
            "off_jobs_per_s": off["jobs_per_s"],
            "ratio_to_off": round(on["jobs_per_s"] / off["jobs_per_s"], 3),
        }
    ]


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def _summary(samples: list[float]) -> Figures:
    return {
        "samples": len(samples),
        "p50_ms": _ms(percentile(samples, 50)),
        "p99_ms": _ms(percentile(samples, 99)),
        "max_ms": _ms(max(samples)),
    }


async def cancel_latency(ctx: Context) -> list[Figures]:
    """Cancel a running async job, 100 times; the time until its handler stopped."""
    await ctx.database.reset()
    proc = ctx.spawn("worker", "cancel-latency", JOBQ_MAX_CONCURRENT_JOBS="16")
    samples = []
    try:
        async with ctx.connection() as conn:
            await registered(conn, proc)
            async with ctx.jobq_database() as database:
                for i in range(CANCELS):
                    job = await enqueue(Job(job_type=SLEEP, arguments={"seconds": 60, "i": i}))

                    async def running(job_id: int = job.id) -> bool:
                        found: bool = await conn.fetchval(
                            "SELECT EXISTS (SELECT FROM job_running WHERE id = $1)", job_id
                        )
                        return found

                    await eventually(running, within=10, what="the job to run", running=(proc,))
                    state = await cancel(conn, job.id, now=clock.now(), retain=True)
                    cancelled_s = time.time()
                    assert state is JobState.RUNNING
                    ended = await await_end(job.id, 10, database=database)
                    assert ended.state is JobState.CANCELLED
                    assert ended.finished_at is not None
                    samples.append(ended.finished_at.timestamp() - cancelled_s)
    finally:
        await proc.stop()
    return [_summary(samples)]


async def wait_wakeup(ctx: Context) -> list[Figures]:
    """Await a job 200 times; the time from its outcome to the waiter's wake-up."""
    await ctx.database.reset()
    proc = ctx.spawn("worker", "wait-wakeup", JOBQ_MAX_CONCURRENT_JOBS="16")
    samples = []
    try:
        async with ctx.connection() as conn:
            await registered(conn, proc)
        async with ctx.jobq_database() as database:
            await waiters(database).subscribe(0)  # the listener is connected beforehand
            for i in range(WAITS):
                ripe_at = datetime.now(UTC) + timedelta(milliseconds=50)
                job = await enqueue(Job(job_type=NOOP, arguments={"i": i}, ripe_at=ripe_at))
                ended = await await_end(job.id, 10, database=database)
                woken_s = time.time()
                assert ended.state is JobState.SUCCEEDED
                assert ended.finished_at is not None
                samples.append(woken_s - ended.finished_at.timestamp())
    finally:
        await proc.stop()
    return [_summary(samples)]
