"""The metrics' parts, in this process: what is counted where (and what is not), the flush into
`job_counter` and `job_histogram` (sums over processes), the depth snapshot and its election."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import asyncpg
import pytest
from freezegun import freeze_time
from pydantic import BaseModel

from jobq import clock, db
from jobq.db import Connection, Database
from jobq.errors import Snooze
from jobq.queue import Job, JobContext, Registry, control, enqueue, enqueue_many, metrics, sql
from jobq.queue.leader import depth
from jobq.queue.metrics import BOUNDS, Tally
from tests.queue.helpers import MakeWorker
from tests.toolkit.procs import eventually

if TYPE_CHECKING:  # generic only in asyncpg-stubs
    RecordConnection = asyncpg.Connection[asyncpg.Record]
else:
    RecordConnection = asyncpg.Connection


class Args(BaseModel):
    n: int = 0


async def counters(conn: Connection) -> dict[tuple[str, str, str], int]:
    rows = await conn.fetch("SELECT queue, job_type, event, count FROM job_counter")
    return {(r["queue"], r["job_type"], r["event"]): r["count"] for r in rows}


def test_observations_are_folded_at_the_latest_when_there_are_many() -> None:
    tally = Tally()
    for _ in range(metrics.FOLD_AT + 1):
        tally.observe("q", "t", "pickup_lag", 0.2)
    assert len(tally.observed[("q", "t", "pickup_lag")]) == 1  # the others are buckets now
    _, histograms = tally.take()
    assert histograms[("q", "t", "pickup_lag")].buckets[BOUNDS.index(0.25)] == metrics.FOLD_AT + 1


def test_an_observation_goes_to_the_first_bucket_whose_bound_it_does_not_pass() -> None:
    tally = Tally()
    for seconds in (0.001, 0.0011, -1.0, 1e9):
        tally.observe("q", "t", "run_time", seconds)
    counts, histograms = tally.take()
    assert counts == {}
    histogram = histograms[("q", "t", "run_time")]
    assert histogram.buckets[0] == 2  # 0.001 (le is inclusive) and -1 (clamped at 0)
    assert histogram.buckets[1] == 1  # 0.0011 <= 0.0025
    assert histogram.buckets[len(BOUNDS)] == 1  # +Inf
    assert histogram.sum == pytest.approx(0.001 + 0.0011 + 1e9)


async def test_a_rolled_back_enqueue_counts_nothing(database: Database, conn: Connection) -> None:
    async def rolled_back() -> None:
        async with db.transaction():
            await enqueue(Job(job_type="t", arguments={"n": 1}, queue="default"))
            assert metrics.tally.counts == {}  # not before the commit
            raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        await rolled_back()
    async with db.transaction():
        await enqueue(Job(job_type="t", arguments={"n": 2}))
        await enqueue(Job(job_type="t", arguments={"n": 2}))  # a duplicate: no new job
    await enqueue_many([Job(job_type="u", arguments={"n": n}) for n in range(3)])
    assert await metrics.flush(database) == 2
    assert await counters(conn) == {
        ("default", "t", "enqueued"): 1,
        ("default", "u", "enqueued"): 3,
    }


async def test_flushes_of_several_processes_add_up_and_an_idle_one_writes_nothing(
    database: Database, conn: Connection
) -> None:
    a, b = Tally(), Tally()
    a.count("q", "t", "succeeded", 2)
    a.observe("q", "t", "run_time", 0.003)
    b.count("q", "t", "succeeded", 3)
    b.count("q", "t", "failed")
    b.observe("q", "t", "run_time", 7.0)
    await asyncio.gather(metrics.flush(database, a), metrics.flush(database, b))
    assert await counters(conn) == {("q", "t", "succeeded"): 5, ("q", "t", "failed"): 1}
    row = await conn.fetchrow("SELECT bounds, buckets, sum FROM job_histogram")
    assert row is not None
    assert row["bounds"] == list(BOUNDS)
    assert sum(row["buckets"]) == 2
    assert row["buckets"][BOUNDS.index(0.005)] == 1
    assert row["buckets"][BOUNDS.index(30.0)] == 1
    assert row["sum"] == pytest.approx(7.003)

    before = await conn.fetchval("SELECT xmin::text FROM job_counter LIMIT 1")
    assert await metrics.flush(database, a) == 0
    assert await conn.fetchval("SELECT xmin::text FROM job_counter LIMIT 1") == before


async def test_a_failed_flush_keeps_the_counts_for_the_next(
    database: Database, conn: Connection
) -> None:
    tally = Tally()
    tally.count("q", "t", "succeeded", 2)
    tally.count("q", "t", "exploded")  # not an event: the table refuses the whole flush
    with pytest.raises(asyncpg.CheckViolationError):
        await metrics.flush(database, tally)
    assert await counters(conn) == {}
    assert tally.counts[("q", "t", "succeeded")] == 2
    del tally.counts[("q", "t", "exploded")]
    assert await metrics.flush(database, tally) == 1
    assert await counters(conn) == {("q", "t", "succeeded"): 2}


async def test_the_worker_counts_starts_and_recorded_outcomes(
    database: Database, make_worker: MakeWorker
) -> None:
    handlers = Registry()
    snoozed: set[int] = set()

    @handlers.handler("ok", args=Args)
    async def ok(args: Args, job: JobContext) -> None:
        if args.n == 1 and job.id not in snoozed:
            snoozed.add(job.id)
            raise Snooze(0)

    @handlers.handler("bad", args=Args, max_retries=1)
    async def bad(args: Args, job: JobContext) -> None:
        raise ValueError("bad")

    worker = await make_worker(handlers, backoff_base=timedelta(0), backoff_jitter=0)
    await enqueue_many([Job(job_type="ok", arguments={"n": n}) for n in (0, 1)])
    await enqueue(Job(job_type="bad", max_retries=1))
    for _ in range(3):
        await worker.run_once()
        await worker.wait_idle()
    counts, histograms = metrics.tally.take()
    assert counts[("default", "ok", "enqueued")] == 2
    assert counts[("default", "ok", "started")] == 3
    assert counts[("default", "ok", "snoozed")] == 1
    assert counts[("default", "ok", "succeeded")] == 2
    assert counts[("default", "bad", "started")] == 2
    assert counts[("default", "bad", "retried")] == 1
    assert counts[("default", "bad", "failed")] == 1
    lag = histograms[("default", "ok", "pickup_lag")]
    assert sum(lag.buckets) == 3
    run_time = histograms[("default", "bad", "run_time")]
    assert sum(run_time.buckets) == 2


async def test_a_schedules_occurrences_count_as_enqueued(
    database: Database, make_worker: MakeWorker
) -> None:
    handlers = Registry()

    @handlers.periodic(every=timedelta(seconds=4))
    @handlers.handler("tick", args=Args)
    async def tick(args: Args, job: JobContext) -> None:
        pass

    with freeze_time(datetime(2030, 6, 1, 12, 0, tzinfo=UTC), real_asyncio=True):
        worker = await make_worker(handlers)
        assert await worker.enqueue_scheduled() == 2  # at 12:00:04 and :08, within 10 s
    assert metrics.tally.counts[("default", "tick", "enqueued")] == 2


async def test_a_cancel_counts_once_it_commits(database: Database, conn: Connection) -> None:
    job = await enqueue(Job(job_type="t"))

    async def rolled_back() -> None:
        async with db.transaction() as tx:
            await control.cancel(tx, job.id, now=clock.now(), retain=True)
            raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        await rolled_back()
    assert metrics.tally.counts[("default", "t", "cancelled")] == 0
    async with db.transaction() as tx:
        await control.cancel(tx, job.id, now=clock.now(), retain=True)
        await control.cancel(tx, job.id, now=clock.now(), retain=True)  # changes nothing
    assert metrics.tally.counts[("default", "t", "cancelled")] == 1


async def test_the_depth_snapshot_counts_ripe_scheduled_and_held_jobs(
    database: Database, conn: Connection, make_worker: MakeWorker
) -> None:
    handlers = Registry()
    handlers.queue("capped", max_running=1)
    handlers.queue("keyed", max_running_per_key=1)
    release = asyncio.Event()

    @handlers.handler("t", args=Args)
    async def t(args: Args, job: JobContext) -> None:
        await release.wait()

    worker = await make_worker(handlers)
    await enqueue_many(
        [Job(job_type="t", arguments={"n": n}, queue="capped") for n in range(3)]
        + [Job(job_type="t", arguments={"n": 9}, queue="capped").runs_in(hours=1)]
        + [
            Job(job_type="t", arguments={"n": n}, queue="keyed", concurrency_key=k)
            for n, k in ((3, "a"), (4, "a"), (5, "b"))
        ]
    )
    assert await worker.run_once() == 3  # one of capped, one of each key
    taken = await depth.take_depth_snapshot(
        database, now=clock.now(), interval=timedelta(seconds=5), retention=timedelta(days=7)
    )
    release.set()
    assert taken == 3  # default, capped, keyed
    rows = await conn.fetch("SELECT queue, ripe, scheduled, held FROM job_depth ORDER BY queue")
    assert {r["queue"]: (r["ripe"], r["scheduled"], r["held"]) for r in rows} == {
        "capped": (2, 1, 2),
        "default": (0, 0, 0),
        "keyed": (1, 0, 1),
    }
    # the same pass counts per job type too (what /jobs/stats reads of a big queue)
    rows = await conn.fetch("SELECT queue, job_type, ripe, scheduled FROM job_type_depth")
    assert {(r["queue"], r["job_type"]): (r["ripe"], r["scheduled"]) for r in rows} == {
        ("capped", "t"): (2, 1),
        ("keyed", "t"): (1, 0),
    }


async def test_one_process_takes_the_snapshot_per_interval_or_slower(database: Database) -> None:
    now = clock.now()
    interval = timedelta(seconds=5)

    async def take(at_s: float) -> int:
        return await depth.take_depth_snapshot(
            database, now=now + timedelta(seconds=at_s), interval=interval, retention=interval
        )

    # exactly one, however the four interleave (the next test forces the worst interleaving)
    assert sorted(await asyncio.gather(*(take(0) for _ in range(4)))) == [0, 0, 0, 1]
    assert await take(1) == 0  # fresh still
    assert await take(3) == 1  # older than half an interval
    # a count that took a second (a big queue) is taken again 20 seconds later at the soonest
    async with database.pool.acquire() as conn:
        await conn.execute("UPDATE job_depth SET took_s = 1")
    assert await take(3 + 19) == 0
    assert await take(3 + 21) == 1


GATE = (4242, 1)
"""An advisory lock (no jobq lock's) that a test holds to stop a taker's election in its tracks."""


class Paused(RecordConnection):
    """A connection whose statements, before they try the metrics lock, wait at `GATE` (a
    shared lock: they pass once the test releases it). The wait comes after the statement has
    begun, so after its snapshot: the pause a busy machine may put a process in at that very
    place."""

    async def fetchval(
        self,
        query: str,
        *args: object,
        column: int = 0,
        timeout: float | None = None,  # noqa: ASYNC109 (asyncpg's)
    ) -> Any:
        lock = "pg_try_advisory_xact_lock("
        gated = query.replace(lock, f"pg_advisory_xact_lock_shared{GATE} IS NOT NULL AND {lock}")
        return await super().fetchval(gated, *args, column=column, timeout=timeout)


async def test_a_taker_whose_election_began_before_a_snapshot_committed_does_not_take_it(
    database: Database, conn: Connection
) -> None:
    # The late taker's election begins (its first statement's snapshot is taken) and stops at
    # the gate; the first taker is elected, takes a snapshot and commits, which releases the
    # metrics lock; then the late one goes on, and the lock is free. Judged by what its first
    # statement saw, there is no snapshot: the freshness check must read the database as of
    # after the lock was taken, when the first taker's snapshot is there to see.
    now, fresh_for = clock.now(), timedelta(seconds=5)
    first = await db.connect(database.direct_dsn)
    late: Paused = await asyncpg.connect(database.direct_dsn, connection_class=Paused)

    async def waiting_at_gate() -> bool:
        return bool(
            await conn.fetchval(
                "SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory'"
                " AND classid = $1 AND objid = $2 AND objsubid = 2 AND NOT granted)",
                *GATE,
            )
        )

    try:
        await conn.execute("SELECT pg_advisory_lock($1, $2)", *GATE)
        async with late.transaction():
            electing = asyncio.create_task(depth.elect(late, now=now, fresh_for=fresh_for))
            await eventually(waiting_at_gate, what="the late taker waiting at the gate")
            async with first.transaction():
                assert await depth.elect(first, now=now, fresh_for=fresh_for)
                assert await sql.job_depth_take.execute(first, now=now) == "INSERT 0 1"
            await conn.execute("SELECT pg_advisory_unlock($1, $2)", *GATE)
            assert await electing is False
    finally:
        await late.close()
        await first.close()
