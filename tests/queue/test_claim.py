"""The claim: ripe jobs only (by the app clock), priority then ripe_at, never over free slots."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from freezegun import freeze_time
from pydantic import BaseModel

from jobq import clock
from jobq.db import Connection, Database
from jobq.queue import Job, JobContext, Registry, enqueue, metrics, store
from tests import outcomes
from tests.queue.helpers import Gate, MakeWorker, count, counts, row

T0 = datetime(2030, 6, 1, 12, 0, tzinfo=UTC)
LEASE = timedelta(seconds=30)


class Args(BaseModel):
    n: int = 0


def recording(seen: list[int]) -> Registry:
    handlers = Registry()

    @handlers.handler("noop", args=Args)
    async def noop(args: Args, job: JobContext) -> None:
        seen.append(job.id)

    return handlers


async def test_job_due_in_an_hour_is_claimed_at_its_ripe_at(
    conn: Connection, make_worker: MakeWorker
) -> None:
    seen: list[int] = []
    worker = await make_worker(recording(seen))
    with freeze_time(T0, real_asyncio=True) as frozen:
        job = await enqueue(Job(job_type="noop").runs_in(hours=1))
        assert await worker.run_once() == 0
        frozen.move_to(T0 + timedelta(minutes=59))
        assert await worker.run_once() == 0
        frozen.move_to(T0 + timedelta(minutes=60) - timedelta(microseconds=1))
        assert await worker.run_once() == 0
        assert await row(conn, "job", job.id) is not None
        frozen.move_to(T0 + timedelta(minutes=60))
        assert await worker.run_once() == 1
        await worker.wait_idle()
    assert seen == [job.id]
    assert await counts(conn) == {"job": 0, "job_running": 0, "job_dead": 0}


async def test_next_ripe_at_is_the_earliest_future_job(conn: Connection) -> None:
    with freeze_time(T0, real_asyncio=True):
        assert await store.next_ripe_at(conn, now=T0) is None
        await enqueue(Job(job_type="noop", arguments={"n": 1}))  # ripe now: not in the future
        await enqueue(Job(job_type="noop", arguments={"n": 2}).runs_in(minutes=9))
        await enqueue(Job(job_type="noop", arguments={"n": 3}).runs_in(minutes=3))
        assert await store.next_ripe_at(conn, now=T0) == T0 + timedelta(minutes=3)
        assert await store.next_ripe_at(conn, now=T0 + timedelta(minutes=3)) == T0 + timedelta(
            minutes=9
        )
        assert await store.next_ripe_at(conn, now=T0 + timedelta(minutes=9)) is None


@pytest.mark.parametrize("limits", [True, False])
async def test_claim_order_is_priority_then_ripe_at(conn: Connection, limits: bool) -> None:
    spec = {  # n: (priority, ripe_at offset in seconds)
        1: (0, -30),
        2: (5, -10),
        3: (5, -20),
        4: (-1, -100),
        5: (0, -40),
        6: (100, +10),  # highest priority but not ripe
    }
    with freeze_time(T0, real_asyncio=True):
        for n, (priority, offset) in spec.items():
            await enqueue(
                Job(job_type="noop", arguments={"n": n}, priority=priority).runs_at(
                    T0 + timedelta(seconds=offset)
                )
            )
        order = []
        while claimed := await store.claim(
            conn, worker_id=1, max_jobs=1, now=T0, lease_expires_at=T0 + LEASE, limits=limits
        ):
            order.append(claimed[0].arguments["n"])
    assert order == [3, 2, 5, 1, 4]
    assert await count(conn, "job") == 1
    assert await count(conn, "job_running") == 5


async def test_claim_moves_rows_with_a_new_token(conn: Connection) -> None:
    created = await enqueue(Job(job_type="noop", arguments={"n": 1}, priority=2, max_retries=4))
    before = await row(conn, "job", created.id)
    assert before is not None
    now = clock.now()
    (claimed,) = await store.claim(
        conn, worker_id=42, max_jobs=10, now=now, lease_expires_at=now + LEASE
    )
    assert claimed.id == created.id
    assert claimed.arguments == {"n": 1}
    assert claimed.attempts == 0
    assert claimed.max_retries == 4
    assert claimed.claimed_at == now
    assert await row(conn, "job", created.id) is None
    running = await row(conn, "job_running", created.id)
    assert running is not None
    assert running["worker_id"] == 42
    assert running["token"] == claimed.token
    assert running["lease_expires_at"] == now + LEASE
    for column in ("job_type", "arguments", "ripe_at", "priority", "created_at"):
        assert running[column] == before[column]

    # a new claim of the same job after a release gets a new token
    assert await outcomes.release(conn, claimed.token, now=now)
    (again,) = await store.claim(conn, worker_id=42, max_jobs=1, now=now, lease_expires_at=now)
    assert again.id == created.id
    assert again.token != claimed.token


async def test_claim_takes_at_most_max_jobs(conn: Connection) -> None:
    for n in range(7):
        await enqueue(Job(job_type="noop", arguments={"n": n}))
    now = clock.now()
    first = await store.claim(conn, worker_id=1, max_jobs=3, now=now, lease_expires_at=now)
    second = await store.claim(conn, worker_id=1, max_jobs=3, now=now, lease_expires_at=now)
    third = await store.claim(conn, worker_id=1, max_jobs=3, now=now, lease_expires_at=now)
    assert (len(first), len(second), len(third)) == (3, 3, 1)
    assert len({j.id for j in first + second + third}) == 7
    assert len({j.token for j in first + second + third}) == 7


async def test_claim_skips_rows_locked_by_another_claim(
    database: Database, conn: Connection
) -> None:
    for n in range(5):
        await enqueue(Job(job_type="noop", arguments={"n": n}))
    now = clock.now()
    async with conn.transaction():  # a claim in progress, not committed yet
        mine = await store.claim(conn, worker_id=1, max_jobs=2, now=now, lease_expires_at=now)
        async with database.pool.acquire() as other, asyncio.timeout(2):
            theirs = await store.claim(
                other, worker_id=2, max_jobs=10, now=now, lease_expires_at=now
            )
    assert len(mine) == 2
    assert len(theirs) == 3
    assert not {j.id for j in mine} & {j.id for j in theirs}
    assert await count(conn, "job_running") == 5


async def test_worker_claims_only_its_free_slots(conn: Connection, make_worker: MakeWorker) -> None:
    gate = Gate()
    handlers = Registry()

    @handlers.handler("hold", args=Args)
    async def hold(args: Args, job: JobContext) -> None:
        await gate.enter(job.id)

    for n in range(10):
        await enqueue(Job(job_type="hold", arguments={"n": n}))
    worker = await make_worker(handlers, max_concurrent_jobs=4)
    # concurrent rounds must not count the same free slots twice
    claimed = await asyncio.gather(*(worker.run_once() for _ in range(3)))
    assert sum(claimed) == 4
    assert worker.free_slots == 0
    assert await worker.run_once() == 0
    await gate.wait_entered(4)
    assert await count(conn, "job_running") == 4
    assert await count(conn, "job") == 6
    gate.release()
    await worker.wait_idle()
    assert worker.free_slots == 4
    assert await worker.run_once() == 4
    await worker.wait_idle()
    assert await worker.run_once() == 2
    await worker.wait_idle()
    assert worker.counts["claimed"] == 10
    assert worker.counts["completed"] == 10
    assert await counts(conn) == {"job": 0, "job_running": 0, "job_dead": 0}


async def test_stats_count_each_state_per_job_type(conn: Connection) -> None:
    with freeze_time(T0, real_asyncio=True):
        for n in range(3):
            await enqueue(Job(job_type="a", arguments={"n": n}, priority=1))
        await enqueue(Job(job_type="a", arguments={"n": 9}).runs_in(minutes=5))
        await enqueue(Job(job_type="b", arguments={"n": 1}))
        await enqueue(Job(job_type="b", arguments={"n": 2}))
        running = await store.claim(conn, worker_id=1, max_jobs=2, now=T0, lease_expires_at=T0)
        assert [j.job_type for j in running] == ["a", "a"]
        claimed = await store.claim(conn, worker_id=1, max_jobs=10, now=T0, lease_expires_at=T0)
        for job in claimed:
            if job.job_type == "b" and job.arguments["n"] == 1:
                assert await outcomes.bury(conn, job.token, now=T0, error="x")
            else:
                assert await outcomes.release(conn, job.token, now=T0)
        stats, counted_at = await metrics.stats(conn, now=T0)
    assert counted_at is None  # counted now: a small queue
    assert stats == [
        {"job_type": "a", "ripe": 1, "scheduled": 1, "running": 2, "dead": 0},
        {"job_type": "b", "ripe": 1, "scheduled": 0, "running": 0, "dead": 1},
    ]
