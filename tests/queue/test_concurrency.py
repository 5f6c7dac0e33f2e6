"""Several workers over one queue: every job runs exactly once, and slots are never exceeded."""

from __future__ import annotations

import asyncio
from collections import Counter

from pydantic import BaseModel

from jobq.db import Connection, Database, transaction
from jobq.queue import Job, JobContext, Registry, enqueue, enqueue_many
from tests.queue.conftest import NewWorker, OpenDatabase
from tests.queue.helpers import counts

NUM_JOBS = 1000
NUM_WORKERS = 4


class Args(BaseModel):
    n: int


async def test_four_workers_run_each_job_exactly_once(
    database: Database, conn: Connection, open_database: OpenDatabase, new_worker: NewWorker
) -> None:
    runs: Counter[int] = Counter()
    by_worker: Counter[int] = Counter()
    all_ran = asyncio.Event()
    handlers = Registry()

    @handlers.handler("count", args=Args)
    async def count_run(args: Args, job: JobContext) -> None:
        runs[job.id] += 1
        by_worker[job.worker_id] += 1
        await asyncio.sleep(0)  # let the other jobs interleave
        if len(runs) == NUM_JOBS:
            all_ran.set()

    pools = [database, await open_database(max_pool_size=4, min_pool_size=1)]
    pools.append(await open_database(max_pool_size=4, min_pool_size=1))
    workers = [
        new_worker(handlers, on=pools[i % len(pools)], max_concurrent_jobs=8)
        for i in range(NUM_WORKERS)
    ]
    ids = await enqueue_many(Job(job_type="count", arguments={"n": n}) for n in range(NUM_JOBS))
    assert len(ids) == NUM_JOBS

    stop = asyncio.Event()
    running = [asyncio.create_task(w.run(stop)) for w in workers]
    try:
        async with asyncio.timeout(20):
            await all_ran.wait()
    finally:
        stop.set()
        async with asyncio.timeout(10):
            await asyncio.gather(*running)

    assert set(runs) == set(ids)
    assert all(n == 1 for n in runs.values()), [i for i, n in runs.items() if n > 1]
    assert sum(w.counts["completed"] for w in workers) == NUM_JOBS
    assert sum(w.counts["claimed"] for w in workers) == NUM_JOBS
    assert sum(w.counts["rejected"] + w.counts["lost_acks"] for w in workers) == 0
    assert await counts(conn) == {"job": 0, "job_running": 0, "job_dead": 0}
    assert len(by_worker) > 1  # the work was shared
    assert await conn.fetchval("SELECT count(*) FROM worker") == 0  # all stopped


async def test_a_worker_never_holds_more_than_its_slots(
    conn: Connection, new_worker: NewWorker
) -> None:
    max_jobs = 3
    in_flight = 0
    peak = 0
    peak_rows = 0
    done = 0
    finished = asyncio.Event()
    handlers = Registry()

    @handlers.handler("busy", args=Args)
    async def busy(args: Args, job: JobContext) -> None:
        nonlocal in_flight, peak, peak_rows, done
        in_flight += 1
        try:
            peak = max(peak, in_flight)
            async with transaction(readonly=True) as c:
                held = await c.fetchval(
                    "SELECT count(*) FROM job_running WHERE worker_id = $1", job.worker_id
                )
            peak_rows = max(peak_rows, held)
            await asyncio.sleep(0.01)
        finally:
            in_flight -= 1
        done += 1
        if done == 30:
            finished.set()

    ids = await enqueue_many(Job(job_type="busy", arguments={"n": n}) for n in range(30))
    worker = new_worker(handlers, max_concurrent_jobs=max_jobs)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        async with asyncio.timeout(10):
            await finished.wait()
    finally:
        stop.set()
        await task
    assert len(ids) == 30
    assert peak == max_jobs
    assert 1 <= peak_rows <= max_jobs
    assert worker.counts["completed"] == 30
    assert worker.counts["retried"] == 0
    assert await counts(conn) == {"job": 0, "job_running": 0, "job_dead": 0}


async def test_producers_and_workers_at_once(
    database: Database, conn: Connection, new_worker: NewWorker
) -> None:
    """Jobs enqueued one by one by concurrent producers while two workers run: all run once."""
    per_producer = 100
    producers = 4
    runs: Counter[int] = Counter()
    all_ran = asyncio.Event()
    handlers = Registry()

    @handlers.handler("count", args=Args)
    async def count_run(args: Args, job: JobContext) -> None:
        runs[args.n] += 1
        if len(runs) == per_producer * producers:
            all_ran.set()

    async def produce(p: int) -> None:
        for i in range(per_producer):
            await enqueue(Job(job_type="count", arguments={"n": p * per_producer + i}))

    stop = asyncio.Event()
    workers = [new_worker(handlers, poll_interval=30) for _ in range(2)]
    running = [asyncio.create_task(w.run(stop)) for w in workers]
    try:
        async with asyncio.timeout(20):
            await asyncio.gather(*(produce(p) for p in range(producers)))
            await all_ran.wait()
    finally:
        stop.set()
        await asyncio.gather(*running)
    assert sorted(runs) == list(range(per_producer * producers))
    assert set(runs.values()) == {1}
    assert await counts(conn) == {"job": 0, "job_running": 0, "job_dead": 0}
