"""Named queues and their flow control, with several in-process workers, each claiming on its
own connection: per-queue slots, pause and resume, per-key and global concurrency limits, rate
limits, and a job held back by a limit keeping its place and its attempts.

The limits are checked on what happened: the handlers record how many of them ran at once,
and a trigger journals every claim (`tests.claim_log`), whoever made it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any

import pytest
from freezegun import freeze_time
from pydantic import BaseModel
from quart.typing import TestClientProtocol as Client

from jobq import clock, db
from jobq.config import Settings
from jobq.db import Connection, transaction
from jobq.jobs import declare_queues
from jobq.queue import Job, JobContext, Registry, Worker, enqueue, enqueue_many, limits, store
from jobq.queue.registry import Rate
from tests import claim_log
from tests.queue.conftest import NewWorker
from tests.queue.helpers import Gate, MakeWorker
from tests.toolkit.procs import eventually

WAIT_S = 60.0
"""The longest wait for a condition: generous, for a busy two-core machine."""

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


class Args(BaseModel):
    n: int = 0
    key: str | None = None
    hold_s: float = 0.0


@asynccontextmanager
async def running_workers(
    new_worker: NewWorker, handlers: Registry, num: int, **overrides: Any
) -> AsyncIterator[list[Worker]]:
    """`num` workers in `run(stop)` (each claims on its own connection); stopped at the end."""
    workers = [new_worker(handlers, **overrides) for _ in range(num)]
    for worker in workers:
        await worker.start()
    stop = asyncio.Event()
    tasks = [asyncio.create_task(worker.run(stop)) for worker in workers]
    try:
        yield workers
    finally:
        stop.set()
        await asyncio.gather(*tasks)


class Overlap:
    """What the handlers saw: how many ran at once, per queue and per key, and what finished."""

    def __init__(self) -> None:
        self.running: Counter[tuple[str, str | None]] = Counter()
        self.peak: Counter[tuple[str, str | None]] = Counter()
        self.done: list[int] = []

    def handlers(self, queue: str) -> Registry:
        handlers = Registry()

        @handlers.handler("work", args=Args, queue=queue)
        async def work(args: Args, job: JobContext) -> None:
            counted = (
                [(job.queue, None), (job.queue, args.key)] if args.key else [(job.queue, None)]
            )
            for name in counted:
                self.running[name] += 1
                self.peak[name] = max(self.peak[name], self.running[name])
            try:
                await asyncio.sleep(args.hold_s)
            finally:
                for name in counted:
                    self.running[name] -= 1
            self.done.append(job.id)

        return handlers


# -- slots -------------------------------------------------------------------------------------


async def test_per_queue_slots_hold_and_a_full_queue_never_delays_another(
    new_worker: NewWorker, conn: Connection
) -> None:
    handlers = Registry()
    gate = Gate()
    running: Counter[tuple[int | None, str]] = Counter()
    peak: Counter[tuple[int | None, str]] = Counter()
    done: Counter[str] = Counter()

    async def count_in(job: JobContext, body: Any) -> None:
        slot = (job.worker_id, job.queue)
        running[slot] += 1
        peak[slot] = max(peak[slot], running[slot])
        try:
            await body
        finally:
            running[slot] -= 1
        done[job.queue] += 1

    @handlers.handler("slow_job", args=Args, queue="slow")
    async def slow_job(args: Args, job: JobContext) -> None:
        await count_in(job, gate.enter(job.id))

    @handlers.handler("fast_job", args=Args, queue="fast")
    async def fast_job(args: Args, job: JobContext) -> None:
        await count_in(job, asyncio.sleep(0.01))

    async with running_workers(new_worker, handlers, 2, queues={"slow": 2, "fast": 3}) as workers:
        await enqueue_many(
            [Job(job_type="slow_job", queue="slow", arguments={"n": n}) for n in range(20)]
        )
        await eventually(lambda: len(gate.entered) >= 4, within=WAIT_S)  # 2 workers x 2 slots
        # the slow queue is full in both workers, 16 of its jobs wait: fast jobs still run
        await enqueue_many(
            [Job(job_type="fast_job", queue="fast", arguments={"n": n}) for n in range(30)]
        )
        await eventually(lambda: done["fast"] == 30, within=WAIT_S)
        assert len(gate.entered) == 4
        assert await conn.fetchval("SELECT count(*) FROM job WHERE queue = 'slow'") == 16
        assert await conn.fetchval("SELECT count(*) FROM job_running WHERE queue = 'slow'") == 4
        gate.release()
        await eventually(lambda: done["slow"] == 20, within=WAIT_S)
        ids = [w.id for w in workers]
    assert all(peak[(wid, "slow")] == 2 for wid in ids), peak  # full, and never more
    assert all(peak[(wid, "fast")] <= 3 for wid in ids), peak
    assert await conn.fetchval("SELECT count(*) FROM job") == 0


# -- pause and resume --------------------------------------------------------------------------


@pytest.mark.parametrize("per_key", [None, 100], ids=["unlimited", "limited"])
async def test_a_pause_stops_every_worker_from_its_commit_on(
    new_worker: NewWorker, claims: Connection, per_key: int | None
) -> None:
    """Three workers claim a stream of jobs; a pause commits. No claim starts after that
    commit (only a claim already in flight, whose time is earlier, may still take jobs); the
    jobs running finish normally; enqueueing goes on; a resume lets the workers claim again.
    Both claim paths: a queue without limits, and one with limits (`job_claim_turns`)."""
    handlers = Registry()
    handlers.queue("work", max_running_per_key=per_key)
    gate = Gate()
    finished: list[int] = []

    @handlers.handler("work", args=Args, queue="work")
    async def work(args: Args, job: JobContext) -> None:
        if args.n < 3:
            await gate.enter(job.id)  # held: running across the pause
        finished.append(job.id)

    key = "k" if per_key else None
    enqueued = 0

    async def produce(stop: asyncio.Event) -> None:
        nonlocal enqueued
        while not stop.is_set():
            await enqueue(
                Job(job_type="work", queue="work", arguments={"n": enqueued}, concurrency_key=key)
            )
            enqueued += 1
            await asyncio.sleep(0.005)

    async with running_workers(new_worker, handlers, 3, queues={"work": 2}):
        stop_producing = asyncio.Event()
        producer = asyncio.create_task(produce(stop_producing))
        await eventually(lambda: len(gate.entered) == 3 and len(finished) >= 20, within=WAIT_S)
        async with transaction():
            assert await limits.pause_queue(db.conn(), "work", paused=True)
        paused_at = clock.now()  # after the commit
        at_pause = enqueued
        gate.release()  # the jobs running at the pause finish normally
        await eventually(lambda: enqueued >= at_pause + 50, within=WAIT_S)
        await eventually(lambda: all(i in finished for i in gate.entered), within=WAIT_S)
        stop_producing.set()
        await producer

        claimed = await claim_log.claims(claims, "work")
        late = [(c["job_id"], c["claimed_at"]) for c in claimed if c["claimed_at"] >= paused_at]
        assert late == [], f"claimed after the pause committed at {paused_at}"
        await eventually(  # the running jobs' outcomes were recorded: none is left claimed
            lambda: claims.fetchval("SELECT count(*) = 0 FROM job_running"), within=WAIT_S
        )
        queued = await claims.fetchval("SELECT count(*) FROM job WHERE queue = 'work'")
        assert queued == enqueued - len(claimed)
        assert queued >= 50  # enqueued while paused, and waiting

        async with transaction():
            assert await limits.pause_queue(db.conn(), "work", paused=False)
        await eventually(lambda: len(finished) == enqueued, within=WAIT_S)
    assert await claims.fetchval("SELECT count(*) FROM job") == 0


# -- concurrency limits ------------------------------------------------------------------------


async def test_a_per_key_limit_holds_across_workers_claiming_at_once(
    new_worker: NewWorker, conn: Connection
) -> None:
    overlap = Overlap()
    handlers = overlap.handlers("keyed")
    handlers.queue("keyed", max_running_per_key=2)
    jobs = [
        Job(
            job_type="work",
            queue="keyed",
            arguments={"n": n, "key": k, "hold_s": 0.05},
            concurrency_key=k,
        )
        for k in ("a", "b", "c")
        for n in range(12)
    ]
    jobs += [
        Job(job_type="work", queue="keyed", arguments={"n": n, "hold_s": 0.05}) for n in range(6)
    ]
    async with running_workers(new_worker, handlers, 3, queues={"keyed": 8}):
        await enqueue_many(jobs)
        await eventually(lambda: len(overlap.done) == len(jobs), within=WAIT_S)
    for k in ("a", "b", "c"):
        assert overlap.peak[("keyed", k)] <= 2, overlap.peak
    assert max(overlap.peak[("keyed", k)] for k in ("a", "b", "c")) == 2  # the limit bound
    assert overlap.peak[("keyed", None)] > 2  # and keys (and key-less jobs) ran side by side
    assert await conn.fetchval("SELECT count(*) FROM job") == 0


async def test_a_global_limit_holds_across_workers_claiming_at_once(
    new_worker: NewWorker, conn: Connection
) -> None:
    overlap = Overlap()
    handlers = overlap.handlers("capped")
    handlers.queue("capped", max_running=3)
    jobs = [
        Job(job_type="work", queue="capped", arguments={"n": n, "hold_s": 0.05}) for n in range(30)
    ]
    async with running_workers(new_worker, handlers, 3, queues={"capped": 4}):
        await enqueue_many(jobs)
        await eventually(lambda: len(overlap.done) == len(jobs), within=WAIT_S)
    assert overlap.peak[("capped", None)] == 3  # reached (12 slots), never exceeded
    assert await conn.fetchval("SELECT count(*) FROM job") == 0


TURN_LOCK = 1785684594
"""The class of the transaction locks by which the claims of a limited queue take turns (by the
queue's id: sql/functions/job_claim_turns.sql)."""


async def test_a_claim_takes_a_limited_queues_turn_only_when_the_queue_holds_a_ripe_job(
    make_worker: MakeWorker, conn: Connection
) -> None:
    """While another claim holds the turn of `capped`, which holds only a job due in an hour, a
    claim neither waits for the turn nor fails; once a job is ripe there, it waits for the turn,
    then claims it."""
    handlers = Overlap().handlers("capped")
    handlers.queue("capped", max_running=3, rate=Rate(100, timedelta(seconds=1)))
    worker = await make_worker(handlers, queues={"capped": 4})
    later = clock.now() + timedelta(hours=1)
    await enqueue(Job(job_type="work", queue="capped", arguments={"n": 0}, ripe_at=later))
    queue_id = await conn.fetchval("SELECT id FROM job_queue WHERE name = 'capped'")
    waiting = (
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = $1"
        " AND objid = $2 AND NOT granted"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    )
    async with worker.database.pool.acquire() as turn:
        async with turn.transaction():
            await turn.execute("SELECT pg_advisory_xact_lock($1, $2)", TURN_LOCK, queue_id)
            assert await asyncio.wait_for(worker.run_once(), WAIT_S) == 0
            await enqueue(Job(job_type="work", queue="capped", arguments={"n": 1}))
            claim = asyncio.create_task(worker.run_once())
            await eventually(lambda: conn.fetchval(waiting, TURN_LOCK, queue_id), within=WAIT_S)
            assert not claim.done()
        assert await claim == 1


async def test_a_worker_that_knows_no_limits_respects_those_another_declared(
    new_worker: NewWorker, conn: Connection
) -> None:
    """A worker whose registry declares `capped` without limits started first; another, started
    later, declared `max_running=3` (the last one started wins), and stopped. The first claims
    with the statement for queues without limits, which skips `capped`; it learns that from the
    claim and claims `capped` with its limits from then on: all its jobs run, 3 at a time."""
    overlap = Overlap()
    unaware = new_worker(overlap.handlers("capped"), queues={"capped": 8})
    aware_handlers = overlap.handlers("capped")
    aware_handlers.queue("capped", max_running=3)
    await unaware.start()
    aware = new_worker(aware_handlers, queues={"capped": 8})
    await aware.start()
    await aware.stop()
    assert await conn.fetchval("SELECT max_running FROM job_queue WHERE name = 'capped'") == 3
    jobs = [
        Job(job_type="work", queue="capped", arguments={"n": n, "hold_s": 0.05}) for n in range(30)
    ]
    stop = asyncio.Event()
    task = asyncio.create_task(unaware.run(stop))
    try:
        await enqueue_many(jobs)
        await eventually(lambda: len(overlap.done) == len(jobs), within=WAIT_S)
    finally:
        stop.set()
        await task
    assert overlap.peak[("capped", None)] == 3  # reached, never exceeded
    assert unaware.counts["claimed"] == len(jobs)
    assert await conn.fetchval("SELECT count(*) FROM job") == 0


# -- rate limits -------------------------------------------------------------------------------


async def test_rate_limits_hold_in_every_window_across_workers(
    new_worker: NewWorker, claims: Connection
) -> None:
    """Per key (2 starts per 0.5 s per key) and per queue (3 per 0.5 s): no window of the
    period ever holds more claims, whichever of three workers made them."""
    period = timedelta(seconds=0.5)
    overlap = Overlap()
    handlers = overlap.handlers("per_key")
    handlers.queue("per_key", rate_per_key=Rate(2, period))
    handlers.queue("per_queue", rate=Rate(3, period))
    jobs = [
        Job(job_type="work", arguments={"n": n, "key": k}, queue="per_key", concurrency_key=k)
        for k in ("a", "b")
        for n in range(7)
    ]
    jobs += [Job(job_type="work", arguments={"n": n}, queue="per_queue") for n in range(10)]
    async with running_workers(new_worker, handlers, 3, queues={"per_key": 8, "per_queue": 8}):
        await enqueue_many(jobs)
        await eventually(lambda: len(overlap.done) == len(jobs), within=WAIT_S)

    keyed = await claim_log.claims(claims, "per_key")
    for k in ("a", "b"):
        times = [c["claimed_at"] for c in keyed if c["concurrency_key"] == k]
        assert len(times) == 7
        assert claim_log.max_starts_in_window(times, period) == 2, times
    queued = [c["claimed_at"] for c in await claim_log.claims(claims, "per_queue")]
    assert len(queued) == 10
    assert claim_log.max_starts_in_window(queued, period) == 3, queued
    assert all(c["attempts"] == 0 for c in keyed)  # held back: never charged


# -- a job held back by a limit ----------------------------------------------------------------


async def test_a_job_held_back_by_a_per_key_limit_keeps_its_place_and_attempts(
    make_worker: MakeWorker, conn: Connection
) -> None:
    gate = Gate()
    started: list[tuple[int, int]] = []
    handlers = Registry()
    handlers.queue("keyed", max_running_per_key=1)

    @handlers.handler("work", args=Args, queue="keyed")
    async def work(args: Args, job: JobContext) -> None:
        started.append((job.id, job.attempt))
        await gate.enter(job.id)

    def keyed(n: int, key: str, ripe_s: float) -> Job:
        return Job(job_type="work", queue="keyed", arguments={"n": n}, concurrency_key=key).runs_at(
            T0 + timedelta(seconds=ripe_s)
        )

    with freeze_time(T0, real_asyncio=True):
        worker = await make_worker(handlers)
        # enqueued out of line: the line is ripe_at order, not id order
        third = (await enqueue(keyed(3, "k", -1))).id
        first = (await enqueue(keyed(1, "k", -3))).id
        second = (await enqueue(keyed(2, "k", -2))).id
        other = (await enqueue(keyed(4, "other", -3))).id
        before = {
            r["id"]: (r["ripe_at"], r["attempts"])
            for r in await conn.fetch("SELECT id, ripe_at, attempts FROM job")
        }

        assert await worker.run_once() == 2
        await eventually(lambda: len(started) == 2)
        assert {job_id for job_id, _ in started} == {first, other}
        for _ in range(3):  # claim after claim, the key's next jobs stay held back, untouched
            assert await worker.run_once() == 0
        held = {
            r["id"]: (r["ripe_at"], r["attempts"])
            for r in await conn.fetch("SELECT id, ripe_at, attempts FROM job")
        }
        assert held == {second: before[second], third: before[third]}

        gate.release()
        await worker.wait_idle()
        assert await worker.run_once() == 1  # the key's slot is free: the next in its line
        await worker.wait_idle()
        assert await worker.run_once() == 1
        await worker.wait_idle()
    assert [job_id for job_id, _ in started][2:] == [second, third]
    assert all(attempt == 1 for _, attempt in started)  # no attempt charged while held
    assert await conn.fetchval("SELECT count(*) FROM job_dead") == 0


async def test_a_job_held_back_by_a_rate_limit_keeps_its_attempts_until_its_window_opens(
    make_worker: MakeWorker, conn: Connection
) -> None:
    period = timedelta(seconds=10)
    started: list[tuple[int, int]] = []
    handlers = Registry()
    handlers.queue("rated", rate_per_key=Rate(1, period))

    @handlers.handler("work", args=Args, queue="rated")
    async def work(args: Args, job: JobContext) -> None:
        started.append((job.id, job.attempt))

    with freeze_time(T0, real_asyncio=True) as frozen:
        worker = await make_worker(handlers)
        first = (
            await enqueue(
                Job(job_type="work", queue="rated", arguments={"n": 1}, concurrency_key="k")
            )
        ).id
        frozen.tick(timedelta(milliseconds=1))
        second = (
            await enqueue(
                Job(job_type="work", queue="rated", arguments={"n": 2}, concurrency_key="k")
            )
        ).id
        ripe_at = await conn.fetchval("SELECT ripe_at FROM job WHERE id = $1", second)
        frozen.tick(timedelta(milliseconds=1))
        claimed_at = clock.now()
        assert await worker.run_once() == 1
        await worker.wait_idle()

        frozen.tick(timedelta(seconds=5))
        assert await worker.run_once() == 0
        row = await conn.fetchrow("SELECT ripe_at, attempts FROM job WHERE id = $1", second)
        assert row is not None
        assert (row["ripe_at"], row["attempts"]) == (ripe_at, 0)
        # an idle worker's timer: the moment the window lets one more start
        async with worker.database.pool.acquire() as c:
            upcoming = await store.next_ripe_at(c, now=clock.now(), queues=["rated"])
        assert upcoming == claimed_at + period

        frozen.move_to(claimed_at + period)
        assert await worker.run_once() == 1
        await worker.wait_idle()
    assert started == [(first, 1), (second, 1)]


async def test_a_held_back_rate_limited_job_starts_when_its_window_opens_not_at_the_poll(
    new_worker: NewWorker, claims: Connection
) -> None:
    poll_s = 30.0  # a start that waited for the poll would come ~30 s after the one before
    period = timedelta(seconds=1)
    overlap = Overlap()
    handlers = overlap.handlers("rated")
    handlers.queue("rated", rate_per_key=Rate(1, period))
    async with running_workers(new_worker, handlers, 2, poll_interval=poll_s):
        await asyncio.sleep(0.1)  # both idle, asleep for their poll interval
        await enqueue_many(
            [
                Job(job_type="work", queue="rated", arguments={"n": n}, concurrency_key="k")
                for n in range(3)
            ]
        )
        await eventually(lambda: len(overlap.done) == 3, within=poll_s - 5)
    times = [c["claimed_at"] for c in await claim_log.claims(claims, "rated")]
    assert len(times) == 3
    gaps = [later - earlier for earlier, later in pairwise(times)]
    assert all(gap >= period for gap in gaps), gaps  # held back by the rate
    assert all(gap < timedelta(seconds=poll_s / 2) for gap in gaps), gaps  # not by the poll


# -- the application's queues ------------------------------------------------------------------


async def test_reminders_and_exports_go_to_their_queues_with_their_keys(
    client: Client, conn: Connection, settings: Settings
) -> None:
    response = await client.post(
        "/users",
        json={
            "name": "Ann",
            "email": "ann@example.com",
            "webhook_url": "https://Hooks.Example.com:8443/in",
        },
    )
    assert response.status_code == 201
    user_id = (await response.get_json())["id"]
    response = await client.post(
        f"/users/{user_id}/reminders", json={"message": "stand up", "remind_in_seconds": 60}
    )
    assert response.status_code == 201
    assert (await client.post(f"/users/{user_id}/exports")).status_code == 202
    rows = await conn.fetch("SELECT job_type, queue, concurrency_key FROM job ORDER BY id")
    assert [(r["queue"], r["concurrency_key"]) for r in rows] == [
        ("reminders", f"user:{user_id}"),
        ("exports", f"user:{user_id}"),
    ]

    declared = Registry()
    declare_queues(settings, declared)
    reminders, exports = declared.queues()["reminders"], declared.queues()["exports"]
    assert reminders.max_running_per_key == settings.reminder_user_max_running
    assert reminders.rate_per_key is None  # the per-address limits are the delivery's own
    assert (exports.max_running_per_key, exports.max_running) == (1, None)


async def test_a_user_renders_one_export_at_a_time_across_workers(
    new_worker: NewWorker, settings: Settings
) -> None:
    """The exports queue as the application declares it: jobs of one user's key never run side
    by side, whichever worker claims them."""
    overlap = Overlap()
    handlers = overlap.handlers("exports")
    declare_queues(settings, handlers)
    jobs = [
        Job(
            job_type="work",
            queue="exports",
            arguments={"n": n, "key": k, "hold_s": 0.05},
            concurrency_key=k,
        )
        for k in ("user:1", "user:2")
        for n in range(6)
    ]
    async with running_workers(new_worker, handlers, 3, queues={"exports": 4}):
        await enqueue_many(jobs)
        await eventually(lambda: len(overlap.done) == len(jobs), within=WAIT_S)
    assert overlap.peak[("exports", "user:1")] == 1
    assert overlap.peak[("exports", "user:2")] == 1
    assert overlap.peak[("exports", None)] == 2  # two users at once
