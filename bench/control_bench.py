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
- `prune_under_load`: a worker, and `bench_stamp` jobs enqueued at 50/s (each its own
  transaction) throughout. 1,000,000 finished jobs fill a day 30 days ago (its own
  partition). `baseline`: 5 s of the load alone. `drop`: `prune_finished` (7 days' retention)
  drops that day's partition, 1 s into the phase, which lasts 1 s past it. `delete`: the same
  number of rows, finished in 2001 (no partition: the default one), deleted by the same pruner
  in batches of 5,000 (what pruning would be without partitions). Per phase, for the jobs
  enqueued in it: pickup (handler start minus COMMIT) and ack (the outcome's insert into
  `job_done`, read by a trigger's `clock_timestamp()`, minus handler start) p99, and the
  pruning's duration.
- `wait_wakeup`: an idle worker (16 slots); 200 times, one `bench_noop` job is enqueued ripe
  50 ms later and awaited (`jobq.queue.control.await_end`, whose listener is connected
  beforehand). Wake-up: the waiter's wall clock when `await_end` returns minus the job's
  `finished_at` (the worker's clock as its outcome statement is built, just before it runs and
  commits): so it also counts the outcome statement and its commit.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from datetime import UTC, datetime, timedelta

from bench.context import Context, Figures
from bench.handlers import NOOP, SLEEP, STAMP
from bench.loadgen import percentile
from bench.queue_bench import RAW_JOBS, _worker_drain
from jobq import clock
from jobq.queue import Job, enqueue
from jobq.queue.control import JobState, await_end, cancel, waiters
from jobq.queue.leader.prune import partition_name, prune_finished
from tests.toolkit.procs import eventually, registered

CANCELS = 100
WAITS = 200


async def retention_overhead(ctx: Context) -> list[Figures]:
    """Throughput at concurrency 16 without retention, then with it."""
    off = await _worker_drain(ctx, 16, RAW_JOBS, JOBQ_RETENTION_S="0")
    on = await _worker_drain(ctx, 16, RAW_JOBS)
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
                    state = (await cancel(conn, job.id, now=clock.now(), retain=True)).state
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


PRUNE_ROWS = 1_000_000
LOAD_RATE_PER_S = 50.0

ACK_TRIGGER = """
CREATE TABLE IF NOT EXISTS bench_ack (job_id bigint NOT NULL, at_s double precision NOT NULL);
CREATE OR REPLACE FUNCTION bench_ack() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO bench_ack SELECT id, extract(epoch FROM clock_timestamp()) FROM arrived;
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER bench_ack AFTER INSERT ON job_done
    REFERENCING NEW TABLE AS arrived FOR EACH STATEMENT EXECUTE FUNCTION bench_ack();
TRUNCATE bench_ack;
"""
"""Each completion's moment (the outcome statement's insert into `job_done`, after any lock it
waited for), by job id."""

FILL = """
INSERT INTO job_done (id, job_type, queue, arguments, state, attempts, created_at, finished_at)
SELECT -g, 'bench_old', 'default', '{}', 'succeeded', 1, $1::timestamptz,
       $1::timestamptz + (g % 86000) * interval '1 s'
FROM generate_series(1, $2) AS g
"""
"""`$2` finished jobs on the UTC day starting `$1` (negative ids: never a real job's)."""


async def prune_under_load(ctx: Context) -> list[Figures]:
    """Pickup and ack latency of a steady load while the pruner removes 1,000,000 finished
    jobs: a day's partition dropped, then the same number of rows deleted from the default
    partition in batches (the choice not made), against the same load before."""
    await ctx.database.reset()
    # its own pruner keeps everything (ten years): the bench prunes, at its moments
    proc = ctx.spawn("worker", "prune-under-load", JOBQ_RETENTION_S=str(10 * 365 * 86400))
    old_day = datetime.now(UTC).date() - timedelta(days=30)
    old_start = datetime.combine(old_day, datetime.min.time(), UTC)
    long_ago = datetime(2001, 1, 1, tzinfo=UTC)  # no partition of its own: the default one
    phases: dict[str, tuple[float, float]] = {}
    prune_s: dict[str, float] = {}
    committed_s: dict[int, float] = {}
    try:
        async with ctx.connection() as conn:
            await conn.execute(ACK_TRIGGER)
            name = partition_name(old_day)
            await conn.execute(
                f"CREATE TABLE {name} PARTITION OF job_done FOR VALUES FROM "
                f"('{old_start.isoformat()}') TO ('{(old_start + timedelta(days=1)).isoformat()}')"
            )
            await conn.execute(FILL, old_start, PRUNE_ROWS)
            await conn.execute("VACUUM ANALYZE job_done")
            await registered(conn, proc)
            async with ctx.jobq_database() as database:
                load = asyncio.create_task(_steady_load(ctx, committed_s))
                for phase, fill in (("baseline", None), ("drop", None), ("delete", long_ago)):
                    if fill is not None:
                        await conn.execute(FILL, fill, PRUNE_ROWS)
                    began = time.time()
                    if phase == "baseline":
                        await asyncio.sleep(5)
                    else:
                        await asyncio.sleep(1)
                        started = time.perf_counter()
                        await prune_finished(database, now=clock.now(), retention=timedelta(days=7))
                        prune_s[phase] = time.perf_counter() - started
                        await asyncio.sleep(1)
                    phases[phase] = (began, time.time())
                load.cancel()
                await asyncio.gather(load, return_exceptions=True)
            assert await conn.fetchval("SELECT count(*) FROM job_done WHERE id < 0") == 0
            await asyncio.sleep(1)  # the last jobs' acks
            stamps = {
                r["job_id"]: r["started_s"]
                for r in await conn.fetch("SELECT job_id, started_s FROM bench_event")
            }
            acks = {
                r["job_id"]: r["at_s"]
                for r in await conn.fetch("SELECT job_id, at_s FROM bench_ack WHERE job_id > 0")
            }
            await conn.execute("DROP TRIGGER bench_ack ON job_done")
    finally:
        await proc.stop()
    figures: Figures = {"rows": PRUNE_ROWS}
    for phase, (began, ended) in phases.items():
        ids = [i for i, at in committed_s.items() if began <= at <= ended and i in acks]
        pickup = [stamps[i] - committed_s[i] for i in ids if i in stamps]
        ack = [acks[i] - stamps[i] for i in ids if i in stamps]
        figures[f"{phase}_jobs"] = len(ids)
        figures[f"{phase}_pickup_p99_ms"] = _ms(percentile(pickup, 99))
        figures[f"{phase}_ack_p99_ms"] = _ms(percentile(ack, 99))
        if phase in prune_s:
            figures[f"{phase}_prune_s"] = round(prune_s[phase], 3)
    return [figures]


async def _steady_load(ctx: Context, committed_s: dict[int, float]) -> None:
    """`bench_stamp` jobs at `LOAD_RATE_PER_S`, each in its own transaction, until cancelled;
    notes when each one's COMMIT returned."""
    start = time.perf_counter()
    for seq in itertools.count():
        delay = start + seq / LOAD_RATE_PER_S - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        job = Job(job_type=STAMP, arguments={"seq": seq, "run": f"prune-{ctx.run}"})
        enqueued = await enqueue(job)
        committed_s[enqueued.id] = time.time()
