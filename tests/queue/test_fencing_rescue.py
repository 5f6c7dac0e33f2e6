"""Fencing and rescue: a dead worker's jobs come back at once, a hung worker's when its lease
expires, and a stale worker can change nothing about a job that was rescued."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Literal

import pytest
from freezegun import freeze_time
from pydantic import BaseModel, ValidationError

from jobq import clock
from jobq.__main__ import main as jobq_main
from jobq.db import Connection
from jobq.queue import DontRetry, Job, JobContext, Registry, Worker, enqueue, store
from tests import outcomes
from tests.conftest import make_settings
from tests.queue.conftest import NewWorker
from tests.queue.helpers import Gate, MakeWorker, count, counts, row, where
from tests.toolkit.procs import eventually

T0 = datetime(2030, 6, 1, 12, 0, tzinfo=UTC)
LEASE = timedelta(seconds=5)  # settings.lease in the tests
GRACE = timedelta(seconds=1)
LOST = "worker lost while running the job"


class Args(BaseModel):
    outcome: str = "complete"


def gated(gate: Gate) -> Registry:
    """A handler that waits at the gate, then does what its arguments say."""
    handlers = Registry()

    @handlers.handler("gated", args=Args)
    async def run(args: Args, job: JobContext) -> None:
        await gate.enter(job.id)
        if args.outcome == "fail":
            raise RuntimeError("failed late")
        if args.outcome == "bury":
            raise DontRetry("buried late")

    return handlers


async def kill_listener(worker: Worker, conn: Connection, how: str) -> None:
    """Make `worker` look dead to the others: its listener session (and lock) ends, and its
    process has no session left. A test cannot end its own process, so the worker's row is
    pointed at a pid with no session (what the rescue sees when a process dies)."""
    listener = worker.listener.conn
    assert listener is not None
    if how == "close":
        await listener.close()
    else:
        pid = listener.get_server_pid()
        assert await conn.fetchval("SELECT pg_terminate_backend($1, 5000)", pid)
    await conn.execute("UPDATE worker SET pid = 0 WHERE id = $1", worker.id)


async def test_stale_token_changes_nothing(conn: Connection) -> None:
    created = await enqueue(Job(job_type="noop", max_retries=3))
    now = clock.now()
    # worker 901 holds no liveness lock: the rescue sees it as dead
    (stale,) = await store.claim(
        conn, worker_id=901, max_jobs=1, now=now, lease_expires_at=now + LEASE
    )
    assert await store.rescue(conn, now=now, heartbeat_grace=GRACE) == 1
    (fresh,) = await store.claim(
        conn, worker_id=902, max_jobs=1, now=now, lease_expires_at=now + LEASE
    )
    assert fresh.id == stale.id == created.id
    assert fresh.token != stale.token
    assert fresh.attempts == 1
    before = await row(conn, "job_running", created.id)

    assert await outcomes.complete(conn, [stale.token]) == 0
    assert await outcomes.retry(conn, stale.token, ripe_at=now, error="stale", now=now) is False
    assert await outcomes.bury(conn, stale.token, now=now, error="stale") is False
    assert await outcomes.release(conn, stale.token, now=now) is False

    assert await row(conn, "job_running", created.id) == before
    assert await counts(conn) == {"job": 0, "job_running": 1, "job_dead": 0}
    assert await outcomes.complete(conn, [stale.token, fresh.token]) == 1
    assert await counts(conn) == {"job": 0, "job_running": 0, "job_dead": 0}


async def test_outcome_verbs_with_the_right_token(conn: Connection) -> None:
    for n in range(3):
        await enqueue(Job(job_type="noop", arguments={"n": n}, max_retries=3))
    now = clock.now()
    a, b, c = sorted(
        await store.claim(conn, worker_id=1, max_jobs=3, now=now, lease_expires_at=now),
        key=lambda j: j.arguments["n"],
    )
    ripe_at = now + timedelta(minutes=1)
    assert await outcomes.retry(conn, a.token, ripe_at=ripe_at, error="E1", now=now)
    assert await outcomes.bury(conn, b.token, now=now, error="E2")
    assert await outcomes.release(conn, c.token, now=now)
    ra, rc = await row(conn, "job", a.id), await row(conn, "job", c.id)
    rb = await row(conn, "job_dead", b.id)
    assert ra is not None
    assert rb is not None
    assert rc is not None
    assert (ra["attempts"], ra["last_error"], ra["ripe_at"]) == (1, "E1", ripe_at)
    assert (rb["attempts"], rb["last_error"], rb["died_at"]) == (1, "E2", now)
    # a release keeps the job's place in the queue: its own ripe_at (before now)
    assert c.ripe_at < now
    assert (rc["attempts"], rc["last_error"], rc["ripe_at"]) == (0, None, c.ripe_at)
    # every verb works once: the token is spent
    assert not await outcomes.retry(conn, a.token, ripe_at=ripe_at, error="again", now=now)
    assert await count(conn, "job_running") == 0


@pytest.mark.parametrize("outcome", ["complete", "fail", "bury", "release"])
async def test_stale_worker_outcome_is_rejected(
    conn: Connection,
    make_worker: MakeWorker,
    outcome: Literal["complete", "fail", "bury", "release"],
) -> None:
    gate_a, gate_b = Gate(), Gate()
    worker_a = await make_worker(gated(gate_a))
    worker_b = await make_worker(gated(gate_b))
    with freeze_time(T0, real_asyncio=True) as frozen:
        created = await enqueue(Job(job_type="gated", arguments={"outcome": outcome}))
        assert await worker_a.run_once() == 1
        await gate_a.wait_entered()
        # worker A is connected but hung: its lease runs out
        frozen.move_to(T0 + LEASE - timedelta(microseconds=1))
        assert await worker_b.rescue() == 0
        frozen.move_to(T0 + LEASE + timedelta(microseconds=1))
        assert await worker_b.rescue() == 1
        queued = await row(conn, "job", created.id)
        assert queued is not None
        assert queued["attempts"] == 1
        assert queued["last_error"] == LOST
        assert queued["ripe_at"] == T0  # its own: it keeps its place in the queue
        assert await worker_b.run_once() == 1
        await gate_b.wait_entered()
        running = await row(conn, "job_running", created.id)
        assert running is not None
        assert running["worker_id"] == worker_b.id

        # A wakes up and reports: nothing changes
        if outcome == "release":
            await worker_a.abort()
        else:
            gate_a.release()
            await worker_a.wait_idle()
        assert worker_a.counts["rejected"] == 1
        assert worker_a.counts["completed"] + worker_a.counts["retried"] == 0
        assert worker_a.counts["buried"] + worker_a.counts["released"] == 0
        assert await row(conn, "job_running", created.id) == running
        assert await counts(conn) == {"job": 0, "job_running": 1, "job_dead": 0}

        gate_b.release()
        await worker_b.wait_idle()
    assert worker_b.counts["rejected"] == 0
    expected = {
        "complete": [],
        "fail": ["job"],
        "bury": ["job_dead"],
        "release": [],  # B completes: only A released
    }[outcome]
    assert await where(conn, created.id) == expected


async def test_live_worker_keeps_its_jobs_while_it_heartbeats(
    conn: Connection, make_worker: MakeWorker
) -> None:
    gate = Gate()
    worker_a = await make_worker(gated(gate))
    worker_b = await make_worker(gated(Gate()))
    with freeze_time(T0, real_asyncio=True) as frozen:
        created = await enqueue(Job(job_type="gated"))
        assert await worker_a.run_once() == 1
        await gate.wait_entered()
        assert await worker_b.rescue() == 0
        frozen.move_to(T0 + timedelta(seconds=4))
        assert await worker_a.heartbeat() == 1
        running = await row(conn, "job_running", created.id)
        assert running is not None
        assert running["lease_expires_at"] == T0 + timedelta(seconds=4) + LEASE
        frozen.move_to(T0 + timedelta(seconds=8))  # past the first lease, within the second
        assert await worker_b.rescue() == 0
        assert await worker_a.rescue() == 0
        assert await worker_b.run_once() == 0
        frozen.move_to(T0 + timedelta(seconds=9, microseconds=1))
        assert await worker_b.rescue() == 1
    gate.release()
    await worker_a.wait_idle()
    assert worker_a.counts["rejected"] == 1


@pytest.mark.parametrize("how", ["close", "terminate"])
async def test_dead_worker_jobs_return_at_once(
    conn: Connection, make_worker: MakeWorker, how: str
) -> None:
    gate = Gate()
    worker_a = await make_worker(gated(gate))
    worker_b = await make_worker(gated(Gate()))
    created = await enqueue(Job(job_type="gated", max_retries=3))
    assert await worker_a.run_once() == 1
    await gate.wait_entered()
    assert await worker_b.rescue() == 0
    assert await count(conn, "worker") == 2

    await kill_listener(worker_a, conn, how)
    # at once (the server ends the closed session's lock asynchronously), not after the 5 s lease
    await eventually(worker_b.rescue, within=1)
    queued = await row(conn, "job", created.id)
    assert queued is not None
    assert queued["attempts"] == 1
    assert queued["last_error"] == LOST
    assert await counts(conn) == {"job": 1, "job_running": 0, "job_dead": 0}
    # the dead worker's row is forgotten, the live one's kept
    assert await conn.fetchval("SELECT array_agg(id) FROM worker") == [worker_b.id]

    # A cannot claim without its liveness lock
    assert not worker_a.alive
    assert await worker_a.run_once() == 0
    assert await count(conn, "job") == 1

    # A's late outcome is rejected; then its heartbeat reconnects it
    gate.release()
    await worker_a.wait_idle()
    assert worker_a.counts["rejected"] == 1
    assert await worker_a.heartbeat() == 0
    assert worker_a.alive
    assert await count(conn, "worker") == 2
    assert await worker_b.rescue() == 0
    assert await worker_a.run_once() == 1
    await worker_a.wait_idle()
    assert await counts(conn) == {"job": 0, "job_running": 0, "job_dead": 0}


async def test_rescued_job_out_of_retries_is_dead(
    conn: Connection, make_worker: MakeWorker
) -> None:
    gate = Gate()
    worker_a = await make_worker(gated(gate))
    worker_b = await make_worker(gated(Gate()))
    with freeze_time(T0, real_asyncio=True):
        created = await enqueue(Job(job_type="gated", max_retries=0))
        assert await worker_a.run_once() == 1
        await gate.wait_entered()
        await kill_listener(worker_a, conn, "close")
        assert await worker_b.rescue() == 1
    dead = await row(conn, "job_dead", created.id)
    assert dead is not None
    assert dead["attempts"] == 1
    assert dead["last_error"] == LOST
    assert dead["died_at"] == T0
    assert await counts(conn) == {"job": 0, "job_running": 0, "job_dead": 1}
    gate.release()
    await worker_a.wait_idle()
    assert worker_a.counts["rejected"] == 1


async def test_a_job_that_kills_every_worker_ends_dead(conn: Connection) -> None:
    """Each rescue charges an attempt, so a job that crashes its worker cannot loop forever."""
    created = await enqueue(Job(job_type="noop", max_retries=2))
    now = clock.now()
    for attempts in (1, 2):
        assert await store.claim(conn, worker_id=900, max_jobs=1, now=now, lease_expires_at=now)
        assert await store.rescue(conn, now=now, heartbeat_grace=GRACE) == 1
        queued = await row(conn, "job", created.id)
        assert queued is not None
        assert queued["attempts"] == attempts
    assert await store.claim(conn, worker_id=900, max_jobs=1, now=now, lease_expires_at=now)
    assert await store.rescue(conn, now=now, heartbeat_grace=GRACE) == 1
    dead = await row(conn, "job_dead", created.id)
    assert dead is not None
    assert dead["attempts"] == 3


async def test_running_worker_reruns_a_dead_workers_job_within_a_second(
    conn: Connection, make_worker: MakeWorker, new_worker: NewWorker
) -> None:
    """The whole path: B's rescue loop (every 0.2 s) returns A's job, the NOTIFY of the re-queue
    wakes B (poll 30 s), and B runs it, long before A's 5 s lease would expire."""
    gate_a = Gate()
    reran = asyncio.Event()
    handlers_b = Registry()

    @handlers_b.handler("gated", args=Args)
    async def run_b(args: Args, job: JobContext) -> None:
        assert job.attempt == 2
        reran.set()

    worker_a = await make_worker(gated(gate_a))
    created = await enqueue(Job(job_type="gated"))
    assert await worker_a.run_once() == 1
    await gate_a.wait_entered()

    worker_b = new_worker(handlers_b, poll_interval=30)
    await worker_b.start()
    stop = asyncio.Event()
    task = asyncio.create_task(worker_b.run(stop))
    try:
        killed = asyncio.get_running_loop().time()
        await kill_listener(worker_a, conn, "terminate")
        async with asyncio.timeout(2):
            await reran.wait()
        assert asyncio.get_running_loop().time() - killed < 1
    finally:
        stop.set()
        await task
    assert await where(conn, created.id) == []
    gate_a.release()
    await worker_a.wait_idle()
    assert worker_a.counts["rejected"] == 1


@pytest.mark.parametrize(
    ("lease_s", "heartbeat_s", "refused"),
    [(1.0, 1.0, True), (1.9, 1.0, True), (2.0, 1.0, False), (30.0, 5.0, False)],
)
def test_a_lease_shorter_than_two_heartbeats_is_refused(
    database_url: str, lease_s: float, heartbeat_s: float, refused: bool
) -> None:
    """A server crash can lose a worker's last heartbeat (its commit does not wait for the
    disk), so a lease must outlast two intervals or a live worker's job would be rescued."""
    values = {
        "lease": timedelta(seconds=lease_s),
        "heartbeat_interval": timedelta(seconds=heartbeat_s),
    }
    if not refused:
        assert make_settings(database_url, **values).lease == values["lease"]
        return
    with pytest.raises(ValidationError) as caught:
        make_settings(database_url, **values)
    message = str(caught.value)
    assert "JOBQ_LEASE_S" in message
    assert "at least twice JOBQ_HEARTBEAT_INTERVAL_S" in message


def test_a_too_short_lease_stops_the_start_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("JOBQ_LEASE_S", "4")
    monkeypatch.setenv("JOBQ_HEARTBEAT_INTERVAL_S", "5")
    assert jobq_main(["check"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "jobq: invalid settings: JOBQ_LEASE_S (4) must be at least twice"
        " JOBQ_HEARTBEAT_INTERVAL_S (5)\n"
    )
