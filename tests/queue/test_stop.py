"""Graceful and hard stop: claiming ends at once, running jobs drain, the rest are released."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta

from pydantic import BaseModel

from jobq import clock
from jobq.db import Connection
from jobq.queue import Job, JobContext, Registry, enqueue
from tests.queue.conftest import NewWorker
from tests.queue.helpers import Gate, MakeWorker, count, counts, row
from tests.toolkit.procs import eventually


class Args(BaseModel):
    seconds: float = 0
    n: int = 0


def sleepers(started: asyncio.Event) -> Registry:
    handlers = Registry()

    @handlers.handler("nap", args=Args)
    async def nap(args: Args, job: JobContext) -> None:
        started.set()
        await asyncio.sleep(args.seconds)

    return handlers


async def test_stop_lets_a_short_job_finish(conn: Connection, make_worker: MakeWorker) -> None:
    started = asyncio.Event()
    worker = await make_worker(sleepers(started))
    created = await enqueue(Job(job_type="nap", arguments={"seconds": 0.2}))
    assert await worker.run_once() == 1
    await started.wait()
    await worker.stop(timedelta(seconds=2))
    assert worker.counts["completed"] == 1
    assert worker.counts["released"] == 0
    assert await row(conn, "job_running", created.id) is None
    assert await counts(conn) == {"job": 0, "job_running": 0, "job_dead": 0}
    assert await count(conn, "worker") == 0
    assert not worker.alive


async def test_stop_releases_a_job_longer_than_the_drain(
    conn: Connection, make_worker: MakeWorker
) -> None:
    started = asyncio.Event()
    worker = await make_worker(sleepers(started))
    created = await enqueue(Job(job_type="nap", arguments={"seconds": 30}))
    assert await count(conn, "worker") == 1
    assert await worker.run_once() == 1
    await started.wait()
    before = time.monotonic()
    await worker.stop(timedelta(seconds=0.3))
    took = time.monotonic() - before
    assert 0.3 <= took < 1.5
    assert worker.counts["released"] == 1
    assert worker.counts["completed"] == 0
    queued = await row(conn, "job", created.id)
    assert queued is not None
    assert queued["attempts"] == 0  # a stop charges no attempt
    assert queued["last_error"] is None
    assert queued["ripe_at"] <= clock.now()
    assert await counts(conn) == {"job": 1, "job_running": 0, "job_dead": 0}
    assert await count(conn, "worker") == 0
    assert not worker.alive
    assert await worker.run_once() == 0  # a stopped worker claims nothing


async def test_stop_with_zero_drain_releases_at_once(
    conn: Connection, make_worker: MakeWorker
) -> None:
    started = asyncio.Event()
    worker = await make_worker(sleepers(started))  # settings.drain_timeout is 2 s
    created = await enqueue(Job(job_type="nap", arguments={"seconds": 30}))
    assert await worker.run_once() == 1
    await started.wait()
    before = time.monotonic()
    await worker.stop(timedelta(0))
    assert time.monotonic() - before < 1.5  # under the 2 s drain: it did not wait for it
    assert await row(conn, "job", created.id) is not None
    assert worker.counts["released"] == 1


async def test_stop_waits_for_a_sync_job_in_its_thread(
    conn: Connection, make_worker: MakeWorker
) -> None:
    """A thread cannot be cancelled: past the drain timeout, stop keeps the job (so no other
    worker can start it while the thread runs) and records its real outcome once it returns."""
    entered = asyncio.Event()
    unblock = threading.Event()
    handlers = Registry()

    @handlers.handler("block", args=Args)
    def block(args: Args, job: JobContext) -> None:
        job.loop.call_soon_threadsafe(entered.set)
        unblock.wait(10)

    created = await enqueue(Job(job_type="block"))
    worker = await make_worker(handlers)
    other = await make_worker(handlers)
    try:
        assert await worker.run_once() == 1
        async with asyncio.timeout(2):
            await entered.wait()
        stopping = asyncio.create_task(worker.stop(timedelta(seconds=0.1)))
        await asyncio.sleep(0.4)  # well past the drain timeout
        assert not stopping.done()
        assert await count(conn, "job_running") == 1
        assert await other.rescue() == 0
        assert await other.run_once() == 0  # not handed out while the thread runs
    finally:
        unblock.set()
    async with asyncio.timeout(2):
        await stopping
    assert await counts(conn) == {"job": 0, "job_running": 0, "job_dead": 0}
    assert worker.counts["completed"] == 1
    assert worker.counts["released"] == 0
    assert await count(conn, "worker") == 1  # only `other` is left
    assert created.id


async def test_stop_releases_a_sync_job_still_waiting_for_a_thread(
    conn: Connection, make_worker: MakeWorker
) -> None:
    entered = asyncio.Event()
    unblock = threading.Event()
    calls: list[int] = []
    handlers = Registry()

    @handlers.handler("block", args=Args)
    def block(args: Args, job: JobContext) -> None:
        calls.append(args.n)
        job.loop.call_soon_threadsafe(entered.set)
        unblock.wait(10)

    first = await enqueue(Job(job_type="block", arguments={"n": 1}, priority=1))
    second = await enqueue(Job(job_type="block", arguments={"n": 2}))
    worker = await make_worker(handlers, max_threads=1)
    try:
        assert await worker.run_once() == 2
        async with asyncio.timeout(2):
            await entered.wait()
        stopping = asyncio.create_task(worker.stop(timedelta(seconds=0.1)))
        released = await eventually(
            lambda: row(conn, "job", second.id), within=30, what="the second job released"
        )  # never started: released past the drain timeout while the first still runs, uncharged
        assert released["attempts"] == 0
        assert not stopping.done()
    finally:
        unblock.set()
    async with asyncio.timeout(30):
        await stopping
    assert calls == [1]
    assert await row(conn, "job_running", first.id) is None
    assert worker.counts["completed"] == 1
    assert worker.counts["released"] == 1


async def test_release_keeps_earlier_attempts_and_error(
    conn: Connection, make_worker: MakeWorker
) -> None:
    gate = Gate()
    handlers = Registry()

    @handlers.handler("second_hangs", args=Args)
    async def second_hangs(args: Args, job: JobContext) -> None:
        if job.attempt == 1:
            raise RuntimeError("first try failed")
        await gate.enter(job.id)

    worker = await make_worker(handlers, backoff_base=timedelta(milliseconds=1))
    created = await enqueue(Job(job_type="second_hangs"))
    assert await worker.run_once() == 1
    await worker.wait_idle()
    queued = await row(conn, "job", created.id)
    assert queued is not None
    await asyncio.sleep(max(0.0, (queued["ripe_at"] - clock.now()).total_seconds()))
    assert await worker.run_once() == 1
    await gate.wait_entered()
    await worker.stop(timedelta(seconds=0.05))
    queued = await row(conn, "job", created.id)
    assert queued is not None
    assert queued["attempts"] == 1
    assert queued["last_error"] == "RuntimeError: first try failed"


async def test_abort_releases_at_once(conn: Connection, make_worker: MakeWorker) -> None:
    started = asyncio.Event()
    worker = await make_worker(sleepers(started))
    await enqueue(Job(job_type="nap", arguments={"seconds": 30, "n": 1}))
    await enqueue(Job(job_type="nap", arguments={"seconds": 30, "n": 2}))
    assert await worker.run_once() == 2
    await started.wait()
    async with asyncio.timeout(1):
        await worker.abort()
    assert worker.counts["released"] == 2
    assert await counts(conn) == {"job": 2, "job_running": 0, "job_dead": 0}
    assert await conn.fetchval("SELECT sum(attempts) FROM job") == 0
    assert await count(conn, "worker") == 0


async def test_run_stops_at_once_when_idle(conn: Connection, new_worker: NewWorker) -> None:
    worker = new_worker(Registry(), poll_interval=30)
    stop = asyncio.Event()
    await worker.start()
    task = asyncio.create_task(worker.run(stop))
    await asyncio.sleep(0.05)  # let it fall asleep for its 30 s poll
    before = time.monotonic()
    stop.set()
    async with asyncio.timeout(10):
        await task
    assert time.monotonic() - before < 5  # far under the 30 s poll: it did not sleep it out
    assert await count(conn, "worker") == 0


async def test_run_drains_then_releases_on_stop(conn: Connection, new_worker: NewWorker) -> None:
    started = asyncio.Event()
    handlers = sleepers(started)
    worker = new_worker(handlers, drain_timeout=0.3, poll_interval=30)
    short = await enqueue(Job(job_type="nap", arguments={"seconds": 0.1}))
    long = await enqueue(Job(job_type="nap", arguments={"seconds": 30}))
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    async with asyncio.timeout(2):
        await started.wait()
    stop.set()
    # claiming stops at once: a job enqueued now stays queued
    late = await enqueue(Job(job_type="nap", arguments={"seconds": 0, "n": 9}))
    async with asyncio.timeout(2):
        await task
    assert await row(conn, "job", short.id) is None
    assert await row(conn, "job_running", short.id) is None
    released = await row(conn, "job", long.id)
    assert released is not None
    assert released["attempts"] == 0
    assert await row(conn, "job", late.id) is not None
    assert worker.counts["completed"] == 1
    assert worker.counts["released"] == 1
    assert await counts(conn) == {"job": 2, "job_running": 0, "job_dead": 0}
    assert await count(conn, "worker") == 0
