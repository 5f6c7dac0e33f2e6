"""`jobq.check` and `python -m jobq check`: the queue's invariants on a live database.

Each invariant is shown holding on real states (jobs queued, running under a live worker, dead)
and failing on rows inserted by hand to break it; the command exits 1 then, 0 otherwise.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from jobq import clock
from jobq.check import CheckReport, check
from jobq.db import Connection, Database
from jobq.errors import DontRetry
from jobq.queue import Job, JobContext, Registry, Worker, enqueue, metrics
from jobq.queue.leader.depth import take_depth_snapshot
from tests.toolkit.procs import jobq_check

MakeWorker = Callable[..., Awaitable[Worker]]
GRACE = timedelta(seconds=0.5)
"""Heartbeat grace of the checks: short, because for one grace after the server's start every
worker counts as alive (it may be reconnecting), and a test may run soon after that start."""


class NoArgs(BaseModel):
    pass


async def run_check(conn: Connection, **kwargs: Any) -> CheckReport:
    return await check(conn, now=clock.now(), heartbeat_grace=GRACE, **kwargs)


def broken(report: CheckReport) -> dict[str, list[int]]:
    """The invariants that failed, with their sample ids."""
    return {i.name: i.sample_job_ids for i in report.invariants if not i.ok}


async def insert_job(conn: Connection, job_id: int, *, attempts: int = 0, retries: int = 5) -> None:
    await conn.execute(
        "INSERT INTO job (id, job_type, arguments, ripe_at, attempts, max_retries, created_at)"
        " VALUES ($1, 'check.test', jsonb_build_object('id', $1::bigint), $2, $3, $4, $2)",
        job_id,
        clock.now(),
        attempts,
        retries,
    )


async def insert_running(
    conn: Connection,
    job_id: int,
    *,
    worker_id: int,
    lease_expires_at: datetime,
    claimed_at: datetime | None = None,
) -> None:
    now = clock.now()
    await conn.execute(
        "INSERT INTO job_running (id, job_type, arguments, ripe_at, priority, attempts,"
        " max_retries, created_at, worker_id, claimed_at, lease_expires_at, token)"
        " VALUES ($1, 'check.test', '{}', $2, 0, 0, 5, $2, $3, $4, $5,"
        " nextval('job_fencing_token'))",
        job_id,
        now,
        worker_id,
        claimed_at or now,
        lease_expires_at,
    )


async def insert_dead(conn: Connection, job_id: int) -> None:
    await conn.execute(
        "INSERT INTO job_dead (id, job_type, arguments, priority, attempts, max_retries,"
        " last_error, created_at, died_at) VALUES ($1, 'check.test', '{}', 0, 1, 0, 'x', $2, $2)",
        job_id,
        clock.now(),
    )


async def insert_dead_worker(conn: Connection, worker_id: int, *, heartbeat_at: datetime) -> None:
    """A worker row whose process has no session and no liveness lock: dead."""
    await conn.execute(
        "INSERT INTO worker (id, host, pid, started_at, heartbeat_at)"
        " VALUES ($1, 'no-such-host', 999999, $2, $2)",
        worker_id,
        heartbeat_at,
    )


# -- the report ---------------------------------------------------------------------------------


async def test_an_empty_queue_is_ok(conn: Connection) -> None:
    report = await run_check(conn)
    assert report.ok
    assert [(i.name, i.ok, i.violations) for i in report.invariants] == [
        ("one_place", True, 0),
        ("running_held", True, 0),
        ("attempts_within_limit", True, 0),
        ("limits_held", True, 0),
    ]
    assert report.counts.model_dump() == {
        "queued_ripe": 0,
        "queued_scheduled": 0,
        "running": 0,
        "running_lease_expired": 0,
        "dead": 0,
        "workers_alive": 0,
        "workers_dead": 0,
        "queued_counted_at": None,
    }


async def test_counts_per_state_of_a_working_queue(
    conn: Connection, make_worker: MakeWorker
) -> None:
    release = asyncio.Event()
    handlers = Registry()

    @handlers.handler("check.block", args=NoArgs)
    async def block(args: NoArgs, job: JobContext) -> None:
        await release.wait()

    @handlers.handler("check.bad", args=NoArgs)
    async def bad(args: NoArgs, job: JobContext) -> None:
        raise DontRetry("bad")

    worker = await make_worker(handlers)
    await enqueue(Job(job_type="check.bad"))
    assert await worker.run_once() == 1
    await worker.wait_idle()
    await enqueue(Job(job_type="check.block"))
    assert await worker.run_once() == 1
    await enqueue(Job(job_type="check.later", arguments={"n": 1}))
    await enqueue(Job(job_type="check.later", arguments={"n": 2}).runs_in(hours=1))
    await insert_dead_worker(conn, 9001, heartbeat_at=clock.now())
    try:
        report = await run_check(conn)
    finally:
        release.set()
        await worker.wait_idle()
    assert report.ok, broken(report)
    assert report.counts.model_dump() == {
        "queued_ripe": 1,
        "queued_scheduled": 1,
        "running": 1,
        "running_lease_expired": 0,
        "dead": 1,
        "workers_alive": 1,
        "workers_dead": 1,
        "queued_counted_at": None,
    }


async def test_past_the_live_count_the_queued_jobs_are_the_depth_snapshots(
    conn: Connection, database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue of ten million jobs would take seconds to count: past `LIVE_COUNT_MAX` queued
    jobs the check reports the last depth snapshot's counts and its time (with none yet, it
    counts); the invariants are still checked whole."""
    monkeypatch.setattr(metrics, "LIVE_COUNT_MAX", 2)
    for n in range(3):
        await enqueue(Job(job_type="check.many", arguments={"n": n}))
    counted = await run_check(conn)  # no snapshot yet
    assert (counted.counts.queued_ripe, counted.counts.queued_counted_at) == (3, None)
    at = clock.now()
    await take_depth_snapshot(database, now=at, interval=timedelta(0), retention=timedelta(days=7))
    await enqueue(Job(job_type="check.many", arguments={"n": 3}))
    await enqueue(Job(job_type="check.many", arguments={"n": 4}).runs_in(hours=1))
    await insert_job(conn, 99, attempts=3, retries=2)  # past its last attempt
    report = await run_check(conn)
    assert (report.counts.queued_ripe, report.counts.queued_scheduled) == (3, 0)
    assert report.counts.queued_counted_at == at
    assert broken(report) == {"attempts_within_limit": [99]}


# -- one_place ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "places", [("job", "job_dead"), ("job", "job_running"), ("job_running", "job_dead")]
)
async def test_a_job_in_two_places_fails(
    conn: Connection, make_worker: MakeWorker, places: tuple[str, str]
) -> None:
    worker = await make_worker(Registry())
    assert worker.id is not None
    worker_id = worker.id

    async def insert(place: str, job_id: int) -> None:
        if place == "job":
            await insert_job(conn, job_id)
        elif place == "job_dead":
            await insert_dead(conn, job_id)
        else:
            lease = clock.now() + timedelta(minutes=1)
            await insert_running(conn, job_id, worker_id=worker_id, lease_expires_at=lease)

    await insert_job(conn, 1)  # one job in its one place
    for place in places:
        await insert(place, 7)
    report = await run_check(conn)
    assert not report.ok
    assert broken(report) == {"one_place": [7]}
    (one_place,) = [i for i in report.invariants if i.name == "one_place"]
    assert one_place.violations == 1


# -- running_held -------------------------------------------------------------------------------


async def test_a_running_job_of_a_live_worker_is_held(
    conn: Connection, make_worker: MakeWorker
) -> None:
    worker = await make_worker(Registry())
    assert worker.id is not None
    # Claimed long ago, its lease extended by heartbeats: fine.
    long_ago = clock.now() - timedelta(hours=2)
    await insert_running(
        conn,
        1,
        worker_id=worker.id,
        claimed_at=long_ago,
        lease_expires_at=clock.now() + timedelta(seconds=30),
    )
    assert (await run_check(conn)).ok


async def test_a_dead_workers_running_job_fails_once_its_rescue_is_overdue(
    conn: Connection,
) -> None:
    now = clock.now()
    lease = now + timedelta(minutes=5)
    await insert_dead_worker(conn, 41, heartbeat_at=now - timedelta(seconds=10))
    await insert_running(conn, 1, worker_id=41, lease_expires_at=lease)
    # Died 10 s ago: the rescue may still come.
    report = await run_check(conn, rescue_grace=timedelta(seconds=60))
    assert report.ok, broken(report)
    assert (report.counts.workers_alive, report.counts.workers_dead) == (0, 1)

    await insert_dead_worker(conn, 42, heartbeat_at=now - timedelta(minutes=2))
    await insert_running(conn, 2, worker_id=42, lease_expires_at=lease)
    report = await run_check(conn, rescue_grace=timedelta(seconds=60))
    assert broken(report) == {"running_held": [2]}
    # The grace is the caller's.
    assert broken(await run_check(conn, rescue_grace=timedelta(seconds=5))) == {
        "running_held": [1, 2]
    }


async def test_a_running_job_whose_worker_row_is_gone_fails_once_overdue(
    conn: Connection,
) -> None:
    now = clock.now()
    lease = now + timedelta(minutes=5)
    await insert_running(conn, 1, worker_id=77, claimed_at=now, lease_expires_at=lease)
    await insert_running(
        conn, 2, worker_id=77, claimed_at=now - timedelta(minutes=2), lease_expires_at=lease
    )
    assert broken(await run_check(conn)) == {"running_held": [2]}


async def test_a_running_job_whose_lease_expired_fails_once_overdue(
    conn: Connection, make_worker: MakeWorker
) -> None:
    worker = await make_worker(Registry())  # alive: only the lease can make it overdue
    assert worker.id is not None
    now = clock.now()
    await insert_running(conn, 1, worker_id=worker.id, lease_expires_at=now - timedelta(seconds=5))
    report = await run_check(conn)
    assert report.ok, broken(report)
    assert report.counts.running_lease_expired == 1
    await insert_running(conn, 2, worker_id=worker.id, lease_expires_at=now - timedelta(minutes=2))
    assert broken(await run_check(conn)) == {"running_held": [2]}


# -- attempts_within_limit ----------------------------------------------------------------------


async def test_a_queued_job_past_its_last_attempt_fails(conn: Connection) -> None:
    await insert_job(conn, 1, attempts=2, retries=2)  # its last attempt is still to come
    assert (await run_check(conn)).ok
    await insert_job(conn, 2, attempts=3, retries=2)
    assert broken(await run_check(conn)) == {"attempts_within_limit": [2]}


# -- limits_held --------------------------------------------------------------------------------


async def test_more_running_than_a_concurrency_limit_fails(conn: Connection) -> None:
    await conn.execute(
        "INSERT INTO job_queue (name, max_running, max_running_per_key) VALUES ('lim', 3, 1)"
    )
    live = 7  # dead just now: its jobs' rescue is not overdue, so running_held holds
    await insert_dead_worker(conn, live, heartbeat_at=clock.now())
    lease = clock.now() + timedelta(minutes=5)
    for job_id, key in [(1, "a"), (2, "b"), (3, None)]:
        await insert_running(conn, job_id, worker_id=live, lease_expires_at=lease)
        await conn.execute(
            "UPDATE job_running SET queue = 'lim', concurrency_key = $2 WHERE id = $1", job_id, key
        )
    assert (await run_check(conn)).ok  # 3 running (the limit), one per key
    await insert_running(conn, 4, worker_id=live, lease_expires_at=lease)
    await conn.execute("UPDATE job_running SET queue = 'lim', concurrency_key = 'a' WHERE id = 4")
    # key a has 2 (limit 1), and the queue 4 (limit 3): every running job of it is over
    assert broken(await run_check(conn)) == {"limits_held": [1, 2, 3, 4]}


# -- python -m jobq check ---------------------------------------------------------------------

HEARTBEAT_S = 0.1
"""The heartbeat interval the command is given: a short grace (see GRACE)."""


@pytest.mark.slow
async def test_the_command_exits_0_when_the_invariants_hold_and_1_when_one_fails(
    conn: Connection, database_url: str
) -> None:
    await insert_job(conn, 1)
    code, report = await jobq_check(database_url, heartbeat_interval_s=HEARTBEAT_S)
    assert code == 0
    assert report["ok"] is True
    assert report["counts"]["queued_ripe"] == 1
    assert {i["name"]: i["ok"] for i in report["invariants"]} == {
        "one_place": True,
        "running_held": True,
        "attempts_within_limit": True,
        "limits_held": True,
    }

    await insert_dead(conn, 1)
    code, report = await jobq_check(database_url, heartbeat_interval_s=HEARTBEAT_S)
    assert code == 1
    assert report["ok"] is False
    (failed,) = [i for i in report["invariants"] if not i["ok"]]
    assert (failed["name"], failed["violations"], failed["sample_job_ids"]) == ("one_place", 1, [1])


@pytest.mark.slow
async def test_the_command_takes_the_rescue_grace(conn: Connection, database_url: str) -> None:
    now = clock.now()
    await insert_dead_worker(conn, 5, heartbeat_at=now - timedelta(seconds=30))
    await insert_running(conn, 1, worker_id=5, lease_expires_at=now + timedelta(minutes=5))
    assert (await jobq_check(database_url, heartbeat_interval_s=HEARTBEAT_S))[
        0
    ] == 0  # default grace: 60 s
    code, report = await jobq_check(
        database_url, "--rescue-grace-s", "10", heartbeat_interval_s=HEARTBEAT_S
    )
    assert code == 1
    assert [i["name"] for i in report["invariants"] if not i["ok"]] == ["running_held"]
