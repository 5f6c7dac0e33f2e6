"""Failures: retry with backoff, the dead letter, timeouts, unknown types and bad arguments."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import pytest
from freezegun import freeze_time
from pydantic import BaseModel

from jobq import clock
from jobq.db import Connection, transaction
from jobq.queue import DontRetry, Job, JobContext, Registry, enqueue
from tests.queue.helpers import MakeWorker, counts, row, where

T0 = datetime(2030, 6, 1, 12, 0, tzinfo=UTC)
BASE = timedelta(seconds=1)  # settings.backoff_base in the tests
JITTER = 0.25  # the default settings.backoff_jitter


class Args(BaseModel):
    n: int


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_failures_retry_with_backoff_then_die(
    conn: Connection, make_worker: MakeWorker, sync: bool
) -> None:
    attempts_seen: list[tuple[int, bool]] = []
    handlers = Registry()

    def fail(job: JobContext) -> None:
        attempts_seen.append((job.attempt, job.is_last_attempt))
        raise ValueError(f"boom {job.attempt}")

    if sync:

        @handlers.handler("flaky", args=Args)
        def flaky_sync(args: Args, job: JobContext) -> None:
            fail(job)
    else:

        @handlers.handler("flaky", args=Args)
        async def flaky(args: Args, job: JobContext) -> None:
            fail(job)

    worker = await make_worker(handlers)
    with freeze_time(T0, real_asyncio=True) as frozen:
        created = await enqueue(Job(job_type="flaky", arguments={"n": 1}, max_retries=2))
        now = T0
        for attempt in (1, 2):
            assert await worker.run_once() == 1
            await worker.wait_idle()
            queued = await row(conn, "job", created.id)
            assert queued is not None, await where(conn, created.id)
            assert queued["attempts"] == attempt
            assert queued["last_error"] == f"ValueError: boom {attempt}"
            ceiling = BASE * 2 ** (attempt - 1)
            assert now + ceiling * (1 - JITTER) < queued["ripe_at"] <= now + ceiling
            # not claimable before its ripe_at, claimable at it
            assert await worker.run_once() == 0
            frozen.move_to(queued["ripe_at"] - timedelta(microseconds=1))
            assert await worker.run_once() == 0
            frozen.move_to(queued["ripe_at"])
            now = queued["ripe_at"]
        assert await worker.run_once() == 1
        await worker.wait_idle()
    assert attempts_seen == [(1, False), (2, False), (3, True)]
    dead = await row(conn, "job_dead", created.id)
    assert dead is not None
    assert dead["attempts"] == 3
    assert dead["max_retries"] == 2
    assert dead["last_error"] == "ValueError: boom 3"
    assert dead["died_at"] == now
    assert dead["arguments"] == {"n": 1}
    assert await counts(conn) == {"job": 0, "job_running": 0, "job_dead": 1}
    assert worker.counts["retried"] == 2
    assert worker.counts["buried"] == 1
    assert worker.counts["completed"] == 0


async def test_zero_retries_dies_at_the_first_failure(
    conn: Connection, make_worker: MakeWorker
) -> None:
    handlers = Registry()

    @handlers.handler("fail", args=Args)
    async def fail(args: Args, job: JobContext) -> None:
        assert job.is_last_attempt
        raise KeyError("gone")

    created = await enqueue(Job(job_type="fail", arguments={"n": 1}, max_retries=0))
    worker = await make_worker(handlers)
    assert await worker.run_once() == 1
    await worker.wait_idle()
    dead = await row(conn, "job_dead", created.id)
    assert dead is not None
    assert dead["attempts"] == 1
    assert dead["last_error"] == "KeyError: 'gone'"


async def test_a_retry_that_succeeds_completes(conn: Connection, make_worker: MakeWorker) -> None:
    handlers = Registry()

    @handlers.handler("second_time_lucky", args=Args)
    async def lucky(args: Args, job: JobContext) -> None:
        if job.attempt == 1:
            raise RuntimeError("first")

    worker = await make_worker(handlers)
    with freeze_time(T0, real_asyncio=True) as frozen:
        created = await enqueue(Job(job_type="second_time_lucky", arguments={"n": 1}))
        assert await worker.run_once() == 1
        await worker.wait_idle()
        frozen.tick(BASE)
        assert await worker.run_once() == 1
        await worker.wait_idle()
    assert await where(conn, created.id) == []
    assert worker.counts["retried"] == 1
    assert worker.counts["completed"] == 1


async def test_dont_retry_goes_straight_to_the_dead_letter(
    conn: Connection, make_worker: MakeWorker
) -> None:
    handlers = Registry()

    @handlers.handler("declined", args=Args)
    async def declined(args: Args, job: JobContext) -> None:
        raise DontRetry("card declined")

    created = await enqueue(Job(job_type="declined", arguments={"n": 1}, max_retries=5))
    worker = await make_worker(handlers)
    assert await worker.run_once() == 1
    await worker.wait_idle()
    dead = await row(conn, "job_dead", created.id)
    assert dead is not None
    assert dead["attempts"] == 1
    assert dead["last_error"] == "DontRetry: card declined"
    assert await counts(conn) == {"job": 0, "job_running": 0, "job_dead": 1}
    assert worker.counts["retried"] == 0
    assert worker.counts["buried"] == 1


async def test_async_timeout_fails_the_attempt(conn: Connection, make_worker: MakeWorker) -> None:
    handlers = Registry()
    cancelled = asyncio.Event()

    @handlers.handler("slow", args=Args, timeout=0.1)
    async def slow(args: Args, job: JobContext) -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    created = await enqueue(Job(job_type="slow", arguments={"n": 1}))
    worker = await make_worker(handlers)
    started = time.monotonic()
    assert await worker.run_once() == 1
    await worker.wait_idle()
    assert time.monotonic() - started < 2
    assert cancelled.is_set()
    queued = await row(conn, "job", created.id)
    assert queued is not None
    assert queued["attempts"] == 1
    assert "timed out" in queued["last_error"]
    assert "0.1" in queued["last_error"]


async def test_sync_timeout_fails_the_attempt(conn: Connection, make_worker: MakeWorker) -> None:
    handlers = Registry()

    @handlers.handler("slow_sync", args=Args, timeout=timedelta(seconds=0.1))
    def slow(args: Args, job: JobContext) -> None:
        time.sleep(0.3)

    created = await enqueue(Job(job_type="slow_sync", arguments={"n": 1}))
    worker = await make_worker(handlers)
    assert await worker.run_once() == 1
    async with asyncio.timeout(2):
        await worker.wait_idle()
    queued = await row(conn, "job", created.id)
    assert queued is not None
    assert queued["attempts"] == 1
    assert "timed out" in queued["last_error"]


async def test_handler_raising_timeout_error_is_a_plain_failure(
    conn: Connection, make_worker: MakeWorker
) -> None:
    handlers = Registry()

    @handlers.handler("remote", args=Args, timeout=5)
    async def remote(args: Args, job: JobContext) -> None:
        raise TimeoutError("upstream did not answer")

    created = await enqueue(Job(job_type="remote", arguments={"n": 1}))
    worker = await make_worker(handlers)
    assert await worker.run_once() == 1
    await worker.wait_idle()
    queued = await row(conn, "job", created.id)
    assert queued is not None
    assert queued["last_error"] == "TimeoutError: upstream did not answer"


async def test_unknown_job_type_is_dead(conn: Connection, make_worker: MakeWorker) -> None:
    created = await enqueue(Job(job_type="nobody.handles.this", arguments={"n": 1}))
    worker = await make_worker(Registry())
    assert await worker.run_once() == 1
    await worker.wait_idle()
    dead = await row(conn, "job_dead", created.id)
    assert dead is not None
    assert "no handler" in dead["last_error"]
    assert "nobody.handles.this" in dead["last_error"]
    assert await counts(conn) == {"job": 0, "job_running": 0, "job_dead": 1}
    assert worker.counts["retried"] == 0


async def test_invalid_arguments_are_dead_without_a_call(
    conn: Connection, make_worker: MakeWorker
) -> None:
    called: list[int] = []
    handlers = Registry()

    @handlers.handler("typed", args=Args)
    async def typed(args: Args, job: JobContext) -> None:
        called.append(job.id)

    created = await enqueue(Job(job_type="typed", arguments={"n": "not a number"}))
    worker = await make_worker(handlers)
    assert await worker.run_once() == 1
    await worker.wait_idle()
    assert called == []
    dead = await row(conn, "job_dead", created.id)
    assert dead is not None
    assert dead["attempts"] == 1
    assert "invalid arguments" in dead["last_error"]
    assert "valid integer" in dead["last_error"]  # pydantic's message names the problem
    assert "n" in dead["last_error"]
    assert await counts(conn) == {"job": 0, "job_running": 0, "job_dead": 1}
    assert worker.counts["retried"] == 0


async def test_sql_error_in_a_handler_is_retried_and_the_worker_goes_on(
    conn: Connection, make_worker: MakeWorker
) -> None:
    """A handler's SQL error is its own transaction's: the job is retried, not a poison pill."""
    handlers = Registry()
    done: list[int] = []

    @handlers.handler("sql", args=Args)
    async def bad_sql(args: Args, job: JobContext) -> None:
        async with transaction() as c:
            if args.n == 0:
                await c.execute("SELECT 1 / 0")
            await c.execute("SELECT 1")
        done.append(args.n)

    bad = await enqueue(Job(job_type="sql", arguments={"n": 0}))
    good = await enqueue(Job(job_type="sql", arguments={"n": 1}))
    worker = await make_worker(handlers)
    assert await worker.run_once() == 2
    await worker.wait_idle()
    queued = await row(conn, "job", bad.id)
    assert queued is not None
    assert queued["attempts"] == 1
    assert "DivisionByZero" in queued["last_error"]
    assert await where(conn, good.id) == []
    assert done == [1]


async def test_long_error_messages_are_cut(conn: Connection, make_worker: MakeWorker) -> None:
    handlers = Registry()

    @handlers.handler("chatty", args=Args)
    async def chatty(args: Args, job: JobContext) -> None:
        raise ValueError("x" * 100_000)

    created = await enqueue(Job(job_type="chatty", arguments={"n": 1}))
    worker = await make_worker(handlers)
    assert await worker.run_once() == 1
    await worker.wait_idle()
    queued = await row(conn, "job", created.id)
    assert queued is not None
    assert queued["last_error"].startswith("ValueError: xxx")
    assert len(queued["last_error"]) <= 2000


async def test_worker_uses_the_backoff_settings(conn: Connection, make_worker: MakeWorker) -> None:
    handlers = Registry()

    @handlers.handler("fail", args=Args)
    async def fail(args: Args, job: JobContext) -> None:
        raise RuntimeError("again")

    worker = await make_worker(
        handlers,
        backoff_base=timedelta(seconds=10),
        backoff_max=timedelta(seconds=25),
        backoff_jitter=0,
    )
    delays = []
    with freeze_time(T0, real_asyncio=True) as frozen:
        created = await enqueue(Job(job_type="fail", arguments={"n": 1}, max_retries=3))
        for _ in range(3):
            now = clock.now()
            assert await worker.run_once() == 1
            await worker.wait_idle()
            queued = await row(conn, "job", created.id)
            assert queued is not None
            delays.append(queued["ripe_at"] - now)
            frozen.move_to(queued["ripe_at"])
    assert delays == [timedelta(seconds=10), timedelta(seconds=20), timedelta(seconds=25)]
