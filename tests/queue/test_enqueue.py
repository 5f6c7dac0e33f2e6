"""Enqueue and dedup: at most one queued job per (job_type, arguments), and never a wait."""

from __future__ import annotations

import asyncio
import contextvars
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import BaseModel, ValidationError

from jobq import clock
from jobq.db import Connection, Database, transaction
from jobq.queue import Enqueued, Job, JobContext, Registry, enqueue, enqueue_many
from tests.queue.helpers import Gate, MakeWorker, count, counts, row, wait_for_lock_waiter


class Args(BaseModel):
    n: int


async def test_enqueue_stores_the_job(conn: Connection) -> None:
    ripe_at = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    result = await enqueue(
        Job(job_type="mail.send", arguments={"to": "a@b.c"}, priority=7, max_retries=3).runs_at(
            ripe_at
        )
    )
    assert result == Enqueued(id=result.id, duplicate=False)
    stored = await row(conn, "job", result.id)
    assert stored is not None
    assert stored["job_type"] == "mail.send"
    assert stored["arguments"] == {"to": "a@b.c"}
    assert stored["ripe_at"] == ripe_at
    assert stored["priority"] == 7
    assert stored["attempts"] == 0
    assert stored["max_retries"] == 3
    assert stored["last_error"] is None


async def test_immediate_job_is_ripe_at_enqueue_time(conn: Connection) -> None:
    before = clock.now()
    result = await enqueue(Job(job_type="noop"))
    stored = await row(conn, "job", result.id)
    assert stored is not None
    assert before <= stored["ripe_at"] <= clock.now()


async def test_duplicate_returns_the_first_job(conn: Connection) -> None:
    first = await enqueue(Job(job_type="noop", arguments={"n": 1, "s": "x"}))
    # same arguments in another key order: the same job
    second = await enqueue(Job(job_type="noop", arguments={"s": "x", "n": 1}, priority=5))
    assert first.duplicate is False
    assert second == Enqueued(id=first.id, duplicate=True)
    assert await count(conn, "job") == 1
    other_args = await enqueue(Job(job_type="noop", arguments={"n": 2, "s": "x"}))
    other_type = await enqueue(Job(job_type="noop2", arguments={"n": 1, "s": "x"}))
    assert not other_args.duplicate
    assert not other_type.duplicate
    assert len({first.id, other_args.id, other_type.id}) == 3
    assert await count(conn, "job") == 3


async def test_duplicate_of_a_running_job_is_queued_without_waiting(
    conn: Connection, make_worker: MakeWorker
) -> None:
    gate = Gate()
    handlers = Registry()

    @handlers.handler("hold", args=Args)
    async def hold(args: Args, job: JobContext) -> None:
        await gate.enter(job.id)

    first = await enqueue(Job(job_type="hold", arguments={"n": 1}))
    worker = await make_worker(handlers)
    assert await worker.run_once() == 1
    await gate.wait_entered()
    assert await row(conn, "job_running", first.id) is not None

    async with asyncio.timeout(2):
        second = await enqueue(Job(job_type="hold", arguments={"n": 1}))
    assert second.duplicate is False
    assert second.id != first.id
    assert await row(conn, "job", second.id) is not None
    assert await row(conn, "job_running", first.id) is not None

    # and a third one is a duplicate of the queued second
    async with asyncio.timeout(2):
        third = await enqueue(Job(job_type="hold", arguments={"n": 1}))
    assert third == Enqueued(id=second.id, duplicate=True)

    gate.release()
    await worker.wait_idle()
    assert await counts(conn) == {"job": 1, "job_running": 0, "job_dead": 0}


async def test_duplicate_of_a_failing_running_job_leaves_one_queued(
    conn: Connection, make_worker: MakeWorker
) -> None:
    """The running job fails while its twin is queued: the twin stays queued (at most one
    queued copy) and the failed job's end is recorded as merged into it (nothing lost)."""
    gate = Gate()
    handlers = Registry()

    @handlers.handler("hold", args=Args)
    async def hold(args: Args, job: JobContext) -> None:
        await gate.enter(job.id)
        raise RuntimeError("boom")

    first = await enqueue(Job(job_type="hold", arguments={"n": 1}))
    worker = await make_worker(handlers)
    assert await worker.run_once() == 1
    await gate.wait_entered()
    second = await enqueue(Job(job_type="hold", arguments={"n": 1}))
    assert not second.duplicate
    assert second.id != first.id
    gate.release()
    await worker.wait_idle()
    assert await counts(conn) == {"job": 1, "job_running": 0, "job_dead": 1}
    assert await conn.fetchval("SELECT id FROM job") == second.id
    merged = await conn.fetchrow(
        "SELECT attempts, last_error FROM job_dead WHERE id = $1", first.id
    )
    assert merged is not None
    assert merged["attempts"] == 1
    assert merged["last_error"] == f"merged into queued duplicate job {second.id}"
    assert worker.counts["rejected"] == 0


async def enqueue_noop() -> Enqueued:
    return await enqueue(Job(job_type="noop", arguments={"n": 1}))


async def test_duplicate_of_an_uncommitted_twin_is_reported_once_it_commits(
    database: Database, conn: Connection
) -> None:
    """A concurrent identical enqueue in an open transaction: once it commits, the second
    enqueue returns its id as a duplicate (the retry after the unique-index wait)."""
    clean = contextvars.copy_context()
    inserted = asyncio.Event()
    commit = asyncio.Event()

    async def first_tx() -> Enqueued:
        async with transaction():
            result = await enqueue(Job(job_type="noop", arguments={"n": 1}))
            inserted.set()
            await commit.wait()
        return result

    first_task = asyncio.get_running_loop().create_task(first_tx(), context=clean.copy())
    await inserted.wait()
    second_task = asyncio.get_running_loop().create_task(enqueue_noop(), context=clean.copy())
    await wait_for_lock_waiter(conn)  # the second waits on the first's index entry
    commit.set()
    async with asyncio.timeout(5):
        first, second = await asyncio.gather(first_task, second_task)
    assert first.duplicate is False
    assert second == Enqueued(id=first.id, duplicate=True)
    assert await count(conn, "job") == 1


async def test_duplicate_of_a_rolled_back_twin_is_inserted(
    database: Database, conn: Connection
) -> None:
    clean = contextvars.copy_context()
    inserted = asyncio.Event()
    roll_back = asyncio.Event()

    async def first_tx() -> None:
        async with transaction():
            await enqueue(Job(job_type="noop", arguments={"n": 1}))
            inserted.set()
            await roll_back.wait()
            raise LookupError("roll back")

    first_task = asyncio.get_running_loop().create_task(first_tx(), context=clean.copy())
    await inserted.wait()
    second_task = asyncio.get_running_loop().create_task(enqueue_noop(), context=clean.copy())
    await wait_for_lock_waiter(conn)
    roll_back.set()
    async with asyncio.timeout(5):
        with pytest.raises(LookupError):
            await first_task
        second = await second_task
    assert second.duplicate is False
    stored = await row(conn, "job", second.id)
    assert stored is not None
    assert await count(conn, "job") == 1


async def test_enqueue_many_skips_duplicates(conn: Connection) -> None:
    queued = await enqueue(Job(job_type="noop", arguments={"n": 1, "k": [1, 2]}))
    ids = await enqueue_many(
        [
            Job(job_type="noop", arguments={"k": [1, 2], "n": 1}),  # duplicate of a queued job
            Job(job_type="noop", arguments={"n": 2}),
            Job(job_type="noop", arguments={"n": 3}),
            Job(job_type="noop", arguments={"n": 3}),  # duplicate within the batch
            Job(job_type="other", arguments={"n": 3}),
        ]
    )
    assert len(ids) == 3
    assert queued.id not in ids
    assert await count(conn, "job") == 4
    stored = await conn.fetch("SELECT job_type, arguments FROM job ORDER BY id")
    assert [(r["job_type"], r["arguments"]) for r in stored] == [
        ("noop", {"n": 1, "k": [1, 2]}),
        ("noop", {"n": 2}),
        ("noop", {"n": 3}),
        ("other", {"n": 3}),
    ]
    # a single enqueue of something enqueue_many queued is a duplicate
    again = await enqueue(Job(job_type="noop", arguments={"n": 2}))
    assert again.duplicate
    assert again.id in ids


async def test_enqueue_many_stores_every_field(conn: Connection) -> None:
    ripe_at = datetime(2032, 1, 1, 12, 0, 0, 1, tzinfo=UTC)
    (job_id,) = await enqueue_many(
        [Job(job_type="noop", arguments={"n": 1}, priority=-3, max_retries=0).runs_at(ripe_at)]
    )
    stored = await row(conn, "job", job_id)
    assert stored is not None
    assert stored["arguments"] == {"n": 1}
    assert stored["ripe_at"] == ripe_at
    assert stored["priority"] == -3
    assert stored["max_retries"] == 0
    assert await enqueue_many([]) == []


def test_job_validation() -> None:
    with pytest.raises(ValidationError):
        Job(job_type="Bad Type")
    with pytest.raises(ValidationError):
        Job(job_type="noop", ripe_at=datetime(2030, 1, 1))  # naive
    with pytest.raises(ValidationError):
        Job(job_type="noop", priority=40000)
    with pytest.raises(ValidationError):
        Job(job_type="noop", max_retries=-1)
    with pytest.raises(ValueError, match="aware"):
        Job(job_type="noop").runs_at(datetime(2030, 1, 1))


def test_runs_in_is_relative_to_the_clock() -> None:
    before = clock.now()
    job = Job(job_type="noop").runs_in(minutes=5)
    assert before + timedelta(minutes=5) <= job.ripe_at <= clock.now() + timedelta(minutes=5)
