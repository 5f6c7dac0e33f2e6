"""The races of workflows and sequences, on several real connections, each step held open so
that the two sides meet in the order the test chooses (not by timing): the last two jobs a
callback waits for ending at once move it into the queue exactly once, in either order of
their commits and through either statement that records ends; an enqueue into a sequence and
the end of the sequence's last job, whichever locks first, leave the new job waiting for an
end still to come or in the queue, never waiting forever.

The trigger that tells ends to the jobs waiting for them runs at the commit (a deferred
constraint trigger); a transaction that the test holds open runs it at its statement instead
(`SET CONSTRAINTS ... IMMEDIATE`, `tell_now`), so that it holds the locks it took while the
other side comes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from jobq import clock, db
from jobq.db import Connection, Database
from jobq.queue import Job, enqueue_batch, enqueue_in_sequence, store
from jobq.queue.control import JobState, find
from jobq.queue.model import ClaimedJob, Outcome, Verdict
from tests.queue.helpers import wait_for_lock_waiter


@pytest.fixture
async def second(database: Database) -> AsyncIterator[Connection]:
    """Another connection of its own (a second worker's)."""
    c = await db.connect(database.direct_dsn)
    yield c
    await c.close()


async def claim_all(conn: Connection, worker_id: int) -> list[ClaimedJob]:
    now = clock.now()
    return await store.claim(
        conn,
        worker_id=worker_id,
        max_jobs=100,
        now=now,
        lease_expires_at=now + timedelta(seconds=60),
    )


async def tell_now(conn: Connection) -> None:
    """In the transaction in progress on `conn`: tell ends at each statement, not at the
    commit."""
    await conn.execute("SET CONSTRAINTS job_running_flow_tell IMMEDIATE")


async def where(conn: Connection, job_id: int) -> JobState:
    job = await find(conn, job_id, now=clock.now())
    assert job is not None
    return job.state


@pytest.mark.parametrize("through", ["record", "claim"])
async def test_the_last_two_jobs_ending_at_once_move_the_callback_into_the_queue_once(
    database: Database, conn: Connection, second: Connection, through: str
) -> None:
    batch = await enqueue_batch(
        [Job(job_type="x", arguments={"n": n}) for n in range(2)],
        callback=Job(job_type="callback"),
    )
    assert batch.callback_id is not None
    one, two = await claim_all(conn, worker_id=1)
    done = [Outcome(j.token, Verdict.COMPLETE, result="1") for j in (one, two)]

    # worker 1's end counts the callback down to 1, and holds its row until it commits
    tx = conn.transaction()
    await tx.start()
    await tell_now(conn)
    assert await store.record(conn, done[:1], now=clock.now()) == {one.token}
    assert (
        await conn.fetchval(
            "SELECT remaining FROM job_waiting WHERE job_id = $1", batch.callback_id
        )
        == 1
    )

    # worker 2's end of the other job, at the same instant, waits for that row
    async def end_two() -> None:
        if through == "record":
            await store.record(second, done[1:], now=clock.now())
        else:  # a claim that records its worker's successes
            now = clock.now()
            await store.record_and_claim(
                second, done[1:], worker_id=2, max_jobs=0, now=now, lease_expires_at=now
            )

    ending = asyncio.create_task(end_two())
    await wait_for_lock_waiter(conn)
    assert await conn.fetchval("SELECT count(*) FROM job WHERE id = $1", batch.callback_id) == 0
    await tx.commit()
    await ending

    # it read the row as worker 1 left it (1), counted it down to 0, and moved the callback
    assert await where(conn, batch.callback_id) is JobState.QUEUED
    assert await conn.fetchval("SELECT count(*) FROM job_waiting") == 0
    assert await conn.fetchval("SELECT count(*) FROM job") == 1


async def test_a_job_that_ends_after_a_callback_moved_changes_nothing(
    database: Database, conn: Connection, second: Connection
) -> None:
    """Two transactions both end a callback's dependencies while the first has not committed;
    the first rolls back: the second counts from the row as it was, and the callback still
    waits for the job whose end was rolled back."""
    batch = await enqueue_batch(
        [Job(job_type="x", arguments={"n": n}) for n in range(2)],
        callback=Job(job_type="callback"),
    )
    assert batch.callback_id is not None
    one, two = await claim_all(conn, worker_id=1)
    tx = conn.transaction()
    await tx.start()
    await tell_now(conn)
    await store.record(conn, [Outcome(one.token, Verdict.COMPLETE)], now=clock.now())
    ending = asyncio.create_task(
        store.record(second, [Outcome(two.token, Verdict.COMPLETE)], now=clock.now())
    )
    await wait_for_lock_waiter(conn)
    await tx.rollback()
    await ending
    assert await where(conn, batch.callback_id) is JobState.WAITING
    assert await where(conn, one.id) is JobState.RUNNING
    assert (
        await conn.fetchval(
            "SELECT remaining FROM job_waiting WHERE job_id = $1", batch.callback_id
        )
        == 1
    )


async def test_an_enqueue_into_a_sequence_that_locks_first_is_seen_by_the_end_of_its_last_job(
    database: Database, conn: Connection, second: Connection
) -> None:
    first = await enqueue_in_sequence("account:7", Job(job_type="x", arguments={"n": 1}))
    (running,) = await claim_all(conn, worker_id=1)
    assert running.id == first

    # an enqueue of the key, not committed yet, holds the last job's job_flow row
    db.bind(database)
    async with db.transaction():
        following = await enqueue_in_sequence("account:7", Job(job_type="x", arguments={"n": 2}))
        ending = asyncio.create_task(
            store.record(second, [Outcome(running.token, Verdict.COMPLETE)], now=clock.now())
        )
        await wait_for_lock_waiter(conn)  # the end waits for the enqueue's commit ...
        assert not ending.done()
    await ending
    assert await where(conn, following) is JobState.QUEUED  # ... then sees the job it moves


async def test_an_end_that_locks_first_is_seen_by_an_enqueue_into_the_sequence(
    database: Database, conn: Connection, second: Connection
) -> None:
    first = await enqueue_in_sequence("account:8", Job(job_type="x", arguments={"n": 1}))
    (running,) = await claim_all(conn, worker_id=1)
    assert running.id == first

    # the end of the last job, not committed yet, holds its job_flow row
    tx = second.transaction()
    await tx.start()
    await tell_now(second)
    await store.record(second, [Outcome(running.token, Verdict.COMPLETE)], now=clock.now())
    db.bind(database)
    enqueuing = asyncio.create_task(
        enqueue_in_sequence("account:8", Job(job_type="x", arguments={"n": 2}))
    )
    await wait_for_lock_waiter(conn)  # the enqueue waits for the end's commit ...
    await tx.commit()
    following = await enqueuing
    assert await where(conn, following) is JobState.QUEUED  # ... and sees the job ended


async def test_a_sequence_holds_its_next_job_through_a_retry_and_releases_it_after_a_failure(
    database: Database, conn: Connection
) -> None:
    first = await enqueue_in_sequence("k", Job(job_type="x", max_retries=1))
    following = await enqueue_in_sequence("k", Job(job_type="x", arguments={"n": 2}))
    other = await enqueue_in_sequence("other", Job(job_type="x", arguments={"n": 3}))
    claimed = await claim_all(conn, worker_id=1)
    assert {j.id for j in claimed} == {first, other}  # another key is never held back
    (job,) = [j for j in claimed if j.id == first]
    now = clock.now()
    await store.record(conn, [Outcome(job.token, Verdict.RETRY, ripe_at=now, error="e")], now=now)
    assert await where(conn, following) is JobState.WAITING  # a retrying job holds its sequence
    (job,) = await claim_all(conn, worker_id=1)
    await store.record(conn, [Outcome(job.token, Verdict.BURY, error="dead")], now=clock.now())
    assert await where(conn, first) is JobState.FAILED
    assert await where(conn, following) is JobState.QUEUED  # its end, failed, frees the next


async def test_an_end_is_told_at_its_commit_and_rolls_back_with_it(
    database: Database, conn: Connection, second: Connection
) -> None:
    batch = await enqueue_batch(
        [Job(job_type="x", arguments={"n": n}) for n in range(2)],
        callback=Job(job_type="callback"),
    )
    assert batch.callback_id is not None
    one, two = await claim_all(conn, worker_id=1)
    remaining = "SELECT remaining FROM job_waiting WHERE job_id = $1"
    for commit in (False, True):
        tx = conn.transaction()
        await tx.start()
        await store.record(conn, [Outcome(one.token, Verdict.COMPLETE)], now=clock.now())
        assert await conn.fetchval(remaining, batch.callback_id) == 2  # told at the commit
        if commit:
            await tx.commit()
        else:
            await tx.rollback()
            assert await conn.fetchval(remaining, batch.callback_id) == 2
    assert await conn.fetchval(remaining, batch.callback_id) == 1
    await store.record(second, [Outcome(two.token, Verdict.COMPLETE)], now=clock.now())
    assert await where(conn, batch.callback_id) is JobState.QUEUED


async def test_the_ends_of_one_transaction_are_told_together_at_its_commit(
    database: Database, conn: Connection
) -> None:
    """Ends recorded by several statements of one transaction are told at its commit, all at
    once (the trigger runs once per transaction): a job released and claimed again in it has not
    ended, and an end rolled back to a savepoint is not told."""
    batch = await enqueue_batch(
        [Job(job_type="x", arguments={"n": n}) for n in range(4)],
        callback=Job(job_type="callback"),
    )
    assert batch.callback_id is not None
    one, two, three, four = await claim_all(conn, worker_id=1)
    remaining = "SELECT remaining FROM job_waiting WHERE job_id = $1"
    async with conn.transaction():
        savepoint = conn.transaction()
        await savepoint.start()
        await store.record(conn, [Outcome(one.token, Verdict.COMPLETE)], now=clock.now())
        await savepoint.rollback()
        ends = [Outcome(two.token, Verdict.COMPLETE), Outcome(three.token, Verdict.RELEASE)]
        await store.record(conn, ends, now=clock.now())
        now = clock.now()
        claimed = await store.record_and_claim(
            conn,
            [Outcome(four.token, Verdict.COMPLETE)],
            worker_id=1,
            max_jobs=1,
            now=now,
            lease_expires_at=now + timedelta(seconds=60),
        )
        assert [j.id for j in claimed.jobs] == [three.id]
        assert await conn.fetchval(remaining, batch.callback_id) == 4
    assert await conn.fetchval(remaining, batch.callback_id) == 2
    assert await where(conn, one.id) is JobState.RUNNING
    assert await where(conn, three.id) is JobState.RUNNING
    outcomes = await conn.fetch(
        "SELECT job_id, outcome FROM job_flow WHERE job_id = ANY($1::bigint[])",
        [one.id, two.id, three.id, four.id],
    )
    # A claim returns its jobs in no promised order: each outcome is matched by its job's id.
    assert {r["job_id"]: r["outcome"] for r in outcomes} == {
        one.id: None,
        two.id: "succeeded",
        three.id: None,
        four.id: "succeeded",
    }
