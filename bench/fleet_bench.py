"""The fleet's workload, `fleet`: the database's cost per job with 1 and with 50 worker
processes, idle and busy, and the pickup latency with 50 idle workers (DESIGN.md, guarantee 15).

It runs on a PostgreSQL server of its own (`tests.toolkit.postgres.PostgresInstance`:
`max_connections` 300, fsync on), so that the CPU time counted is that server's alone. Each
fleet size starts its workers (`python -m jobq worker`, `bench.handlers`, default settings but a
pool of at most 2 connections and a 1 s drain timeout), waits until every one has registered and
the fleet has settled (`SETTLE_S`), then measures:

- `idle`: `IDLE_JOBS` (500) `bench_noop` jobs, each enqueued in its own transaction by
  `enqueue`, one every 20 ms (50 jobs/s) on a fixed schedule, until they have all run.
- `busy`: `BUSY_JOBS` (10,000) `bench_noop` jobs enqueued by one `enqueue_many`, drained at
  full speed.
- pickup latency (on the `idle` line): `PICKUP_JOBS` (500) `bench_stamp` jobs at 50 jobs/s, as
  `pickup_latency` does (the handler's first wall-clock reading minus the producer's reading
  right after its COMMIT returned), with 1 and with 50 idle workers; and, where the kernel runs
  DAMON, the share of a core its threads took during each pickup run (`kdamond_cpu_s`).

Cost is counted over a window from 1.5 s before the load to 1.5 s after its last outcome was
committed (`busy`: 12 s on each side), so the idle fleet's own upkeep in that window (heartbeats,
polls, rescues) is counted too. A backend's counts can reach `pg_stat_database` up to 10 s late
(`SETTLE_S`): one that published less than a second before holds them until its next
transaction or, idle, for 10 s (`PGSTAT_IDLE_INTERVAL`). The `idle` load is paced over 10 s:
at its window's end, at most about the last second's counts of each backend are still to come.
The `busy` load is a burst of about a second that ends with the fleet idle, so its window
stays open `SETTLE_S` after its last outcome; and it opens `SETTLE_S` after the pickup, whose
late counts would otherwise enter it (as many as the load's own).

`commits` is the delta of `pg_stat_database.xact_commit` (every statement the server ran alone
is a transaction, a SELECT too) less the benchmark's own polls for the end of the load (about
100 a second: they would charge the slower fleet for the benchmark's watching); `db_cpu` the
CPU time (user + system) of the server's processes: the postmaster, its children alive
(psutil) and those that exited (reaped: the postmaster's children times).
`*_per_job_ratio`: the 50 workers' figure over the one worker's, in the same run.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import psutil  # type: ignore[import-untyped]

from bench import children
from bench.context import Context, Figures
from bench.handlers import NOOP, STAMP, TABLES_SQL
from bench.harness import cpu_s, server_cpu_s, wait_drained
from bench.loadgen import percentile
from jobq import db
from jobq.config import Settings
from jobq.db import Connection, Database
from jobq.queue import Job, enqueue, enqueue_many
from jobq.queue.sql import WORKER_LOCK_CLASS
from tests.toolkit.database import fresh_database
from tests.toolkit.postgres import PostgresInstance
from tests.toolkit.procs import Proc, eventually, spawn

FLEET = 50
RATE_PER_S = 50.0
IDLE_JOBS = 500
PICKUP_JOBS = 500
BUSY_JOBS = 10_000
SETTLE_S = 12.0
"""Seconds from the last worker's registration to the first measurement: the workers' start-up
is over, and the server has published its counts of it. PostgreSQL (15 and later) holds an idle
backend's counts back for up to 10 s when it published less than a second before
(`PGSTAT_IDLE_INTERVAL`); a shorter wait lets bursts of the start-up's late counts into the
first window."""
STATS_S = 1.5
SLOTS = 16
WORKER_ENV = {
    "JOBQ_LOG_LEVEL": "WARNING",
    "JOBQ_JOB_MODULES": "bench.handlers",
    "JOBQ_MAX_POOL_SIZE": "2",
    "JOBQ_MAX_CONCURRENT_JOBS": str(SLOTS),
    "JOBQ_DRAIN_TIMEOUT_S": "1",
}


def kdamond_cpu_s() -> float | None:
    """CPU seconds of the kernel's DAMON threads (`kdamond.*`), or None where none runs. On a
    kernel without preemption of kernel code (PREEMPT_NONE, as on the Firecracker VM these
    figures come from) each of its bursts holds a core for up to tens of milliseconds, and a
    process woken there waits until the burst yields: its share of a core during the pickup
    runs is printed next to their p99 (README, "The fleet")."""
    threads = [p for p in psutil.process_iter(["name"]) if p.info["name"].startswith("kdamond")]
    return cpu_s(threads) if threads else None


class Meter:
    """Reads the server's commits in the benchmark database and its CPU time."""

    def __init__(self, conn: Connection, postmaster: psutil.Process) -> None:
        self.conn = conn
        self.postmaster = postmaster
        self.polls: Counter[str] = Counter()
        """The benchmark's own statements in the window (`wait_drained`'s polls): not counted."""

    async def read(self) -> tuple[int, float]:
        commits: int = await self.conn.fetchval(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        )
        return commits, server_cpu_s(self.postmaster)

    @contextlib.asynccontextmanager
    async def window(
        self, jobs: int, into: dict[str, float], *, margin_s: float = STATS_S
    ) -> AsyncIterator[None]:
        """Count the commits and CPU per job of what runs inside (`jobs` jobs) into `into`, from
        `margin_s` seconds before it to `margin_s` seconds after it."""
        await asyncio.sleep(margin_s)
        commits, cpu = await self.read()
        self.polls.clear()
        yield
        await asyncio.sleep(margin_s)
        commits_after, cpu_after = await self.read()
        commits_after -= self.polls["statements"]
        into["commits_per_job"] = (commits_after - commits) / jobs
        into["db_cpu_ms_per_job"] = (cpu_after - cpu) * 1000 / jobs


async def fleet(ctx: Context) -> list[Figures]:
    """One run: 1 worker then 50, each idle, pickup and busy."""
    instance = await asyncio.to_thread(PostgresInstance.create)
    try:
        await asyncio.to_thread(instance.start)
        async with fresh_database(instance.admin_dsn, "jobq_fleet") as dsn:
            conn = await db.connect(dsn)
            try:
                await conn.execute(TABLES_SQL)
                backend = psutil.Process(await conn.fetchval("SELECT pg_backend_pid()"))
                meter = Meter(conn, backend.parent())
                settings = Settings(
                    _env_file=None, database_url=dsn, min_pool_size=2, max_pool_size=2
                )
                database = await Database.open(settings, dsn)
                db.bind(database)
                try:
                    figures = {n: await _measure(ctx, dsn, conn, meter, n) for n in (1, FLEET)}
                finally:
                    await database.close()
            finally:
                await conn.close()
    finally:
        await asyncio.to_thread(instance.destroy)
    one, many = figures[1], figures[FLEET]
    lines = []
    for load in ("idle", "busy"):
        line: Figures = {"load": load}
        for figure in ("commits_per_job", "db_cpu_ms_per_job"):
            line[f"{figure}_1"] = round(one[load][figure], 3)
            line[f"{figure}_{FLEET}"] = round(many[load][figure], 3)
        line["commits_per_job_ratio"] = round(
            many[load]["commits_per_job"] / one[load]["commits_per_job"], 3
        )
        line["db_cpu_per_job_ratio"] = round(
            many[load]["db_cpu_ms_per_job"] / one[load]["db_cpu_ms_per_job"], 3
        )
        lines.append(line)
    lines[0].update(
        {
            "pickup_p50_ms_1": one["pickup"]["p50_ms"],
            "pickup_p99_ms_1": one["pickup"]["p99_ms"],
            f"pickup_p50_ms_{FLEET}": many["pickup"]["p50_ms"],
            f"pickup_p99_ms_{FLEET}": many["pickup"]["p99_ms"],
        }
    )
    if "kdamond_cpu_pct" in one["pickup"] and "kdamond_cpu_pct" in many["pickup"]:
        lines[0]["pickup_kdamond_cpu_pct_1"] = one["pickup"]["kdamond_cpu_pct"]
        lines[0][f"pickup_kdamond_cpu_pct_{FLEET}"] = many["pickup"]["kdamond_cpu_pct"]
    lines[1]["jobs_per_s_1"] = round(one["busy"]["jobs_per_s"], 1)
    lines[1][f"jobs_per_s_{FLEET}"] = round(many["busy"]["jobs_per_s"], 1)
    return lines


async def _measure(
    ctx: Context, dsn: str, conn: Connection, meter: Meter, size: int
) -> dict[str, Any]:
    """Start `size` workers and measure them (see the module's docstring)."""
    await _reset(conn)
    procs: list[Proc] = []
    out: dict[str, Any] = {"idle": {}, "busy": {}}
    try:
        for k in range(size):
            name = ctx.name(f"fleet{size}-w{k}")
            procs.append(
                spawn("worker", name, database_url=dsn, log_dir=ctx.log_dir, env=WORKER_ENV)
            )
            children.track(procs[-1].popen)

        async def all_registered() -> bool:
            count = await conn.fetchval(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = $1"
                " AND granted",
                WORKER_LOCK_CLASS,
            )
            return bool(count == size)

        # 50 interpreters starting on 2 busy cores can take a minute or two
        await eventually(all_registered, within=300, what="the workers", running=tuple(procs))
        await asyncio.sleep(SETTLE_S)
        async with meter.window(IDLE_JOBS, out["idle"]):
            await _paced(NOOP, IDLE_JOBS, ctx.run)
            await wait_drained(conn, within_s=60, polls=meter.polls)
        out["pickup"] = await _pickup(conn, ctx.run)
        await wait_drained(conn, within_s=60)  # the last outcomes are recorded
        await _reset(conn, workers=False)
        jobs = [Job(job_type=NOOP, arguments={"i": i}) for i in range(BUSY_JOBS)]
        async with meter.window(BUSY_JOBS, out["busy"], margin_s=SETTLE_S):
            started = time.perf_counter()
            await enqueue_many(jobs)
            drained = await wait_drained(conn, within_s=300, polls=meter.polls)
        out["busy"]["jobs_per_s"] = BUSY_JOBS / (drained - started)
    finally:
        await asyncio.gather(*(p.stop() for p in procs))
    return out


async def _reset(conn: Connection, *, workers: bool = True) -> None:
    tables = "job, job_running, job_dead, job_done, job_attempt, job_unique, job_rate, bench_event"
    await conn.execute(f"TRUNCATE {tables}{', worker' if workers else ''}")


async def _paced(job_type: str, count: int, run: int) -> dict[int, float]:
    """Enqueue `count` jobs of `job_type`, each in its own transaction, at `RATE_PER_S`; return
    each job's wall-clock time right after its commit, by id."""
    committed_s: dict[int, float] = {}
    start = time.perf_counter()
    for seq in range(count):
        delay = start + seq / RATE_PER_S - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        args: dict[str, Any] = {"seq": seq, "run": str(run)} if job_type == STAMP else {"i": seq}
        enqueued = await enqueue(Job(job_type=job_type, arguments=args))
        committed_s[enqueued.id] = time.time()
    return committed_s


async def _pickup(conn: Connection, run: int) -> dict[str, float]:
    """p50 and p99 pickup latency (ms) of `PICKUP_JOBS` `bench_stamp` jobs at 50 jobs/s, and
    the share of a core (%) that the kernel's DAMON threads took meanwhile (`kdamond_cpu_s`)."""
    kdamond, started = kdamond_cpu_s(), time.perf_counter()
    committed_s = await _paced(STAMP, PICKUP_JOBS, run)
    kdamond_after, took = kdamond_cpu_s(), time.perf_counter() - started

    async def all_ran() -> bool:
        return bool(await conn.fetchval("SELECT count(*) FROM bench_event") >= PICKUP_JOBS)

    await eventually(all_ran, within=30, what="the stamps")
    rows = await conn.fetch("SELECT job_id, started_s FROM bench_event")
    latencies = [r["started_s"] - committed_s[r["job_id"]] for r in rows]
    figures = {
        "p50_ms": round(percentile(latencies, 50) * 1000, 3),
        "p99_ms": round(percentile(latencies, 99) * 1000, 3),
    }
    if kdamond is not None and kdamond_after is not None:
        figures["kdamond_cpu_pct"] = round((kdamond_after - kdamond) * 100 / took, 2)
    return figures
