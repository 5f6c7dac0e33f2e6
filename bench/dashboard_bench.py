"""`dashboard_pages`: each dashboard page's server time with 100,000 queued and 1,000,000
finished jobs (`bench.bigdata`, COPY and generate_series), 1,000 dead jobs with two failed
attempts each, and 25 hours of history (a row a minute) for 5 queues: the overview, its
charts' data (an hour, a day), the job search (by state, queue, and arguments), a job, and
the dead letter (whole, and filtered).

The app is built by `jobq.app.create_app` and called in this process through Quart's test
client (no network, no other process: the time is the route's, its queries' and its
template's), with `Authorization: Bearer` as a script would. Each page is asked `WARMUP` times,
then `REQUESTS` times one after the other; its figures are the p50 and p99 in ms. The search
for a job type that none of the finished jobs has is asked `RARE_REQUESTS` times only: it walks
`job_done` until the search's time limit. The tables
are filled at the first run and kept for the next ones (the workload writes nothing).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

from bench.bigdata import fill_finished, fill_queued, filled_once
from bench.context import Context, Figures
from bench.loadgen import percentile
from jobq.app import create_app
from jobq.config import Settings
from jobq.db import Connection
from jobq.queue.metrics import BOUNDS

QUEUED = 100_000
FINISHED = 1_000_000
HISTORY_QUEUES = 5
DEAD = 1_000
REQUESTS = 40
WARMUP = 3
RARE_REQUESTS = 3
TOKEN = "bench-admin-token-0123456789"  # noqa: S105 (a benchmark's own)


async def _fill(conn: Connection) -> None:
    """Fill the tables: 1M queued, 10M finished, `DEAD` dead jobs with two failed attempts."""
    now = datetime.now(UTC)
    await fill_queued(conn, ripe=QUEUED // 2, scheduled=QUEUED // 2, now=now)
    await fill_finished(conn, count=FINISHED, now=now)
    top = await conn.fetchval("SELECT max(id) FROM job_done")
    await conn.execute(
        """
        INSERT INTO job_dead (id, job_type, arguments, priority, attempts, max_retries,
                              last_error, created_at, died_at, queue)
        SELECT $1::bigint + g, 'bench_mail', jsonb_build_object('to', g), 0, 2, 1,
               'RuntimeError: SMTP 550: mailbox unavailable', $2, $2, 'default'
        FROM generate_series(1, $3::bigint) AS g
        """,
        top,
        now - timedelta(hours=1),
        DEAD,
    )
    await conn.execute(
        """
        INSERT INTO job_attempt (job_id, attempt, worker_id, error, traceback, failed_at)
        SELECT $1::bigint + g, a, NULL, 'RuntimeError: SMTP 550: mailbox unavailable',
               'Traceback (most recent call last): ...', $2
        FROM generate_series(1, $3::bigint) AS g, generate_series(1, 2) AS a
        """,
        top,
        now - timedelta(hours=1),
        DEAD,
    )
    await conn.execute(
        """
        INSERT INTO job_history (queue, at, enqueued, succeeded, failed, pickup_buckets,
                                 run_buckets)
        SELECT 'q' || q, date_trunc('minute', $1::timestamptz) - m * interval '1 minute',
               (1500 - m) * 100, (1500 - m) * 98, (1500 - m) * 2,
               array_fill((1500 - m)::bigint, ARRAY[$2::int]),
               array_fill((1500 - m)::bigint, ARRAY[$2::int])
        FROM generate_series(1, $3::int) AS q, generate_series(0, 1499) AS m
        """,
        now,
        len(BOUNDS) + 1,
        HISTORY_QUEUES,
    )
    await conn.execute("ANALYZE job_dead; ANALYZE job_attempt; ANALYZE job_history")


async def dashboard_pages(ctx: Context) -> list[Figures]:
    """Each page's server time (p50, p99 in ms over `REQUESTS` requests) at size."""
    await filled_once(ctx, "dashboard_pages", _fill)
    async with ctx.connection() as conn:  # a finished job and a dead one to look at
        top = await conn.fetchval("SELECT max(id) FROM job_dead")
    ids = {"finished": (top - DEAD) // 2, "dead": top - DEAD // 2}
    pages = {
        "overview": "/dashboard/",
        "jobs": "/dashboard/jobs",
        "jobs_failed": "/dashboard/jobs?state=failed",
        "jobs_queue_succeeded": "/dashboard/jobs?queue=default&state=succeeded",
        "job_finished": f"/dashboard/jobs/{ids['finished']}",
        "job_dead": f"/dashboard/jobs/{ids['dead']}",
        "history_1h": "/dashboard/history?window=1h",
        "history_24h": "/dashboard/history?window=24h",
        # no index serves it: each table is walked by id until a page matches (here a recent
        # finished job; the 100,000 queued jobs are read whole, none matching)
        "jobs_arguments": "/dashboard/jobs?arguments=" + quote(f'{{"big": {FINISHED - 10}}}'),
        "dead": "/dashboard/dead",
        "dead_filtered": "/dashboard/dead?error=SMTP&arguments=" + quote('{"to": 7}'),
        # few of millions match: walks job_done until the search's time limit (503)
        "jobs_rare_type": "/dashboard/jobs?job_type=bench_mail",
    }
    values: dict[str, Any] = {
        "database_url": ctx.dsn,
        "admin_token": TOKEN,
        "run_workers": False,
        "log_level": "WARNING",
    }
    app = create_app(Settings(_env_file=None, **values))
    headers = {"Authorization": f"Bearer {TOKEN}"}
    lines: list[Figures] = []
    async with app.test_app() as test_app:
        client = test_app.test_client()
        for name, path in pages.items():
            times: list[float] = []
            count = RARE_REQUESTS if name == "jobs_rare_type" else WARMUP + REQUESTS
            for i in range(count):
                started = time.perf_counter()
                response = await client.get(path, headers=headers)
                took = time.perf_counter() - started
                expected = 503 if name == "jobs_rare_type" else 200
                if response.status_code not in (200, expected):
                    raise RuntimeError(f"{path}: {response.status_code}")
                if i >= count - min(count, REQUESTS):
                    times.append(took * 1000)
            lines.append(
                {
                    "page": name,
                    "p50_ms": round(percentile(times, 50), 2),
                    "p99_ms": round(percentile(times, 99), 2),
                }
            )
    return lines
