"""The history of the dashboard's charts: the leader's rows (`jobq.queue.leader.history`), one per
queue and minute however many write, pruned after a day; and what the charts read from them
(`jobq.queue.history.series`): jobs/s and percentiles between rows, a counter reset read as
one. The percentile's interpolation needs no database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobq.config import Settings
from jobq.db import Connection, Database
from jobq.queue import Registry, leader
from jobq.queue.history import quantile, series
from jobq.queue.leader.history import KEEP, take_history
from jobq.queue.metrics import BOUNDS

T0 = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)
N = len(BOUNDS) + 1


def test_quantile_interpolates_within_its_bucket() -> None:
    buckets = [0] * N
    buckets[2] = 10  # (2.5 ms, 5 ms]
    assert quantile(0.5, buckets) == pytest.approx(0.00375)
    buckets[N - 1] = 10  # above every bound: the last bound
    assert quantile(0.99, buckets) == BOUNDS[-1]
    assert quantile(0.5, [0] * N) is None
    first = [4] + [0] * (N - 1)
    assert quantile(0.5, first) == pytest.approx(BOUNDS[0] / 2)  # from 0 in the first bucket


async def add(conn: Connection, queue: str, *, enqueued: int, run_bucket: int, n: int) -> None:
    """Count `enqueued` enqueues and `n` run times in bucket `run_bucket` for `queue`."""
    await conn.execute(
        "INSERT INTO job_counter (queue, job_type, event, count) VALUES ($1, 't', 'enqueued', $2)"
        " ON CONFLICT (queue, job_type, event) DO UPDATE"
        " SET count = job_counter.count + EXCLUDED.count",
        queue,
        enqueued,
    )
    buckets = [0] * N
    buckets[run_bucket] = n
    await conn.execute(
        "INSERT INTO job_histogram (queue, job_type, metric, bounds, buckets, sum)"
        " VALUES ($1, 't', 'run_time', $2, $3, 0) ON CONFLICT (queue, job_type, metric) DO UPDATE"
        " SET buckets = ARRAY(SELECT a + b FROM unnest(job_histogram.buckets, EXCLUDED.buckets)"
        " WITH ORDINALITY AS u(a, b, i) ORDER BY i)",
        queue,
        list(BOUNDS),
        buckets,
    )


async def test_the_leader_writes_a_row_a_minute_and_the_charts_read_rates_and_percentiles(
    database: Database, conn: Connection
) -> None:
    await add(conn, "mail", enqueued=100, run_bucket=7, n=10)
    assert await take_history(database, now=T0) == 1
    assert await take_history(database, now=T0 + timedelta(seconds=30)) == 0  # same minute
    await add(conn, "mail", enqueued=600, run_bucket=8, n=10)  # 600 in the next minute
    assert await take_history(database, now=T0 + timedelta(minutes=1, seconds=5)) == 1
    await conn.execute("DELETE FROM job_counter")  # a reset (the counts start afresh)
    await add(conn, "mail", enqueued=60, run_bucket=8, n=1)
    assert await take_history(database, now=T0 + timedelta(minutes=2)) == 1

    charts = await series(conn, now=T0 + timedelta(minutes=2, seconds=10), window="1h")
    [mail] = charts["queues"]
    assert charts["step_s"] == 60
    assert mail["name"] == "mail"
    assert mail["t"] == [(T0 + timedelta(minutes=m)).timestamp() for m in (1, 2)]
    assert mail["enqueued"] == [10.0, 1.0]  # 600 in 60 s; after the reset, 60 in 60 s
    assert mail["failed"] == [0.0, 0.0]
    # the minute's run times were all in (0.25 s, 0.5 s]: its median halfway
    assert mail["run_p50"][0] == pytest.approx(0.375)
    assert mail["pickup_p50"] == [None, None]  # nothing observed


async def test_the_history_is_pruned_after_a_day(database: Database, conn: Connection) -> None:
    await add(conn, "mail", enqueued=1, run_bucket=0, n=1)
    await take_history(database, now=T0)
    await take_history(database, now=T0 + KEEP - timedelta(minutes=1))
    assert await conn.fetchval("SELECT count(*) FROM job_history") == 2
    await take_history(database, now=T0 + KEEP + timedelta(minutes=1))
    assert await conn.fetchval("SELECT count(*) FROM job_history") == 2  # the first is gone
    assert await conn.fetchval("SELECT min(at) FROM job_history") > T0


async def test_the_day_chart_takes_a_row_per_quarter_hour(
    database: Database, conn: Connection
) -> None:
    for minute in range(0, 61):
        await add(conn, "mail", enqueued=9, run_bucket=0, n=0)
        await take_history(database, now=T0 + timedelta(minutes=minute))
    charts = await series(conn, now=T0 + timedelta(minutes=61), window="24h")
    [mail] = charts["queues"]
    assert charts["step_s"] == 900
    assert len(mail["t"]) == 4  # 9:15, 9:30, 9:45, 10:00, each after the row before
    assert mail["enqueued"] == [pytest.approx(9 / 60)] * 4


def test_the_leader_runs_the_history_writer(database: Database, settings: Settings) -> None:
    names = [service.name for service in leader.services(database, settings, Registry())]
    assert "history" in names
