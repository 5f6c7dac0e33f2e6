"""On time: an idle worker wakes on an enqueue (in-process or NOTIFY) and at the next ripe_at,
not at its poll interval; the poll remains the safety net."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from freezegun import freeze_time
from pydantic import BaseModel

from jobq import clock
from jobq.db import Connection, Database, transaction
from jobq.queue import Job, JobContext, Registry, Worker, enqueue, store
from jobq.queue.notify import CHANNEL, Notifier, notifier
from tests.queue.conftest import NewWorker
from tests.queue.helpers import MakeWorker
from tests.toolkit.procs import eventually

SLOW_POLL = 30.0  # seconds: a wake-up that waited for the poll would time the test out
WOKEN = 5.0
"""Seconds within which a woken worker starts a job: far under `SLOW_POLL`, so a start this
soon was woken, not polled, and far over what a slow, busy machine needs (how soon, in
milliseconds, is `python -m bench pickup_latency`'s figure, not a test's)."""


class Args(BaseModel):
    n: int = 0


class Starts:
    """Records when each job starts (loop time and app clock); `wait(n)` waits for n starts."""

    def __init__(self) -> None:
        self.loop_times: list[float] = []
        self.clock_times: list[datetime] = []
        self._event = asyncio.Event()

    def handlers(self) -> Registry:
        handlers = Registry()

        @handlers.handler("tick", args=Args)
        async def tick(args: Args, job: JobContext) -> None:
            self.loop_times.append(asyncio.get_running_loop().time())
            self.clock_times.append(clock.now())
            self._event.set()

        return handlers

    async def wait(self, n: int, within: float = 2 * WOKEN) -> float:
        """Wait for the n-th start (at most `within` seconds); return its loop time."""
        async with asyncio.timeout(within):
            while len(self.loop_times) < n:
                self._event.clear()
                await self._event.wait()
        return self.loop_times[n - 1]


@asynccontextmanager
async def running(
    new_worker: NewWorker, handlers: Registry, **overrides: object
) -> AsyncIterator[Worker]:
    """A worker in `run(stop)`, settled into its idle sleep; stopped at the end."""
    worker = new_worker(handlers, **overrides)
    stop = asyncio.Event()
    await worker.start()
    task = asyncio.create_task(worker.run(stop))
    try:
        await asyncio.sleep(0.1)  # it found nothing and went to sleep for its poll interval
        yield worker
    finally:
        stop.set()
        await task


def now_loop() -> float:
    return asyncio.get_running_loop().time()


async def test_enqueue_in_this_process_wakes_the_worker(new_worker: NewWorker) -> None:
    starts = Starts()
    async with running(new_worker, starts.handlers(), poll_interval=SLOW_POLL):
        for n in range(3):  # every time, not only the first
            committed = now_loop()
            await enqueue(Job(job_type="tick", arguments={"n": n}))
            assert await starts.wait(n + 1) - committed < WOKEN
            await asyncio.sleep(0.05)  # back to sleep


async def test_in_process_wakeup_works_without_notify(
    new_worker: NewWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    starts = Starts()
    async with running(new_worker, starts.handlers(), poll_interval=SLOW_POLL):
        monkeypatch.setattr(Notifier, "notify", lambda self: None)  # only the event can wake
        async with transaction():
            await enqueue(Job(job_type="tick"))
        committed = now_loop()
        assert await starts.wait(1) - committed < WOKEN


async def test_a_commit_that_enqueued_is_followed_by_one_notify(
    database: Database, conn: Connection
) -> None:
    """Other processes' workers hear of the jobs by `NOTIFY jobq`, sent after the commit (never
    before it, never for a rollback), once for a transaction however many jobs it queued."""
    heard: list[float] = []
    await conn.add_listener(CHANNEL, lambda *_: heard.append(now_loop()))
    async with transaction():
        for n in range(5):
            await enqueue(Job(job_type="tick", arguments={"n": n}))
        await asyncio.sleep(0.2)
        assert heard == []  # nothing before the commit
    committed = now_loop()
    await notifier(database).flush()
    await eventually(lambda: heard)
    assert heard[0] >= committed
    await asyncio.sleep(0.2)
    assert len(heard) == 1

    with contextlib.suppress(RuntimeError):
        async with transaction():
            await enqueue(Job(job_type="tick", arguments={"n": 99}))
            raise RuntimeError("roll back")
    await notifier(database).flush()
    await asyncio.sleep(0.2)
    assert len(heard) == 1  # a rollback queued nothing and wakes nobody


async def test_no_wakeup_before_commit(new_worker: NewWorker) -> None:
    starts = Starts()
    async with running(new_worker, starts.handlers(), poll_interval=SLOW_POLL):
        async with transaction():
            await enqueue(Job(job_type="tick"))
            await asyncio.sleep(0.2)  # an uncommitted job cannot be claimed
            assert starts.loop_times == []
        committed = now_loop()
        assert await starts.wait(1) - committed < WOKEN


async def test_insert_from_another_program_wakes_by_its_notify(
    conn: Connection, new_worker: NewWorker
) -> None:
    starts = Starts()
    async with running(new_worker, starts.handlers(), poll_interval=SLOW_POLL):
        async with conn.transaction():
            await insert_job(conn, n=1, notify=True)
        committed = now_loop()
        assert await starts.wait(1) - committed < WOKEN


async def test_scheduled_job_starts_at_its_ripe_at(new_worker: NewWorker) -> None:
    starts = Starts()
    async with running(new_worker, starts.handlers(), poll_interval=SLOW_POLL):
        job = Job(job_type="tick").runs_in(seconds=0.3)
        await enqueue(job)
        await starts.wait(1)
    started_at = starts.clock_times[0]
    assert job.ripe_at <= started_at < job.ripe_at + timedelta(seconds=WOKEN)


async def test_retry_starts_at_its_backoff_not_the_poll(
    conn: Connection, new_worker: NewWorker
) -> None:
    handlers = Registry()
    attempts_at: list[float] = []
    second = asyncio.Event()

    @handlers.handler("flaky", args=Args)
    async def flaky(args: Args, job: JobContext) -> None:
        attempts_at.append(now_loop())
        if job.attempt == 1:
            raise RuntimeError("once")
        second.set()

    async with running(
        new_worker,
        handlers,
        poll_interval=SLOW_POLL,
        backoff_base=timedelta(seconds=0.3),
        backoff_jitter=0,
    ) as worker:
        await enqueue(Job(job_type="flaky"))
        async with asyncio.timeout(2 * WOKEN):
            await second.wait()
    assert 0.3 <= attempts_at[1] - attempts_at[0] < 0.3 + WOKEN
    assert worker.counts["retried"] == 1
    assert worker.counts["completed"] == 1


async def test_job_enqueued_by_a_handler_runs_at_once(new_worker: NewWorker) -> None:
    handlers = Registry()
    times: dict[int, float] = {}
    chained = asyncio.Event()

    @handlers.handler("chain", args=Args)
    async def chain(args: Args, job: JobContext) -> None:
        times[args.n] = now_loop()
        if args.n < 3:
            await enqueue(Job(job_type="chain", arguments={"n": args.n + 1}))
        else:
            chained.set()

    async with running(new_worker, handlers, poll_interval=SLOW_POLL):
        await enqueue(Job(job_type="chain", arguments={"n": 1}))
        async with asyncio.timeout(2 * WOKEN):
            await chained.wait()
    assert times[3] - times[1] < 2 * WOKEN


async def test_poll_finds_a_job_whose_notification_was_lost(
    conn: Connection, new_worker: NewWorker
) -> None:
    starts = Starts()
    async with running(new_worker, starts.handlers(), poll_interval=0.3):
        async with conn.transaction():
            await insert_job(conn, n=1)  # plain SQL without NOTIFY: it wakes nobody
        committed = now_loop()
        assert await starts.wait(1) - committed < 0.3 + WOKEN


async def test_listener_reconnects_and_listens_again(
    conn: Connection, new_worker: NewWorker
) -> None:
    starts = Starts()
    async with running(
        new_worker, starts.handlers(), poll_interval=SLOW_POLL, heartbeat_interval=0.1
    ) as worker:
        listener = worker.listener.conn
        assert listener is not None
        assert await conn.fetchval(
            "SELECT pg_terminate_backend($1, 5000)", listener.get_server_pid()
        )
        # the heartbeat (every 0.1 s) reconnects the listener
        await eventually(lambda: worker.alive and worker.listener.conn is not listener, within=2)
        await asyncio.sleep(0.1)  # settled back into its 30 s idle sleep
        async with conn.transaction():
            await insert_job(conn, n=1, notify=True)
        committed = now_loop()
        assert await starts.wait(1) - committed < WOKEN


async def insert_job(conn: Connection, *, n: int, notify: bool = False) -> None:
    """Queue a `tick` job with plain SQL (as another program would), and `NOTIFY jobq` in the
    same transaction when `notify`."""
    await conn.execute(
        "INSERT INTO job (job_type, arguments, ripe_at, max_retries, created_at)"
        " VALUES ('tick', jsonb_build_object('n', $1::int), $2, 0, $2)",
        n,
        clock.now(),
    )
    if notify:
        await conn.execute("NOTIFY jobq")


async def test_a_job_that_ripened_since_the_last_claim_is_due_at_once(
    make_worker: MakeWorker,
) -> None:
    """A timer may fire a little before the ripe_at it waits for: the claim then finds nothing.
    The next sleep must not skip that job and wait for the one after it."""
    t0 = datetime(2030, 6, 1, 12, 0, tzinfo=UTC)
    with freeze_time(t0, real_asyncio=True) as frozen:
        await enqueue(Job(job_type="tick", arguments={"n": 1}).runs_at(t0 + timedelta(seconds=1)))
        await enqueue(Job(job_type="tick", arguments={"n": 2}).runs_at(t0 + timedelta(seconds=3)))
        worker = await make_worker(Starts().handlers(), poll_interval=SLOW_POLL)
        assert await worker.run_once() == 0  # woken just before the first ripe_at
        assert await worker.wakeups.idle_timeout() == pytest.approx(1.0)
        frozen.move_to(t0 + timedelta(seconds=1))  # it ripened while the claim ran
        assert await worker.wakeups.idle_timeout() == 0  # not 2 s, the wait for the second job
        assert await worker.run_once() == 1
        await worker.wait_idle()


async def test_one_statement_per_job_when_each_claim_fills_its_queue(
    new_worker: NewWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One slot in `default` and one in an idle queue (as the app's own queues sit beside a
    worker's): each claim records the last job's outcome, takes the next job and says when the
    idle queue may next have work. No second claim of the idle queue, no question of when the
    next job ripens: one round trip per job, as the raw one-job-per-transaction loop."""
    statements: Counter[str] = Counter()
    for verb in ("record_and_claim", "next_ripe_at", "record"):
        real = getattr(store, verb)

        async def counted(*args: object, _real: Any = real, _verb: str = verb, **kw: Any) -> Any:
            statements[_verb] += 1
            return await _real(*args, **kw)

        monkeypatch.setattr(store, verb, counted)
    starts = Starts()
    handlers = starts.handlers()

    @handlers.handler("idle.nothing", args=Args, queue="idle")
    async def nothing(args: Args, job: JobContext) -> None:
        raise AssertionError("no job of the idle queue is enqueued")

    jobs = 200
    async with running(new_worker, handlers, queues={"default": 1, "idle": 1}):
        statements.clear()
        async with transaction():
            for n in range(jobs):
                await enqueue(Job(job_type="tick", arguments={"n": n}))
        await starts.wait(jobs, within=30)
    # each job: the claim that took it (and recorded the one before); then the stop's last
    # record and the claims around the enqueue's wake-up
    assert jobs <= statements["record_and_claim"] <= jobs + 3, statements
    assert statements["next_ripe_at"] <= 1, statements
