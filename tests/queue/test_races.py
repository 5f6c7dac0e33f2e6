"""Races between failure, stop, heartbeat, rescue and reconnect: each of these tests failed on
an earlier version of the engine (found in review)."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import asyncpg
import pytest
from pydantic import BaseModel

from jobq import clock
from jobq.db import Connection, Database
from jobq.queue import Job, JobContext, Registry, Worker, enqueue, sql, store
from tests import outcomes
from tests.conftest import make_settings
from tests.queue.conftest import NewWorker
from tests.queue.helpers import Gate, MakeWorker, where
from tests.toolkit.procs import eventually

LEASE = timedelta(seconds=5)


class Args(BaseModel):
    n: int = 0


# -- a failed job whose duplicate was enqueued while it ran is merged, never gone --------------


async def test_retry_of_a_job_with_a_queued_duplicate_keeps_the_job(conn: Connection) -> None:
    """Guarantee 2: until its outcome is recorded a job is in job, job_running or job_dead.

    A running job is no duplicate, so an identical job can be queued while the first runs.
    When the first then fails, it cannot go back to `job` (one queued copy): it is recorded in
    job_dead as merged into the queued one, which keeps its place."""
    first = await enqueue(Job(job_type="dup", arguments={"k": 1}, max_retries=3))
    now = clock.now()
    (claimed,) = await store.claim(
        conn, worker_id=1, max_jobs=1, now=now, lease_expires_at=now + LEASE
    )
    second = await enqueue(Job(job_type="dup", arguments={"k": 1}, max_retries=3))
    assert not second.duplicate  # documented: a running job does not count
    assert await outcomes.retry(conn, claimed.token, ripe_at=now, error="boom", now=now) is True
    assert await where(conn, first.id) == ["job_dead"]
    merged = await conn.fetchrow(
        "SELECT attempts, last_error FROM job_dead WHERE id = $1", first.id
    )
    assert merged is not None
    assert (merged["attempts"], merged["last_error"]) == (
        1,
        f"merged into queued duplicate job {second.id}",
    )
    assert await where(conn, second.id) == ["job"]


async def test_release_of_a_job_with_a_queued_duplicate_keeps_the_job(conn: Connection) -> None:
    """The same on a graceful stop (release); and the queued twin, due in an hour, now ripens
    when the released job would have: the merge never makes the work later."""
    first = await enqueue(Job(job_type="dup", arguments={"k": 2}))
    now = clock.now()
    (claimed,) = await store.claim(
        conn, worker_id=1, max_jobs=1, now=now, lease_expires_at=now + LEASE
    )
    second = await enqueue(Job(job_type="dup", arguments={"k": 2}).runs_in(hours=1))
    assert await outcomes.release(conn, claimed.token, now=now) is True
    assert await where(conn, first.id) == ["job_dead"]
    # the released job would have kept its place (its own ripe_at): the twin takes it
    assert claimed.ripe_at < now
    ripe_at = await conn.fetchval("SELECT ripe_at FROM job WHERE id = $1", second.id)
    assert ripe_at == claimed.ripe_at
    assert await where(conn, first.id) != []


# -- the heartbeat goes on while jobs drain, so a drain longer than the lease keeps them -------


async def test_draining_worker_keeps_its_leases(
    conn: Connection, new_worker: NewWorker, make_worker: MakeWorker
) -> None:
    """With a drain timeout longer than the lease, the heartbeat must go on during the drain,
    or the draining job's lease expires and another worker re-runs it while it still runs."""
    gate = Gate()
    handlers = Registry()

    @handlers.handler("long", args=Args)
    async def long(args: Args, job: JobContext) -> None:
        await gate.enter(job.attempt)

    created = await enqueue(Job(job_type="long"))
    short = {"lease": timedelta(seconds=0.6), "drain_timeout": timedelta(seconds=3)}
    worker_a = new_worker(handlers, **short)
    stop = asyncio.Event()
    runner = asyncio.create_task(worker_a.run(stop))
    try:
        await gate.wait_entered(1)
        stop.set()  # graceful stop: A drains for up to 3 s
        worker_b = await make_worker(handlers, **short)
        await asyncio.sleep(1.5)  # > lease, < drain: A is alive and still draining
        assert await worker_b.rescue() == 0
        assert await worker_b.run_once() == 0
        assert await where(conn, created.id) == ["job_running"]
    finally:
        gate.release()
        await runner


# -- a listener blip alone does not hand a live worker's jobs to another -----------------------


async def test_listener_reconnect_does_not_hand_out_running_jobs(
    conn: Connection, make_worker: MakeWorker
) -> None:
    """The worker process lives, its handler runs, and its listener session is cut (a restart
    of a pooler, idle_session_timeout, a network blip). Its lock is gone, but its process has
    sessions and its heartbeat is recent: no rescue. It reconnects and finishes the job once."""
    gate = Gate()
    handlers = Registry()

    @handlers.handler("gated", args=Args)
    async def gated(args: Args, job: JobContext) -> None:
        await gate.enter(job.attempt)

    created = await enqueue(Job(job_type="gated"))
    # The heartbeat grace (3 x interval) must outlast this test's steps on a loaded machine;
    # the test drives heartbeats itself (a lease outlasts two intervals).
    beat = {"heartbeat_interval": timedelta(seconds=10), "lease": timedelta(seconds=20)}
    worker_a = await make_worker(handlers, **beat)
    worker_b = await make_worker(handlers, **beat)
    try:
        assert await worker_a.run_once() == 1
        await gate.wait_entered(1)
        listener = worker_a.listener.conn
        assert listener is not None
        await conn.fetchval("SELECT pg_terminate_backend($1, 5000)", listener.get_server_pid())
        await eventually(lambda: not worker_a.alive)

        async def lock_gone() -> bool:
            held = await conn.fetchval(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = $1"
                " AND classid = $2 AND database = (SELECT oid FROM pg_database"
                " WHERE datname = current_database())",
                worker_a.id,
                sql.WORKER_LOCK_CLASS,
            )
            return bool(held == 0)

        await eventually(lock_gone)
        assert await worker_b.rescue() == 0  # within the heartbeat grace: still alive
        assert await worker_b.run_once() == 0
        assert await worker_a.heartbeat() == 1  # extends its lease, then reconnects
        assert worker_a.alive
        assert await worker_b.rescue() == 0
    finally:
        gate.release()
    await worker_a.wait_idle()
    assert gate.entered == [1]
    assert worker_a.counts["completed"] == 1
    assert await where(conn, created.id) == []


# -- a sync job's timeout runs from its thread's start, not its wait for a thread -------------


async def test_sync_timeout_does_not_count_waiting_for_a_thread(
    conn: Connection, make_worker: MakeWorker
) -> None:
    """With more slots than threads, a claimed sync job waits for a thread under its own
    timeout. It then runs in full anyway (the code waits for the thread) and its success is
    recorded as a timeout failure: a job that ran within its limit is retried (run twice)."""
    runs: list[float] = []
    handlers = Registry()

    @handlers.handler("work", args=Args, timeout=1.0)
    def work(args: Args, job: JobContext) -> None:
        started = time.monotonic()
        time.sleep(0.6)  # well within the 1 s limit, which the wait and the run together pass
        runs.append(time.monotonic() - started)

    await enqueue(Job(job_type="work", arguments={"n": 1}))
    await enqueue(Job(job_type="work", arguments={"n": 2}))
    worker = await make_worker(handlers, max_threads=1, max_concurrent_jobs=2)
    assert await worker.run_once() == 2
    await worker.wait_idle()
    assert all(r < 1.0 for r in runs)
    assert worker.counts["completed"] == 2, dict(worker.counts)


# -- abort() lets a claim in flight finish first ----------------------------------------------


async def test_abort_waits_for_a_claim_in_flight(conn: Connection, database: Database) -> None:
    """A claim in flight when `abort()` runs completes first and its job is handled: it must
    not start on a worker whose thread pool is shut down and "fail" without having run (an
    attempt charged, `RuntimeError: cannot schedule new futures after shutdown`)."""
    ran: list[int] = []
    handlers = Registry()

    @handlers.handler("sync_job", args=Args)
    def sync_job(args: Args, job: JobContext) -> None:
        ran.append(job.attempt)

    created = await enqueue(Job(job_type="sync_job"))
    small_settings = make_settings(database.dsn, min_pool_size=1, max_pool_size=1)
    small = await Database.open(small_settings, database.dsn)
    worker = Worker(small, small_settings, handlers=handlers)
    try:
        await worker.start()
        held = await small.pool.acquire()  # the claim will wait for the pool's one connection
        claim = asyncio.create_task(worker.run_once())
        await asyncio.sleep(0.05)
        aborted = asyncio.create_task(worker.abort())
        await asyncio.sleep(0.05)
        await small.pool.release(held)
        await aborted
        await claim
        await worker.wait_idle()
        queued = await conn.fetchrow(
            "SELECT attempts, last_error FROM job WHERE id = $1", created.id
        )
        # Claimed before the stop took hold, the job either ran to completion or went back
        # uncharged; never an attempt charged for a run that did not happen.
        if ran:
            assert (ran, queued, worker.counts["completed"]) == ([1], None, 1)
        else:
            assert queued is not None
            assert (queued["attempts"], queued["last_error"]) == (0, None)
        assert await conn.fetchval("SELECT count(*) FROM job_dead") == 0
    finally:
        await worker.abort()
        await small.close()


# -- a claim that fails on the listener drops it; the heartbeat connects a fresh one ----------


async def test_a_failed_claim_replaces_the_listener(
    conn: Connection, make_worker: MakeWorker
) -> None:
    """A statement cut short can leave the listener connection unusable without closing it
    (asyncpg: "cannot switch to state ..."), and claims run on it. So a failed claim drops the
    listener, and the next heartbeat connects a fresh one: claims go on."""
    handlers = Registry()

    @handlers.handler("noop", args=Args)
    async def noop(args: Args, job: JobContext) -> None:
        pass

    created = await enqueue(Job(job_type="noop"))
    worker = await make_worker(handlers)
    listener = worker.listener.conn
    assert listener is not None
    # this session can no longer write: every claim on it fails
    await listener.execute("SET default_transaction_read_only = on")
    with pytest.raises(asyncpg.ReadOnlySQLTransactionError):
        await worker.run_once()
    assert listener.is_closed()
    assert not worker.alive
    assert await worker.heartbeat() == 0  # reconnects
    assert worker.alive
    assert worker.listener.conn is not listener
    assert await worker.run_once() == 1
    await worker.wait_idle()
    assert await where(conn, created.id) == []


async def test_claims_whose_answer_was_lost_go_back_on_reconnect(
    conn: Connection, make_worker: MakeWorker
) -> None:
    """The listener is cut as a claim commits: the rows are in `job_running` under this worker,
    but it never got them and never starts them. On reconnect it puts them back at once, at
    their place and with no attempt charged, instead of leaving them to its lease."""
    handlers = Registry()

    @handlers.handler("noop", args=Args)
    async def noop(args: Args, job: JobContext) -> None:
        pass

    created = await enqueue(Job(job_type="noop"))
    # no heartbeat of its own during the test (a lease outlasts two)
    worker = await make_worker(
        handlers, heartbeat_interval=timedelta(seconds=10), lease=timedelta(seconds=20)
    )
    assert worker.id is not None
    now = clock.now()
    # the claim that committed for this worker, whose answer it never saw
    (lost,) = await store.claim(
        conn, worker_id=worker.id, max_jobs=1, now=now, lease_expires_at=now + LEASE
    )
    listener = worker.listener.conn
    assert listener is not None
    await conn.fetchval("SELECT pg_terminate_backend($1, 5000)", listener.get_server_pid())
    await eventually(lambda: not worker.alive)
    await worker.heartbeat()  # reconnects, then releases what it does not hold
    assert worker.alive
    queued = await conn.fetchrow("SELECT attempts, ripe_at FROM job WHERE id = $1", created.id)
    assert queued is not None
    assert (queued["attempts"], queued["ripe_at"]) == (0, lost.ripe_at)
    assert await worker.run_once() == 1
    await worker.wait_idle()
    assert await where(conn, created.id) == []
