"""Uniqueness made explicit (`jobq.queue.model.Unique`): each mode and conflict policy, per
handler and per enqueue, and concurrent enqueues of one key on several real connections."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from pydantic import BaseModel, ValidationError

from jobq import clock, db
from jobq.db import Connection, Database
from jobq.errors import DuplicateJob
from jobq.queue import Job, JobContext, Registry, enqueue, enqueue_many
from jobq.queue.leader.prune import prune_finished
from jobq.queue.model import ALLOW_DUPLICATES, Unique
from tests.queue.helpers import MakeWorker


class Args(BaseModel):
    n: int = 0


async def ripe_at_of(conn: Connection, job_id: int) -> object:
    return await conn.fetchval("SELECT ripe_at FROM job WHERE id = $1", job_id)


async def queued(conn: Connection) -> int:
    count: int = await conn.fetchval("SELECT count(*) FROM job")
    return count


async def test_by_default_an_earlier_twin_hastens_the_queued_job_instead_of_waiting(
    conn: Connection,
) -> None:
    next_week = await enqueue(Job(job_type="t", arguments={"n": 1}).runs_in(hours=24 * 7))
    now = Job(job_type="t", arguments={"n": 1})
    again = await enqueue(now)
    assert (again.id, again.duplicate) == (next_week.id, True)
    assert await ripe_at_of(conn, next_week.id) == now.ripe_at  # not postponed a week
    # a later twin changes nothing
    later = await enqueue(Job(job_type="t", arguments={"n": 1}).runs_in(hours=1))
    assert later.duplicate
    assert await ripe_at_of(conn, next_week.id) == now.ripe_at
    assert await queued(conn) == 1


async def test_keep_raise_and_none(conn: Connection) -> None:
    keep = Unique(on_conflict="keep")
    in_an_hour = Job(job_type="t", arguments={"n": 1}, unique=keep).runs_in(hours=1)
    first = await enqueue(in_an_hour)
    twin = await enqueue(Job(job_type="t", arguments={"n": 1}, unique=keep))
    assert (twin.id, twin.duplicate) == (first.id, True)
    assert await ripe_at_of(conn, first.id) == in_an_hour.ripe_at  # kept its own time

    with pytest.raises(DuplicateJob) as raised:
        await enqueue(Job(job_type="t", arguments={"n": 1}, unique=Unique(on_conflict="raise")))
    assert raised.value.data == {"job_id": first.id}

    a = await enqueue(Job(job_type="t", arguments={"n": 2}, unique=ALLOW_DUPLICATES))
    b = await enqueue(Job(job_type="t", arguments={"n": 2}, unique=ALLOW_DUPLICATES))
    assert a.id != b.id
    assert (a.duplicate, b.duplicate) == (False, False)
    assert await queued(conn) == 3


async def test_an_explicit_key_makes_different_arguments_one_job_within_a_type(
    conn: Connection,
) -> None:
    by_key = Unique(key="user:7")
    first = await enqueue(Job(job_type="sync", arguments={"n": 1}, unique=by_key))
    second = await enqueue(Job(job_type="sync", arguments={"n": 2}, unique=by_key))
    assert (second.id, second.duplicate) == (first.id, True)
    other_type = await enqueue(Job(job_type="other", arguments={"n": 1}, unique=by_key))
    assert not other_type.duplicate


async def test_a_handler_declares_its_jobs_uniqueness(conn: Connection) -> None:
    handlers = Registry()

    @handlers.handler("free", args=Args, unique=ALLOW_DUPLICATES)
    async def free(args: Args, job: JobContext) -> None:
        return None

    one = await enqueue(Job(job_type="free", arguments={"n": 1}), handlers=handlers)
    two = await enqueue(Job(job_type="free", arguments={"n": 1}), handlers=handlers)
    assert one.id != two.id
    # an enqueue's own choice wins over its handler's
    three = await enqueue(
        Job(job_type="free", arguments={"n": 1}, unique=Unique(key="k")), handlers=handlers
    )
    four = await enqueue(
        Job(job_type="free", arguments={"n": 5}, unique=Unique(key="k")), handlers=handlers
    )
    assert (four.id, four.duplicate) == (three.id, True)


async def test_active_counts_a_running_twin_and_frees_the_key_when_it_ends(
    conn: Connection, make_worker: MakeWorker
) -> None:
    gate = asyncio.Event()
    started = asyncio.Event()
    handlers = Registry()

    @handlers.handler("t", args=Args)
    async def t(args: Args, job: JobContext) -> None:
        started.set()
        await gate.wait()

    active = Unique(among="active")
    first = await enqueue(Job(job_type="t", arguments={"n": 1}, unique=active))
    worker = await make_worker(handlers)
    assert await worker.run_once() == 1
    await started.wait()
    while_running = await enqueue(Job(job_type="t", arguments={"n": 1}, unique=active))
    assert (while_running.id, while_running.duplicate) == (first.id, True)
    # the `queued` default would not have seen it
    assert not (await enqueue(Job(job_type="t", arguments={"n": 1}))).duplicate
    gate.set()
    await worker.wait_idle()
    after = await enqueue(Job(job_type="t", arguments={"n": 1}, unique=active))
    assert not after.duplicate
    assert after.id != first.id


async def test_period_holds_the_key_after_the_job_ended_until_the_period_is_over(
    conn: Connection, database: Database, make_worker: MakeWorker
) -> None:
    handlers = Registry()

    @handlers.handler("t", args=Args)
    async def t(args: Args, job: JobContext) -> None:
        return None

    hourly = Unique(among="period", period=timedelta(hours=1))
    first = await enqueue(Job(job_type="t", arguments={"n": 1}, unique=hourly))
    worker = await make_worker(handlers)
    assert await worker.run_once() == 1
    await worker.wait_idle()
    again = await enqueue(Job(job_type="t", arguments={"n": 1}, unique=hourly))
    assert (again.id, again.duplicate) == (first.id, True)
    # an hour on, the key is free; the pruner forgets it
    await conn.execute("UPDATE job_unique SET until = until - interval '61 minutes'")
    await prune_finished(database, now=clock.now(), retention=timedelta(days=7))
    assert await conn.fetchval("SELECT count(*) FROM job_unique") == 0
    later = await enqueue(Job(job_type="t", arguments={"n": 1}, unique=hourly))
    assert not later.duplicate
    with pytest.raises(ValidationError):
        Unique(among="period")
    with pytest.raises(ValidationError):
        Unique(period=timedelta(hours=1))


@pytest.mark.parametrize("among", ["queued", "active", "period"])
async def test_concurrent_enqueues_of_one_key_make_one_job(
    conn: Connection, database: Database, among: str
) -> None:
    """Ten transactions on ten connections enqueue the same key at once: one job, nine
    duplicates naming it."""
    unique = Unique(
        among=among,
        key="shared",
        period=timedelta(hours=1) if among == "period" else None,
    )
    ready = asyncio.Barrier(10)

    async def one(n: int) -> tuple[int, bool]:
        async with db.transaction():  # a connection and transaction of this task's own
            await ready.wait()
            enqueued = await enqueue(Job(job_type="t", arguments={"n": n}, unique=unique))
            await asyncio.sleep(0.01)  # hold the transaction open a little
            return enqueued.id, enqueued.duplicate

    results = await asyncio.gather(*(one(n) for n in range(10)))
    new = [job_id for job_id, duplicate in results if not duplicate]
    assert len(new) == 1
    assert {job_id for job_id, _ in results} == set(new)
    assert await queued(conn) == 1


async def test_enqueue_many_keeps_the_earliest_twin_of_a_batch_and_hastens_queued_ones(
    conn: Connection,
) -> None:
    queued_job = await enqueue(Job(job_type="t", arguments={"n": 1}).runs_in(hours=5))
    soon = Job(job_type="t", arguments={"n": 1}).runs_in(hours=1)
    later = Job(job_type="t", arguments={"n": 2, "m": 0}).runs_in(hours=2)
    sooner = Job(job_type="t", arguments={"m": 0, "n": 2}).runs_in(minutes=1)  # keys reordered
    ids = await enqueue_many([soon, later, sooner])
    assert len(ids) == 1  # n=1 is a duplicate; the two n=2 are one job
    assert await ripe_at_of(conn, queued_job.id) == soon.ripe_at
    assert await ripe_at_of(conn, ids[0]) == sooner.ripe_at
    with pytest.raises(ValueError, match="one by one"):
        await enqueue_many([Job(job_type="t", unique=Unique(among="active"))])
