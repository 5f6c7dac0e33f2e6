"""The queue at size, `large_queue` (issue 12, item 5): 10,000,000 jobs scheduled for next year
on `default` and 100,000 ripe ones on `bench_backlog` (a queue no worker serves), filled once
per benchmark session (`bench.bigdata`; `fill_s`) and kept for the next runs.

What is timed, exactly:

- `claim_p50_ms`/`claim_p99_ms`: the claim statement as a worker sends it (`sql.job_claim`, 16
  free slots, on a connection with the workers' generic plan) on `bench_backlog`: 16 of its
  100,000 ripe jobs, `CLAIMS` times, each in a transaction rolled back.
- `idle_claim_p50_ms`/`idle_claim_p99_ms`: the same on `default`, where no job is ripe: the
  claim of an idle worker, which must not walk the 10,000,000 scheduled jobs.
- `enqueue_jobs_per_s`: `ENQUEUES` jobs enqueued on `bench_enqueue` one per transaction
  (`jobq.queue.enqueue`) by one producer, into the big table's indexes.
- `pickup_p50_ms`/`pickup_p99_ms`: one worker process serving `default` (16 slots), idle over
  its 10,000,000 scheduled jobs; `PICKUP_JOBS` `bench_stamp` jobs enqueued on it at
  50 per second, each in its own transaction (`bench.queue_bench.pickups`): handler start minus
  the enqueue's commit.
- `snapshot_ms`: the depth snapshot that one worker takes every few seconds (and then waits 20
  times as long): the one count over `job`, per queue and job type.
- `stats_ms` and `check_ms`: `jobq.queue.metrics.stats` (what `GET /jobs/stats` reads) and
  `jobq.check.check` (`python -m jobq check`), once each, after that snapshot: past
  `metrics.LIVE_COUNT_MAX` queued jobs both read its counts rather than count `job`.
"""

from __future__ import annotations

import time
from datetime import timedelta

from bench.bigdata import fill_queued, filled_once
from bench.context import Context, Figures
from bench.loadgen import percentile
from bench.queue_bench import pickups
from jobq import check, clock, db
from jobq.queue import Job, enqueue, metrics, sql
from jobq.queue.leader.depth import take_depth_snapshot

SCHEDULED = 10_000_000
BACKLOG = 100_000
CLAIMS = 200
ENQUEUES = 2_000
PICKUP_JOBS = 300


async def _fill(conn: db.Connection) -> None:
    now = clock.now()
    await fill_queued(conn, ripe=0, scheduled=SCHEDULED, now=now)
    await conn.execute(
        """
        INSERT INTO job (job_type, arguments, ripe_at, max_retries, created_at, queue)
        SELECT 'bench_noop', jsonb_build_object('backlog', g), $1, 3, $1, 'bench_backlog'
        FROM generate_series(1, $2::int) AS g
        """,
        now - timedelta(minutes=1),
        BACKLOG,
    )


async def large_queue(ctx: Context) -> list[Figures]:
    figures: Figures = {"fill_s": await filled_once(ctx, "large_queue", _fill)}
    async with ctx.connection() as conn:
        await conn.execute("DELETE FROM job WHERE queue = 'bench_enqueue'")
        await conn.execute("TRUNCATE bench_event, job_running, job_depth, job_type_depth")
    async with ctx.jobq_database() as database:  # as the elected worker does every few seconds
        started = time.perf_counter()
        await take_depth_snapshot(
            database, now=clock.now(), interval=timedelta(0), retention=timedelta(days=7)
        )
        figures["snapshot_ms"] = _ms(time.perf_counter() - started)
    async with ctx.connection() as conn:
        await conn.execute("SET plan_cache_mode = force_generic_plan")  # as the workers claim
        figures.update(_summary("claim", await _claims(conn, "bench_backlog")))
        figures.update(_summary("idle_claim", await _claims(conn, "default")))
        started = time.perf_counter()
        await metrics.stats(conn, now=clock.now())
        figures["stats_ms"] = _ms(time.perf_counter() - started)
        started = time.perf_counter()
        await check.check(conn, now=clock.now(), heartbeat_grace=timedelta(seconds=15))
        figures["check_ms"] = _ms(time.perf_counter() - started)
    async with ctx.jobq_database():
        started = time.perf_counter()
        for n in range(ENQUEUES):
            await enqueue(Job(job_type="bench_noop", arguments={"n": n}, queue="bench_enqueue"))
        figures["enqueue_jobs_per_s"] = round(ENQUEUES / (time.perf_counter() - started), 1)
    figures.update(await _pickup(ctx))
    return [figures]


async def _claims(conn: db.Connection, queue: str) -> list[float]:
    """Seconds of each of `CLAIMS` claims of 16 jobs of `queue`, each rolled back."""
    took = []
    for _ in range(CLAIMS):
        now = clock.now()
        tx = conn.transaction()
        await tx.start()
        try:
            started = time.perf_counter()
            await sql.job_claim.fetch(
                conn,
                completed=[],
                results=[],
                retain=True,
                now=now,
                queues=[queue],
                slots=[16],
                worker_id=1,
                lease_expires_at=now + timedelta(seconds=30),
            )
            took.append(time.perf_counter() - started)
        finally:
            await tx.rollback()
    return took


async def _pickup(ctx: Context) -> Figures:
    proc = ctx.spawn("worker", "large-pickup", JOBQ_QUEUES="default:16")
    return _summary("pickup", await pickups(ctx, proc, PICKUP_JOBS, within_s=60))


def _summary(name: str, seconds: list[float]) -> Figures:
    return {
        f"{name}_p50_ms": _ms(percentile(seconds, 50)),
        f"{name}_p99_ms": _ms(percentile(seconds, 99)),
    }


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)
