"""Job control against the real database: cancel in every state, results, waiting for a job's
end, and the retention of finished jobs (`jobq.queue.control`, `jobq.queue.leader.prune`)."""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from jobq import clock
from jobq.db import Connection, Database
from jobq.errors import Conflict, NotFound
from jobq.queue import Job, JobContext, Registry, control, enqueue
from jobq.queue.control import (
    JobCancelled,
    JobFailed,
    JobState,
    JobStatus,
    Waiters,
    await_end,
    cancel,
    drain_waits,
    find,
    job_states,
    wait_for,
)
from jobq.queue.executor import ResultError, result_json
from jobq.queue.leader.prune import partition_name, prune_finished
from tests.queue.helpers import Gate, MakeWorker, counts
from tests.toolkit.procs import eventually


class Args(BaseModel):
    n: int = 0


async def state_of(conn: Connection, job_id: int) -> JobState | None:
    job = await find(conn, job_id, now=clock.now())
    return None if job is None else job.state


async def cancel_now(conn: Connection, job_id: int) -> JobState:
    return (await cancel(conn, job_id, now=clock.now(), retain=True)).state


# -- cancel ------------------------------------------------------------------------------------


@pytest.mark.parametrize("delay_s", [0, 3600], ids=["queued", "scheduled"])
async def test_a_cancelled_queued_job_leaves_the_queue_and_never_runs(
    conn: Connection, make_worker: MakeWorker, delay_s: int
) -> None:
    ran: list[int] = []
    handlers = Registry()

    @handlers.handler("t", args=Args)
    async def t(args: Args, job: JobContext) -> None:
        ran.append(job.id)

    created = await enqueue(Job(job_type="t", arguments={"n": 1}).runs_in(seconds=delay_s))
    assert await state_of(conn, created.id) == ("queued" if delay_s == 0 else "scheduled")
    assert await cancel_now(conn, created.id) is JobState.CANCELLED
    worker = await make_worker(handlers)
    assert await worker.run_once() == 0
    assert ran == []
    done = await conn.fetchrow("SELECT state, attempts FROM job_done WHERE id = $1", created.id)
    assert done is not None
    assert dict(done) == {"state": "cancelled", "attempts": 0}
    assert (await counts(conn))["job"] == 0
    # a second cancel changes nothing and says so
    assert await cancel_now(conn, created.id) is JobState.CANCELLED


async def test_a_cancelled_async_handler_is_cancelled_and_its_job_ends_cancelled(
    conn: Connection, make_worker: MakeWorker
) -> None:
    gate = Gate()
    interrupted = asyncio.Event()
    handlers = Registry()

    @handlers.handler("t", args=Args)
    async def t(args: Args, job: JobContext) -> str:
        try:
            await gate.enter(job.id)
        except asyncio.CancelledError:
            interrupted.set()
            raise
        return "finished anyway"

    worker = await make_worker(handlers, max_retries=0)
    created = await enqueue(Job(job_type="t", arguments={"n": 1}))
    assert await worker.run_once() == 1
    await gate.wait_entered()
    assert await cancel_now(conn, created.id) is JobState.RUNNING
    # the worker hears it through its listener (NOTIFY jobq_cancel), with no help from the test
    async with asyncio.timeout(5):
        await interrupted.wait()
    await worker.wait_idle()
    job = await find(conn, created.id, now=clock.now())
    assert job is not None
    assert (job.state, job.attempts, job.result) == (JobState.CANCELLED, 1, None)
    assert worker.free_slots == worker.slots.capacity["default"]
    # it is not queued again: nothing more to claim, ever
    assert await worker.run_once() == 0
    assert await cancel_now(conn, created.id) is JobState.CANCELLED  # again: nothing changes


async def test_a_sync_handler_sees_the_cancel_and_its_late_result_changes_nothing(
    conn: Connection, make_worker: MakeWorker
) -> None:
    started = threading.Event()
    release = threading.Event()
    saw_cancel: list[bool] = []
    handlers = Registry()

    @handlers.handler("t", args=Args)
    def t(args: Args, job: JobContext) -> dict[str, Any]:
        started.set()
        saw_cancel.append(job.cancelled.wait(10))
        release.wait(10)
        return {"late": True}  # an outcome that arrives after the cancel

    worker = await make_worker(handlers)
    created = await enqueue(Job(job_type="t", arguments={"n": 1}))
    assert await worker.run_once() == 1
    await asyncio.to_thread(started.wait, 5)
    assert await cancel_now(conn, created.id) is JobState.RUNNING
    # running, marked: a cancel again says the same
    assert await cancel_now(conn, created.id) is JobState.RUNNING
    release.set()
    await worker.wait_idle()
    assert saw_cancel == [True]
    job = await find(conn, created.id, now=clock.now())
    assert job is not None
    assert (job.state, job.result) == (JobState.CANCELLED, None)
    assert worker.counts["completed"] == 1  # its outcome was recorded, as a cancel


async def test_a_missed_notification_is_made_up_by_the_heartbeat(
    conn: Connection, make_worker: MakeWorker
) -> None:
    gate = Gate()
    handlers = Registry()

    @handlers.handler("t", args=Args)
    async def t(args: Args, job: JobContext) -> None:
        await gate.enter(job.id)

    worker = await make_worker(handlers)
    created = await enqueue(Job(job_type="t", arguments={"n": 1}))
    assert await worker.run_once() == 1
    await gate.wait_entered()
    # marked by hand: no notification is sent
    await conn.execute(
        "UPDATE job_running SET cancelled_at = $2 WHERE id = $1", created.id, clock.now()
    )
    assert worker.running == 1
    await worker.heartbeat()
    await worker.wait_idle()
    assert await state_of(conn, created.id) is JobState.CANCELLED


async def test_cancel_of_a_finished_or_unknown_job_is_refused(
    conn: Connection, make_worker: MakeWorker
) -> None:
    handlers = Registry()

    @handlers.handler("t", args=Args)
    async def t(args: Args, job: JobContext) -> None:
        if args.n == 2:
            raise RuntimeError("boom")

    worker = await make_worker(handlers)
    ok = await enqueue(Job(job_type="t", arguments={"n": 1}))
    bad = await enqueue(Job(job_type="t", arguments={"n": 2}, max_retries=0))
    assert await worker.run_once() == 2
    await worker.wait_idle()
    assert await state_of(conn, ok.id) is JobState.SUCCEEDED
    assert await state_of(conn, bad.id) is JobState.FAILED
    for job_id in (ok.id, bad.id):
        with pytest.raises(Conflict):
            await cancel_now(conn, job_id)
    with pytest.raises(NotFound):
        await cancel_now(conn, 10**12)
    assert await state_of(conn, ok.id) is JobState.SUCCEEDED  # unchanged


async def test_job_states_says_where_each_job_is(conn: Connection, make_worker: MakeWorker) -> None:
    gate = Gate()
    handlers = Registry()

    @handlers.handler("t", args=Args)
    async def t(args: Args, job: JobContext) -> None:
        if args.n == 1:
            raise RuntimeError("boom")
        if args.n == 3:
            await gate.enter(job.id)

    worker = await make_worker(handlers)
    dead = await enqueue(Job(job_type="t", arguments={"n": 1}, max_retries=0))
    ok = await enqueue(Job(job_type="t", arguments={"n": 2}))
    assert await worker.run_once() == 2
    await worker.wait_idle()
    running = await enqueue(Job(job_type="t", arguments={"n": 3}))
    assert await worker.run_once() == 1
    await gate.wait_entered()
    scheduled = await enqueue(Job(job_type="t", arguments={"n": 4}).runs_in(seconds=3600))
    cancelled = await enqueue(Job(job_type="t", arguments={"n": 5}).runs_in(seconds=3600))
    await cancel_now(conn, cancelled.id)
    ids = [dead.id, ok.id, running.id, scheduled.id, cancelled.id, 10**12]
    states = await job_states(conn, ids)
    gate.release()
    await worker.wait_idle()
    failed = states.pop(dead.id)
    assert (failed.state, failed.attempts) == (JobState.FAILED, 1)
    assert "boom" in (failed.last_error or "")
    assert states == {
        ok.id: JobStatus(JobState.SUCCEEDED, 1, None),
        running.id: JobStatus(JobState.RUNNING, 0, None),  # the attempt running is not counted
        scheduled.id: JobStatus(JobState.QUEUED, 0, None),
        cancelled.id: JobStatus(JobState.CANCELLED, 0, None),
    }  # 10**12: no such job
    assert await job_states(conn, []) == {}


async def test_a_cancelled_running_job_of_a_dead_worker_is_not_rescued_into_the_queue(
    conn: Connection, make_worker: MakeWorker
) -> None:
    gate = Gate()
    handlers = Registry()

    @handlers.handler("t", args=Args)
    async def t(args: Args, job: JobContext) -> None:
        await gate.enter(job.id)

    worker = await make_worker(handlers)
    created = await enqueue(Job(job_type="t", arguments={"n": 1}))
    assert await worker.run_once() == 1
    await gate.wait_entered()
    # mark it without telling the worker, then let its lease run out: the rescue ends it
    await conn.execute(
        "UPDATE job_running SET cancelled_at = $2, lease_expires_at = $2 WHERE id = $1",
        created.id,
        clock.now() - timedelta(seconds=1),
    )
    assert await worker.rescue() == 1
    assert await state_of(conn, created.id) is JobState.CANCELLED
    assert (await counts(conn))["job"] == 0
    gate.release()


# -- results -----------------------------------------------------------------------------------


async def test_a_result_is_stored_with_the_finished_job(
    conn: Connection, make_worker: MakeWorker
) -> None:
    handlers = Registry()

    class Out(BaseModel):
        at: datetime
        total: int

    @handlers.handler("t", args=Args)
    async def t(args: Args, job: JobContext) -> Out | None:
        if args.n == 0:
            return None
        return Out(at=datetime(2030, 1, 1, tzinfo=UTC), total=args.n * 2)

    worker = await make_worker(handlers)
    some = await enqueue(Job(job_type="t", arguments={"n": 21}))
    none = await enqueue(Job(job_type="t", arguments={"n": 0}))
    assert await worker.run_once() == 2
    await worker.wait_idle()
    job = await find(conn, some.id, now=clock.now())
    assert job is not None
    assert job.state is JobState.SUCCEEDED
    assert job.result == {"at": "2030-01-01T00:00:00Z", "total": 42}
    assert job.attempts == 1
    empty = await find(conn, none.id, now=clock.now())
    assert empty is not None
    assert (empty.state, empty.result) == (JobState.SUCCEEDED, None)


@pytest.mark.parametrize(
    ("returned", "error"),
    [
        (object(), "not JSON"),
        (float("nan"), "not JSON"),
        ("a\x00b", "NUL"),
        ("\ud800", "not JSON"),
        ("x" * 2000, "more than 1000"),
    ],
    ids=["object", "nan", "nul", "surrogate", "too-large"],
)
async def test_a_result_that_cannot_be_stored_fails_the_job_not_the_worker(
    conn: Connection, make_worker: MakeWorker, returned: object, error: str
) -> None:
    handlers = Registry()

    @handlers.handler("t", args=Args)
    async def t(args: Args, job: JobContext) -> object:
        return returned if args.n == 1 else {"fine": True}

    worker = await make_worker(handlers, max_result_bytes=1000)
    bad = await enqueue(Job(job_type="t", arguments={"n": 1}))
    good = await enqueue(Job(job_type="t", arguments={"n": 2}))
    assert await worker.run_once() == 2
    await worker.wait_idle()
    failed = await find(conn, bad.id, now=clock.now())
    assert failed is not None
    assert failed.state is JobState.FAILED
    assert failed.last_error is not None
    assert error in failed.last_error
    ok = await find(conn, good.id, now=clock.now())
    assert ok is not None
    assert ok.result == {"fine": True}


def test_result_json_says_why() -> None:
    assert result_json(None, 10) is None
    assert result_json([1, "é"], 100) == '[1, "é"]'
    assert result_json("a\\u0000", 100) == '"a\\\\u0000"'  # an escaped backslash is no NUL
    with pytest.raises(ResultError, match="more than 3"):
        result_json("long", 3)


async def test_each_failed_attempt_is_kept_with_its_error_and_traceback(
    conn: Connection, make_worker: MakeWorker
) -> None:
    handlers = Registry()

    def deep(n: int) -> None:
        raise RuntimeError(f"boom {n}\x00")  # a NUL: stored escaped

    @handlers.handler("t", args=Args)
    async def t(args: Args, job: JobContext) -> None:
        deep(job.attempt)

    worker = await make_worker(handlers, backoff_base=timedelta(0), backoff_max=timedelta(0))
    created = await enqueue(Job(job_type="t", arguments={"n": 1}, max_retries=1))
    for _ in range(2):
        assert await worker.run_once() == 1
        await worker.wait_idle()
    job = await find(conn, created.id, now=clock.now())
    assert job is not None
    assert job.state is JobState.FAILED
    assert [(a.attempt, a.error, a.worker_id) for a in job.failed_attempts] == [
        (1, "RuntimeError: boom 1\\x00", worker.id),
        (2, "RuntimeError: boom 2\\x00", worker.id),
    ]
    for failed in job.failed_attempts:
        assert failed.traceback is not None
        assert "in deep" in failed.traceback
        assert failed.traceback.rstrip().endswith(failed.error or "")


async def test_a_rescued_attempt_is_kept_as_a_failed_one(
    conn: Connection, make_worker: MakeWorker
) -> None:
    gate = Gate()
    handlers = Registry()

    @handlers.handler("t", args=Args)
    async def t(args: Args, job: JobContext) -> None:
        await gate.enter(job.id)

    worker = await make_worker(handlers)
    created = await enqueue(Job(job_type="t", arguments={"n": 1}))
    assert await worker.run_once() == 1
    await gate.wait_entered()
    await conn.execute(
        "UPDATE job_running SET lease_expires_at = $2 WHERE id = $1",
        created.id,
        clock.now() - timedelta(seconds=1),
    )
    assert await worker.rescue() == 1
    job = await find(conn, created.id, now=clock.now())
    assert job is not None
    assert [(a.attempt, a.error, a.traceback) for a in job.failed_attempts] == [
        (1, "worker lost while running the job", None)
    ]
    gate.release()


async def marked_awaited(conn: Connection, job_id: int) -> None:
    """Wait until `wait_for` has marked queued job `job_id` awaited (a claim skips the row
    while the mark holds its lock)."""

    async def marked() -> bool:
        found: bool = await conn.fetchval("SELECT awaited FROM job WHERE id = $1", job_id)
        return found

    await eventually(marked, what="the job to be marked awaited")


# -- waiting -----------------------------------------------------------------------------------


async def test_wait_for_is_woken_when_the_job_ends_and_returns_its_result(
    conn: Connection, make_worker: MakeWorker
) -> None:
    gate = Gate()
    handlers = Registry()

    @handlers.handler("t", args=Args)
    async def t(args: Args, job: JobContext) -> int:
        await gate.enter(job.id)
        return args.n + 1

    worker = await make_worker(handlers)
    created = await enqueue(Job(job_type="t", arguments={"n": 41}))
    waiting = asyncio.create_task(wait_for(created.id, 30))
    await marked_awaited(conn, created.id)
    assert await worker.run_once() == 1
    await gate.wait_entered()
    await asyncio.sleep(0.05)
    assert not waiting.done()
    gate.release()
    started = time.monotonic()
    await worker.wait_idle()
    assert await asyncio.wait_for(waiting, 5) == 42
    # woken by the notification, not by a poll or its 30 s timeout
    assert time.monotonic() - started < 5


async def test_wait_for_raises_the_failure_the_cancel_or_a_timeout(
    conn: Connection, make_worker: MakeWorker
) -> None:
    handlers = Registry()

    @handlers.handler("t", args=Args)
    async def t(args: Args, job: JobContext) -> None:
        raise RuntimeError(f"boom {args.n}")

    worker = await make_worker(handlers)
    doomed = await enqueue(Job(job_type="t", arguments={"n": 1}, max_retries=0))
    waiting = asyncio.create_task(wait_for(doomed.id, 30))
    await marked_awaited(conn, doomed.id)  # before the worker ends it
    assert await worker.run_once() == 1
    await worker.wait_idle()
    with pytest.raises(JobFailed, match="boom 1"):
        await asyncio.wait_for(waiting, 5)

    later = await enqueue(Job(job_type="t", arguments={"n": 2}).runs_in(seconds=3600))
    with pytest.raises(TimeoutError):
        await wait_for(later.id, 0.2)
    waiting = asyncio.create_task(wait_for(later.id, 30))
    await asyncio.sleep(0.05)
    assert await cancel_now(conn, later.id) is JobState.CANCELLED
    with pytest.raises(JobCancelled):
        await asyncio.wait_for(waiting, 5)
    with pytest.raises(NotFound):
        await wait_for(10**12, 1)


async def test_drain_waits_ends_the_waits_in_progress_and_those_that_start_later(
    conn: Connection, database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`drain_waits` (its server stops) ends a wait in progress at once, and a wait that starts
    later ends after its first look, even in a registry made after the drain (a request in flight
    at the signal, in a process that had no wait before): each returns the job as it is."""
    monkeypatch.setattr(Waiters, "draining", False)  # restored after the test
    monkeypatch.setattr(control, "_waiters", weakref.WeakKeyDictionary())
    later = await enqueue(Job(job_type="t", arguments={"n": 1}).runs_in(seconds=3600))
    waiting = asyncio.create_task(await_end(later.id, 600))
    await marked_awaited(conn, later.id)
    assert not waiting.done()
    drain_waits()
    # ended by the drain: its 600 s are far from up
    assert (await asyncio.wait_for(waiting, 60)).state is JobState.SCHEDULED
    await control.waiters(database).close()

    monkeypatch.setattr(control, "_waiters", weakref.WeakKeyDictionary())  # no registry yet
    view = await asyncio.wait_for(await_end(later.id, 600), 60)
    assert view.state is JobState.SCHEDULED
    await control.waiters(database).close()


# -- retention ---------------------------------------------------------------------------------


async def test_pruning_drops_whole_days_and_old_rows_of_the_default_partition(
    conn: Connection, database: Database
) -> None:
    now = clock.now()
    await prune_finished(database, now=now, retention=timedelta(days=7))
    names = {
        r[0]
        for r in await conn.fetch(
            "SELECT relname FROM pg_class WHERE relname LIKE 'job\\_%\\_p%' AND relkind = 'r'"
        )
    }
    today = now.astimezone(UTC).date()
    assert {partition_name(today + timedelta(days=d)) for d in (1, 2)} <= names
    assert {partition_name(today + timedelta(days=d), "job_attempt") for d in (1, 2)} <= names
    assert partition_name(today) not in names  # today's rows may be arriving in the default
    old_day = today - timedelta(days=10)
    await conn.execute(
        f"CREATE TABLE {partition_name(old_day)} PARTITION OF job_done FOR VALUES FROM "
        f"('{old_day.isoformat()}') TO ('{(old_day + timedelta(days=1)).isoformat()}')"
    )

    async def finished(job_id: int, at: datetime) -> None:
        await conn.execute(
            "INSERT INTO job_done (id, job_type, queue, arguments, state, attempts, created_at,"
            " finished_at) VALUES ($1, 't', 'default', '{}', 'succeeded', 1, $2, $2)",
            job_id,
            at,
        )

    far_past = datetime(2001, 1, 1, tzinfo=UTC)  # no partition: the default partition
    for i in range(12):
        await finished(i, far_past)
    await finished(100, datetime.combine(old_day, datetime.min.time(), UTC) + timedelta(hours=1))
    await finished(101, now)
    await finished(102, datetime(2001, 1, 1, tzinfo=UTC) + timedelta(days=365 * 40))  # future
    pruned = await prune_finished(database, now=now, retention=timedelta(days=7), batch=5)
    assert pruned == 12
    left = {r[0] for r in await conn.fetch("SELECT id FROM job_done")}
    assert left == {101, 102}
    assert await conn.fetchval("SELECT to_regclass($1)", partition_name(old_day)) is None
    assert (
        await conn.fetchval("SELECT tableoid::regclass::text FROM job_done WHERE id = 101")
        == "job_done_default"
    )


async def test_with_retention_off_finished_jobs_are_not_kept(
    conn: Connection, make_worker: MakeWorker
) -> None:
    handlers = Registry()

    @handlers.handler("t", args=Args)
    async def t(args: Args, job: JobContext) -> int:
        return 1

    worker = await make_worker(handlers, retention=timedelta(0))
    created = await enqueue(Job(job_type="t", arguments={"n": 1}))
    assert await worker.run_once() == 1
    await worker.wait_idle()
    assert worker.counts["completed"] == 1
    assert await find(conn, created.id, now=clock.now()) is None


async def test_a_finished_job_keeps_when_its_last_attempt_started(
    conn: Connection, make_worker: MakeWorker
) -> None:
    """`started_at` of a succeeded job (recorded by the next claim, or by the completer) and of
    a dead one: its last claim, so that finished_at - started_at is its run time; a job
    cancelled before it ran has none."""
    handlers = Registry()

    @handlers.handler("ok", args=Args)
    async def ok(args: Args, job: JobContext) -> None:
        await asyncio.sleep(0.05)

    @handlers.handler("bad", args=Args, max_retries=0)
    async def bad(args: Args, job: JobContext) -> None:
        raise RuntimeError("no")

    good = await enqueue(Job(job_type="ok", arguments={"n": 1}))
    dead = await enqueue(Job(job_type="bad", arguments={"n": 2}), handlers=handlers)
    never = await enqueue(Job(job_type="ok", arguments={"n": 3}).runs_in(seconds=3600))
    await cancel_now(conn, never.id)
    worker = await make_worker(handlers)

    async def finished() -> bool:
        await worker.run_once()
        await worker.wait_idle()
        return {await state_of(conn, good.id), await state_of(conn, dead.id)} == {
            JobState.SUCCEEDED,
            JobState.FAILED,
        }

    await eventually(finished, within=30, what="both jobs finished")
    seen = {j: await find(conn, j, now=clock.now()) for j in (good.id, dead.id, never.id)}
    for job_id in (good.id, dead.id):
        job = seen[job_id]
        assert job is not None
        assert job.started_at is not None
        assert job.finished_at is not None
        assert job.created_at <= job.started_at <= job.finished_at
    good_job = seen[good.id]
    assert good_job is not None
    assert good_job.finished_at
    assert good_job.started_at
    assert (good_job.finished_at - good_job.started_at).total_seconds() >= 0.05
    never_job = seen[never.id]
    assert never_job is not None
    assert never_job.started_at is None
