"""Transactional enqueue: a job commits or rolls back with the caller's own writes."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

from jobq import db
from jobq.db import Connection, Database, transaction, write_transaction
from jobq.queue import Job, JobContext, Registry, enqueue, enqueue_many
from tests.queue.helpers import MakeWorker, count


class Args(BaseModel):
    n: int = 0


class Boom(Exception):
    pass


@pytest.fixture
async def notes(conn: Connection) -> Connection:
    """An application table of the test's own: `note (body text)`, empty."""
    await conn.execute("CREATE TABLE IF NOT EXISTS queue_test_note (body text NOT NULL)")
    await conn.execute("TRUNCATE queue_test_note")
    return conn


async def enqueue_in_transaction(n: int, *, fail: bool) -> None:
    """Enqueue a `noop` job in a transaction (joined when one is in progress); raise `Boom`
    at its end when `fail`."""
    async with transaction():
        await enqueue(Job(job_type="noop", arguments={"n": n}))
        if fail:
            raise Boom


async def test_rollback_leaves_no_job(conn: Connection) -> None:
    async def enqueue_then_fail() -> None:
        async with transaction():
            result = await enqueue(Job(job_type="noop", arguments={"n": 1}))
            await enqueue_many([Job(job_type="noop", arguments={"n": 2})])
            # visible inside the transaction, not outside it
            assert await db.conn().fetchval("SELECT count(*) FROM job") == 2
            assert await count(conn, "job") == 0
            assert result.id > 0
            raise Boom

    with pytest.raises(Boom):
        await enqueue_then_fail()
    assert await count(conn, "job") == 0


async def test_commit_keeps_the_jobs_and_the_callers_writes(notes: Connection) -> None:
    conn = notes
    async with transaction() as tx_conn:
        await tx_conn.execute("INSERT INTO queue_test_note VALUES ('ann')")
        result = await enqueue(Job(job_type="noop", arguments={"n": 1}))
        assert await count(conn, "job") == 0
    assert await conn.fetchval("SELECT array_agg(id) FROM job") == [result.id]
    assert await conn.fetchval("SELECT count(*) FROM queue_test_note") == 1


async def test_write_transaction_rolls_back_both(notes: Connection) -> None:
    conn = notes

    @write_transaction
    async def sign_up(fail: bool) -> None:
        await db.conn().execute("INSERT INTO queue_test_note VALUES ('bob')")
        await enqueue(Job(job_type="welcome", arguments={"email": "bob-tx@example.com"}))
        if fail:
            raise Boom

    with pytest.raises(Boom):
        await sign_up(True)
    assert await count(conn, "job") == 0
    assert await conn.fetchval("SELECT count(*) FROM queue_test_note") == 0
    await sign_up(False)
    assert await count(conn, "job") == 1
    assert await conn.fetchval("SELECT count(*) FROM queue_test_note") == 1


async def test_nested_transaction_is_a_savepoint(conn: Connection) -> None:
    async with transaction() as outer:
        async with transaction() as inner:
            assert inner is outer  # joined, not a second connection
            await enqueue(Job(job_type="noop", arguments={"n": 1}))
        with pytest.raises(Boom):
            await enqueue_in_transaction(2, fail=True)
        await enqueue(Job(job_type="noop", arguments={"n": 3}))
        assert await count(conn, "job") == 0
    stored = await conn.fetch("SELECT arguments FROM job ORDER BY id")
    assert [r["arguments"] for r in stored] == [{"n": 1}, {"n": 3}]


async def test_outer_rollback_undoes_a_committed_savepoint(conn: Connection) -> None:
    async def commit_inner_fail_outer() -> None:
        async with transaction():
            await enqueue_in_transaction(1, fail=False)
            assert await count(conn, "job") == 0
            raise Boom

    with pytest.raises(Boom):
        await commit_inner_fail_outer()
    assert await count(conn, "job") == 0


async def test_one_notification_per_transaction_and_none_on_rollback(
    database: Database, conn: Connection
) -> None:
    received: list[str] = []
    arrived = asyncio.Event()

    def on_notify(*args: object) -> None:
        received.append(str(args[2]))
        arrived.set()

    await conn.add_listener("jobq", on_notify)
    try:
        with pytest.raises(Boom):
            await enqueue_in_transaction(0, fail=True)
        async with transaction():
            for n in range(1, 4):
                await enqueue(Job(job_type="noop", arguments={"n": n}))
            await enqueue_many([Job(job_type="noop", arguments={"n": n}) for n in range(4, 9)])
            await enqueue(Job(job_type="noop", arguments={"n": 1}))  # a duplicate
        async with asyncio.timeout(2):
            await arrived.wait()
        await conn.fetchval("SELECT 1")  # any further notification would be in by now
        assert len(received) == 1
        assert await count(conn, "job") == 8
    finally:
        await conn.remove_listener("jobq", on_notify)


async def test_job_tasks_start_in_a_clean_context(
    conn: Connection, make_worker: MakeWorker
) -> None:
    """A claim made inside a transaction must not hand that connection to the job tasks."""
    inherited: list[object] = []
    job_conns: list[object] = []
    handlers = Registry()

    @handlers.handler("ctx", args=Args)
    async def ctx(args: Args, job: JobContext) -> None:
        inherited.append(db.current_transaction())
        async with transaction() as job_conn:
            job_conns.append(job_conn)
            await job_conn.fetchval("SELECT 1")

    await enqueue_many([Job(job_type="ctx", arguments={"n": n}) for n in range(2)])
    worker = await make_worker(handlers)
    async with transaction() as request_conn:
        assert await worker.run_once() == 2
        await worker.wait_idle()
        outer = request_conn
    assert worker.counts["completed"] == 2
    assert inherited == [None, None]
    assert len(job_conns) == 2
    assert outer not in job_conns
    assert await count(conn, "job") == 0
