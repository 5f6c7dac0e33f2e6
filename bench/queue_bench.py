"""The queue's workloads: `throughput`, `throughput_raw`, `pickup_latency`, `scheduled_lateness`,
`enqueue_concurrent` and `memory`. Each function is one run and returns its lines' figures.

Every run starts from empty tables (TRUNCATE: no dead rows left by the previous one). Worker
processes are `python -m jobq worker` with `JOBQ_JOB_MODULES=bench.handlers`, default settings
but for those named, `JOBQ_LOG_LEVEL=WARNING`; the producer is this process, through jobq's
public API (`enqueue`, `enqueue_many` on a `jobq.db.Database`).

What is timed, exactly:

- `throughput`: at each concurrency (the worker's slots: 1, 16, 64) a worker process is started
  and registered (idle, LISTENing) before the jobs are enqueued: `THROUGHPUT_JOBS` no-op jobs
  (5,000 at concurrency 1, 20,000 at 16 and 64). `enqueue_jobs_per_s`: the jobs / the
  `enqueue_many` call (one statement and its COMMIT; building the `Job` objects is not timed).
  `jobs_per_s`: the jobs / (from the moment that COMMIT returned to the moment `job` and
  `job_running` are both seen empty, i.e. the last outcome is committed). The first claim
  follows the commit by about a millisecond (the NOTIFY; see pickup_latency); the end is polled
  through indexes, every 10 ms while jobs are queued and every 1 ms once only running ones
  remain. `cpu_ms_worker` and `cpu_ms_db`: the CPU time (user + system, in milliseconds) per
  job of the worker process and of the whole database server (every backend, the polls'
  included; absent when the server is not a process of this machine) over the same span.
- `throughput_raw`: at concurrency 16 and 128, the worker's drain of 20,000 jobs as in
  `throughput`, then `raw_jobs_per_s`: the same 20,000 jobs enqueued the same way, drained by
  `raw_connections` plain asyncpg connections in this process (as many as the worker's slots,
  fewer when the server's `max_connections` leaves no room), each repeating `RAW_CLAIM` (one
  autocommit transaction per job) until it finds nothing; timed from the start of the loops to
  the end of the last one, the connections being open beforehand. `ratio_to_raw`: jobs_per_s /
  raw_jobs_per_s of the same run.
- `pickup_latency`: an idle worker (16 slots); 500 `bench_stamp` jobs, each enqueued in its own
  transaction by `enqueue`, one every 20 ms on a fixed schedule. Latency: the handler's first
  reading of the wall clock minus the producer's reading right after its COMMIT returned.
- `scheduled_lateness`: an idle worker; 500 `bench_stamp` jobs enqueued in one `enqueue_many`,
  `ripe_at` spread evenly over 10 s starting 1 s later. Lateness: the handler's start minus
  `ripe_at` (both wall clock).
- `enqueue_concurrent`: 8 producers (tasks of this process, each on its own pooled
  connection), each calling `enqueue` (one job, one transaction, ripe now) in a loop for 5 s;
  no worker runs. `jobs_per_s`: jobs committed / the time until the last producer stopped.
- `memory`: 10,000 then 100,000 `bench_noop` jobs queued first (`enqueue_many`, batches of
  10,000), then a worker process (16 slots) started to drain them. `peak_rss_mb[_10k]`: the
  worker's peak resident set (VmHWM) when the queue is empty; `rss_growth`: the 100k peak over
  the 10k peak (1.0 is flat); `jobs_per_s`: the 100k drain, from the worker's start.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from datetime import UTC, datetime

import asyncpg
import psutil  # type: ignore[import-untyped]

from bench import harness
from bench.context import Context, Figures
from bench.handlers import NOOP, STAMP
from bench.harness import cpu_s, postmaster, server_cpu_s, wait_drained
from bench.loadgen import percentile
from jobq import clock
from jobq.db import Connection
from jobq.queue import Job, enqueue, enqueue_many
from tests.toolkit.procs import Proc, check_running, registered

THROUGHPUT_JOBS = {1: 5_000, 16: 20_000, 64: 20_000}
"""The jobs drained at each concurrency of `throughput` (a drain of several seconds at each)."""
RAW_JOBS = 20_000
RAW_CONCURRENCIES = (16, 128)
PICKUP_JOBS = 500
PICKUP_RATE_PER_S = 50.0
SCHEDULED_JOBS = 500
SCHEDULED_SPREAD_S = 10.0
SCHEDULED_LEAD_S = 1.0
PRODUCERS = 8
PRODUCE_S = 5.0
MEMORY_SIZES = (10_000, 100_000)
BATCH = 10_000

RAW_CLAIM = """
DELETE FROM job WHERE id = (
    SELECT id FROM job WHERE ripe_at <= $1 ORDER BY priority DESC, ripe_at
    LIMIT 1 FOR UPDATE SKIP LOCKED
) RETURNING *
"""
"""The seeds' claim, the reference: one job per transaction, gone once claimed (no guarantee
of any kind: a crash loses the job)."""


async def _enqueue_batches(ctx: Context, jobs: list[Job]) -> float:
    """Enqueue `jobs` with `enqueue_many`, `BATCH` at a time; return the seconds taken (the
    calls and their COMMITs, not the building of the jobs)."""
    async with ctx.jobq_database():
        started = time.perf_counter()
        for i in range(0, len(jobs), BATCH):
            ids = await enqueue_many(jobs[i : i + BATCH])
            assert len(ids) == len(jobs[i : i + BATCH]), "unexpected duplicates"
        return time.perf_counter() - started


def _noop_jobs(count: int) -> list[Job]:
    return [Job(job_type=NOOP, arguments={"i": i}) for i in range(count)]


# -- throughput --------------------------------------------------------------------------------


async def throughput(ctx: Context) -> list[Figures]:
    """One drain at each concurrency of `THROUGHPUT_JOBS`."""
    return [
        {"concurrency": concurrency, "jobs": jobs, **await _worker_drain(ctx, concurrency, jobs)}
        for concurrency, jobs in THROUGHPUT_JOBS.items()
    ]


async def throughput_raw(ctx: Context) -> list[Figures]:
    """At each of `RAW_CONCURRENCIES`: the worker's drain, then the raw one."""
    lines = []
    for concurrency in RAW_CONCURRENCIES:
        worker = await _worker_drain(ctx, concurrency, RAW_JOBS)
        raw_s, raw_connections = await _raw_drain(ctx, concurrency)
        raw_jobs_per_s = RAW_JOBS / raw_s
        lines.append(
            {
                "concurrency": concurrency,
                **worker,
                "raw_jobs_per_s": round(raw_jobs_per_s, 1),
                "ratio_to_raw": round(worker["jobs_per_s"] / raw_jobs_per_s, 3),
                "raw_connections": raw_connections,
            }
        )
    return lines


async def _worker_drain(ctx: Context, concurrency: int, count: int, **env: str) -> Figures:
    """The worker's drain of `count` no-op jobs at `concurrency` (settings: `env`)."""
    await ctx.database.reset()
    jobs = _noop_jobs(count)
    what = f"throughput-c{concurrency}" + "".join(f"-{k}={v}" for k, v in env.items())
    proc = ctx.spawn("worker", what, JOBQ_MAX_CONCURRENT_JOBS=str(concurrency), **env)
    worker = psutil.Process(proc.pid)
    try:
        async with ctx.connection() as conn:
            await registered(conn, proc)
            server = await postmaster(conn)

            def cpu() -> tuple[float, float]:
                """CPU seconds so far: the worker's, the server's (0 when not readable)."""
                return cpu_s([worker]), server_cpu_s(server) if server is not None else 0.0

            async with ctx.jobq_database():
                started = time.perf_counter()
                ids = await enqueue_many(jobs)
                committed = time.perf_counter()
            before = cpu()
            assert len(ids) == count
            drained = await wait_drained(conn, within_s=300, proc=proc)
            after = cpu()
    finally:
        await proc.stop()
    figures: Figures = {
        "enqueue_jobs_per_s": round(count / (committed - started), 1),
        "jobs_per_s": round(count / (drained - committed), 1),
        "cpu_ms_worker": round((after[0] - before[0]) * 1000 / count, 4),
    }
    if server is not None:
        figures["cpu_ms_db"] = round((after[1] - before[1]) * 1000 / count, 4)
    return figures


async def _room(conn: Connection) -> int:
    """How many more connections the server accepts now, keeping 10 in reserve."""
    room: int = await conn.fetchval(
        "SELECT current_setting('max_connections')::int"
        " - current_setting('superuser_reserved_connections')::int"
        " - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')"
    )
    return room - 10


async def _raw_drain(ctx: Context, concurrency: int) -> tuple[float, int]:
    """Drain `RAW_JOBS` with `RAW_CLAIM` loops; return (seconds, connections used)."""
    await ctx.database.reset()
    await _enqueue_batches(ctx, _noop_jobs(RAW_JOBS))
    async with ctx.connection() as conn:
        count = max(1, min(concurrency, await _room(conn)))
    conns: list[asyncpg.Connection[asyncpg.Record]] = list(
        await asyncio.gather(*(asyncpg.connect(ctx.dsn) for _ in range(count)))
    )
    now = clock.now()

    async def drain(conn: asyncpg.Connection[asyncpg.Record]) -> int:
        done = 0
        while await conn.fetchrow(RAW_CLAIM, now) is not None:
            done += 1
        return done

    try:
        started = time.perf_counter()
        done = await asyncio.gather(*(drain(conn) for conn in conns))
        elapsed = time.perf_counter() - started
    finally:
        await asyncio.gather(*(conn.close() for conn in conns))
    assert sum(done) == RAW_JOBS, f"the raw drain took {sum(done)} jobs"
    return elapsed, count


# -- latency -----------------------------------------------------------------------------------


Stamp = tuple[int, float, float | None]
"""(job id, handler start, due time) of one `bench_stamp` run, in epoch seconds."""


async def _stamps(conn: Connection, count: int, *, within_s: float, proc: Proc) -> list[Stamp]:
    """Wait for `count` rows in `bench_event`; return (job_id, started_s, due_s) of each."""
    deadline = time.monotonic() + within_s
    while (await conn.fetchval("SELECT count(*) FROM bench_event")) < count:
        check_running((proc,))
        if time.monotonic() > deadline:
            raise RuntimeError(f"fewer than {count} jobs ran within {within_s:g} s")
        await asyncio.sleep(0.05)
    rows = await conn.fetch("SELECT job_id, started_s, due_s FROM bench_event")
    return [(r["job_id"], r["started_s"], r["due_s"]) for r in rows]


async def pickup_latency(ctx: Context) -> list[Figures]:
    await ctx.database.reset()
    latencies = await pickups(ctx, ctx.spawn("worker", "pickup"), PICKUP_JOBS, within_s=30)
    return [
        {
            "p50_ms": _ms(percentile(latencies, 50)),
            "p95_ms": _ms(percentile(latencies, 95)),
            "p99_ms": _ms(percentile(latencies, 99)),
            "max_ms": _ms(max(latencies)),
        }
    ]


async def pickups(ctx: Context, proc: Proc, count: int, *, within_s: float) -> list[float]:
    """Once the worker `proc` has registered, enqueue `count` `bench_stamp` jobs, each in its own
    transaction, at `PICKUP_RATE_PER_S`; wait (at most `within_s` seconds) until they have all
    run, stop `proc`, and return each job's pickup latency in seconds: the handler's first
    wall-clock reading minus the producer's right after the enqueue's COMMIT returned."""
    committed_s: dict[int, float] = {}
    try:
        async with ctx.connection() as conn:
            await registered(conn, proc)
            async with ctx.jobq_database():
                start = time.perf_counter()
                for seq in range(count):
                    delay = start + seq / PICKUP_RATE_PER_S - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    job = Job(job_type=STAMP, arguments={"seq": seq, "run": str(ctx.run)})
                    enqueued = await enqueue(job)  # its own transaction, committed on return
                    committed_s[enqueued.id] = time.time()
            stamps = await _stamps(conn, count, within_s=within_s, proc=proc)
    finally:
        await proc.stop()
    return [started - committed_s[job_id] for job_id, started, _ in stamps]


async def scheduled_lateness(ctx: Context) -> list[Figures]:
    await ctx.database.reset()
    proc = ctx.spawn("worker", "scheduled")
    try:
        async with ctx.connection() as conn:
            await registered(conn, proc)
            first = time.time() + SCHEDULED_LEAD_S
            jobs = []
            for seq in range(SCHEDULED_JOBS):
                due_s = first + seq * SCHEDULED_SPREAD_S / SCHEDULED_JOBS
                args = {"seq": seq, "due_s": due_s, "run": str(ctx.run)}
                ripe_at = datetime.fromtimestamp(due_s, UTC)
                jobs.append(Job(job_type=STAMP, arguments=args, ripe_at=ripe_at))
            await _enqueue_batches(ctx, jobs)
            within = SCHEDULED_LEAD_S + SCHEDULED_SPREAD_S + 20
            stamps = await _stamps(conn, SCHEDULED_JOBS, within_s=within, proc=proc)
    finally:
        await proc.stop()
    lateness = [started - due for _, started, due in stamps if due is not None]
    return [
        {
            "p50_ms": _ms(percentile(lateness, 50)),
            "p99_ms": _ms(percentile(lateness, 99)),
            "max_ms": _ms(max(lateness)),
            "min_ms": _ms(min(lateness)),
        }
    ]


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


# -- enqueue -----------------------------------------------------------------------------------


async def enqueue_concurrent(ctx: Context) -> list[Figures]:
    await ctx.database.reset()
    numbers = itertools.count()
    async with ctx.jobq_database(pool_size=PRODUCERS):
        deadline = time.perf_counter() + PRODUCE_S

        async def producer(k: int) -> int:
            done = 0
            while time.perf_counter() < deadline:
                await enqueue(Job(job_type=NOOP, arguments={"i": next(numbers), "p": k}))
                done += 1
            return done

        started = time.perf_counter()
        done = await asyncio.gather(*(producer(k) for k in range(PRODUCERS)))
        elapsed = time.perf_counter() - started
    async with ctx.connection() as conn:
        queued = await conn.fetchval("SELECT count(*) FROM job")
    assert queued == sum(done), f"{sum(done)} enqueued, {queued} queued"
    return [{"producers": PRODUCERS, "jobs_per_s": round(sum(done) / elapsed, 1)}]


# -- memory ------------------------------------------------------------------------------------


async def memory(ctx: Context) -> list[Figures]:
    peaks: dict[int, float] = {}
    rates: dict[int, float] = {}
    for size in MEMORY_SIZES:
        peaks[size], rates[size] = await _drain_peak(ctx, size)
    small, large = MEMORY_SIZES
    return [
        {
            "peak_rss_mb": round(peaks[large], 1),
            "peak_rss_mb_10k": round(peaks[small], 1),
            "rss_growth": round(peaks[large] / peaks[small], 3),
            "jobs_per_s": round(rates[large], 1),
        }
    ]


async def _drain_peak(ctx: Context, size: int) -> tuple[float, float]:
    """Queue `size` no-op jobs, start a worker, wait for the drain; return (the worker's peak
    RSS in MiB, jobs per second from its start)."""
    await ctx.database.reset()
    await _enqueue_batches(ctx, _noop_jobs(size))
    started = time.perf_counter()
    proc = ctx.spawn("worker", f"memory-{size}")
    sampled = 0.0
    try:
        async with ctx.connection() as conn:
            waiting = asyncio.create_task(wait_drained(conn, within_s=600, proc=proc))
            while not waiting.done():
                if proc.popen.poll() is None:
                    sampled = max(sampled, harness.rss_mb(proc.pid)[1])
                await asyncio.wait({waiting}, timeout=0.1)
            drained = waiting.result()
            peak = max(sampled, harness.rss_mb(proc.pid)[1])
    finally:
        await proc.stop()
    return peak, size / (drained - started)
