"""The metrics at size: `metrics_scrape` times `GET /metrics` of a served web process over
1,000,000 queued jobs (half ripe, half scheduled) and 10,000,000 finished ones.

The tables are filled once per benchmark session (`bench.bigdata`: minutes; reported in every
run as `fill_s`) and kept for the next runs. Each run takes the depth snapshot that the elected
worker would take (`snapshot_ms`: the one count over `job`, every few seconds in one process),
flushes counts and timings of 10 job types on 3 queues (the app has 2), then scrapes `SCRAPES`
times in a row, after `WARMUP` scrapes: `p50_ms` and `p99_ms` (target: p99 <= 50). No worker
runs (it would drain the queue); the served process runs none either.
"""

from __future__ import annotations

import time
from datetime import timedelta

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.bigdata import fill_finished, fill_queued, filled_once
from bench.context import Context, Figures
from bench.loadgen import percentile
from jobq import clock
from jobq.db import Connection
from jobq.queue import metrics
from jobq.queue.leader.depth import take_depth_snapshot
from tests.toolkit.procs import free_port, http_ready

QUEUED = 1_000_000
FINISHED = 10_000_000
TYPES = 10
"""Job types with counts and timings (on 3 queues): every one is ~40 series."""
SCRAPES = 200
WARMUP = 10
ADMIN_TOKEN = "bench-metrics-admin-token"  # noqa: S105 (a benchmark value)


async def _fill(conn: Connection) -> None:
    now = clock.now()
    await fill_queued(conn, ripe=QUEUED // 2, scheduled=QUEUED // 2, now=now)
    await fill_finished(conn, count=FINISHED, now=now)


async def metrics_scrape(ctx: Context) -> list[Figures]:
    figures: Figures = {"fill_s": await filled_once(ctx, "metrics_scrape", _fill)}
    async with ctx.connection() as conn:
        await conn.execute("DELETE FROM job_depth")  # no last snapshot: this one is taken
        async with ctx.jobq_database() as database:
            started = time.perf_counter()
            await take_depth_snapshot(
                database,
                now=clock.now(),
                interval=timedelta(0),
                retention=timedelta(days=7),
            )
            figures["snapshot_ms"] = round((time.perf_counter() - started) * 1000, 1)
            tally = metrics.Tally()
            for n in range(TYPES):
                queue, job_type = f"q{n % 3}", f"bench_type_{n}"
                for event in metrics.EVENTS:
                    tally.count(queue, job_type, event, 1000 + n)
                for seconds in (0.002, 0.04, 0.7, 3.0):
                    tally.observe(queue, job_type, "pickup_lag", seconds)
                    tally.observe(queue, job_type, "run_time", seconds)
            await metrics.flush(database, tally)
    port = free_port()
    server = ctx.spawn(
        "serve",
        "metrics-serve",
        JOBQ_HTTP_HOST="127.0.0.1",
        JOBQ_HTTP_PORT=str(port),
        JOBQ_RUN_WORKERS="false",
        JOBQ_ADMIN_TOKEN=ADMIN_TOKEN,
        JOBQ_WEB_PROCESSES="1",
    )
    try:
        await http_ready(port, server)
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            times_ms: list[float] = []
            for i in range(WARMUP + SCRAPES):
                started = time.perf_counter()
                response = await http.get("/metrics", headers=headers)
                took_ms = (time.perf_counter() - started) * 1000
                response.raise_for_status()
                if i >= WARMUP:
                    times_ms.append(took_ms)
        depth = sum(
            s.value
            for family in text_string_to_metric_families(response.text)
            if family.name == "jobq_queue_jobs"
            for s in family.samples
        )
        if depth != QUEUED:
            raise AssertionError(f"the scrape shows {depth:g} queued jobs, not {QUEUED}")
    finally:
        await server.stop()
    return [
        {
            **figures,
            "p50_ms": round(percentile(times_ms, 50), 2),
            "p99_ms": round(percentile(times_ms, 99), 2),
            "bytes": len(response.content),
        }
    ]
