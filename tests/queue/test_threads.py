"""Synchronous handlers run in the thread pool: the event loop never blocks."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta

import pytest
from pydantic import BaseModel

from jobq.db import Connection, Database, transaction
from jobq.queue import Job, JobContext, Registry, enqueue
from tests.queue.helpers import MakeWorker, counts


class Args(BaseModel):
    seconds: float = 0


async def max_lag_while(done: asyncio.Future[None] | asyncio.Task[None], tick: float) -> float:
    """Return the worst lateness of a `tick`-second ticker running until `done` finishes."""
    loop = asyncio.get_running_loop()
    worst = 0.0
    while not done.done():
        due = loop.time() + tick
        await asyncio.sleep(tick)
        worst = max(worst, loop.time() - due)
    return worst


async def test_sync_handler_does_not_block_the_loop(
    conn: Connection, make_worker: MakeWorker
) -> None:
    threads: list[str] = []
    handlers = Registry()

    @handlers.handler("sleepy", args=Args)
    def sleepy(args: Args, job: JobContext) -> None:
        threads.append(threading.current_thread().name)
        time.sleep(args.seconds)

    await enqueue(Job(job_type="sleepy", arguments={"seconds": 1}))
    await enqueue(Job(job_type="sleepy", arguments={"seconds": 0.9}))
    worker = await make_worker(handlers)
    started = time.monotonic()
    assert await worker.run_once() == 2
    idle = asyncio.create_task(worker.wait_idle())
    lag = await max_lag_while(idle, 0.01)
    elapsed = time.monotonic() - started
    await idle
    assert lag < 0.2
    assert 1 <= elapsed < 1.8  # the two ran side by side in threads
    assert len(threads) == 2
    assert all(name.startswith("jobq-sync") for name in threads)
    assert threading.current_thread().name not in threads
    assert worker.counts["completed"] == 2
    assert await counts(conn) == {"job": 0, "job_running": 0, "job_dead": 0}


async def test_max_threads_bounds_sync_handlers(conn: Connection, make_worker: MakeWorker) -> None:
    lock = threading.Lock()
    active = 0
    peak = 0
    handlers = Registry()

    @handlers.handler("sleepy", args=Args)
    def sleepy(args: Args, job: JobContext) -> None:
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        time.sleep(args.seconds)
        with lock:
            active -= 1

    for n in range(6):
        await enqueue(Job(job_type="sleepy", arguments={"seconds": 0.05 + n / 1000}))
    worker = await make_worker(handlers, max_threads=2, max_concurrent_jobs=6)
    assert await worker.run_once() == 6
    await worker.wait_idle()
    assert peak == 2
    assert worker.counts["completed"] == 6


async def test_run_coroutine_runs_a_query_on_the_loop(
    database: Database, conn: Connection, make_worker: MakeWorker
) -> None:
    seen: list[tuple[int, str]] = []
    handlers = Registry()

    async def where_am_i(job_id: int) -> tuple[int, str]:
        async with transaction(readonly=True) as c:
            held: int = await c.fetchval("SELECT count(*) FROM job_running WHERE id = $1", job_id)
        return held, threading.current_thread().name

    @handlers.handler("sync_db", args=Args)
    def sync_db(args: Args, job: JobContext) -> None:
        seen.append(job.run_coroutine(where_am_i(job.id)))
        seen.append((0, threading.current_thread().name))

    created = await enqueue(Job(job_type="sync_db"))
    worker = await make_worker(handlers)
    assert await worker.run_once() == 1
    await worker.wait_idle()
    assert worker.counts["completed"] == 1, await conn.fetchval(
        "SELECT last_error FROM job WHERE id = $1", created.id
    )
    (held, loop_thread), (_, handler_thread) = seen
    assert held == 1  # the job is in job_running while it runs
    assert loop_thread == threading.current_thread().name
    assert handler_thread.startswith("jobq-sync")


async def test_run_coroutine_errors_reach_the_handler(
    conn: Connection, make_worker: MakeWorker
) -> None:
    handlers = Registry()

    async def broken() -> None:
        async with transaction() as c:
            await c.execute("SELECT no_such_column FROM job")

    @handlers.handler("sync_broken", args=Args)
    def sync_broken(args: Args, job: JobContext) -> None:
        job.run_coroutine(broken())

    created = await enqueue(Job(job_type="sync_broken"))
    worker = await make_worker(handlers)
    assert await worker.run_once() == 1
    await worker.wait_idle()
    queued = await conn.fetchrow("SELECT attempts, last_error FROM job WHERE id = $1", created.id)
    assert queued is not None
    assert queued["attempts"] == 1
    assert "UndefinedColumn" in queued["last_error"]


async def test_run_coroutine_refuses_the_loop_thread(make_worker: MakeWorker) -> None:
    outcome: list[str] = []
    handlers = Registry()

    async def nothing() -> int:
        return 1

    @handlers.handler("async_misuse", args=Args)
    async def misuse(args: Args, job: JobContext) -> None:
        with pytest.raises(RuntimeError, match="synchronous"):
            job.run_coroutine(nothing())
        outcome.append("refused")

    await enqueue(Job(job_type="async_misuse"))
    worker = await make_worker(handlers)
    assert await worker.run_once() == 1
    await worker.wait_idle()
    assert outcome == ["refused"]
    assert worker.counts["completed"] == 1


async def test_timed_out_sync_handler_is_not_run_again_while_its_thread_runs(
    conn: Connection, make_worker: MakeWorker
) -> None:
    """A thread cannot be cancelled: after a sync handler's timeout the job must not be handed
    out again (retried, claimed, run) while the first attempt's thread still runs it."""
    lock = threading.Lock()
    active = 0
    overlaps: list[int] = []
    unblock = threading.Event()
    handlers = Registry()

    @handlers.handler("stuck", args=Args, timeout=0.1)
    def stuck(args: Args, job: JobContext) -> None:
        nonlocal active
        with lock:
            active += 1
            if active > 1:
                overlaps.append(job.attempt)
        try:
            if job.attempt == 1:
                unblock.wait(0.6)  # outlives its 0.1 s timeout
        finally:
            with lock:
                active -= 1

    worker = await make_worker(handlers, backoff_base=timedelta(milliseconds=1), backoff_jitter=0)
    created = await enqueue(Job(job_type="stuck"))
    try:
        assert await worker.run_once() == 1
        async with asyncio.timeout(3):
            await worker.wait_idle()  # the first attempt's outcome is recorded
            await asyncio.sleep(0.01)  # past the 1 ms backoff
            assert await worker.run_once() == 1
            await worker.wait_idle()
    finally:
        unblock.set()
    assert overlaps == []
    assert worker.counts["retried"] == 1
    assert worker.counts["completed"] == 1
    states = await conn.fetch("SELECT state FROM job_state WHERE id = $1", created.id)
    assert [r["state"] for r in states] == ["succeeded"]
