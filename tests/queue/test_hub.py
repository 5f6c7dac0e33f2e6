"""One LISTEN per host (`jobq.queue.hub`) and one leader of the fleet's upkeep: a notification
wakes one idle worker, a burst as many as it needs, and the hub's and the leader's places are
taken when they stop. Real sockets; the workers on a real database."""

from __future__ import annotations

import asyncio
import os
import socket
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from freezegun import freeze_time
from pydantic import BaseModel

from jobq.db import Connection, transaction
from jobq.queue import Job, JobContext, Registry, Worker, enqueue, hub, store, wakeup
from jobq.queue.hub import Hub
from tests.queue.conftest import NewWorker
from tests.queue.helpers import MakeWorker
from tests.toolkit.procs import eventually

pytestmark = pytest.mark.skipif(not hub.SUPPORTED, reason="the hub needs Linux's sockets")

SLOW_POLL = 30.0  # seconds: a wake-up that waited for the poll would time the test out

SLOW_JOB_S = 0.05
"""`wakeup.SLOW_JOB_S` in the tests of jobs that end at once: their run time, measured in wall
time, passes the product's 1 ms whenever the process is descheduled that long (a loaded
machine), and each time one more worker is asked for. What they test is the rule, not the
figure."""


class Args(BaseModel):
    n: int = 0


class Record:
    """Wakes and cancels heard by a bare `Hub`."""

    def __init__(self) -> None:
        self.wakes = 0
        self.cancels: list[int] = []
        self.listens: list[bool] = []

    def hub(self, address: bytes) -> Hub:
        found = Hub(
            address,
            wake=self._wake,
            cancel=self.cancels.append,
            listen=self.listens.append,
        )
        found.open()
        return found

    def _wake(self) -> None:
        self.wakes += 1


@contextmanager
def bound(address: bytes, *records: Record) -> Iterator[list[Hub]]:
    """A hub of each of `records` at `address`, in order (the first binds the hub's address);
    closed at the end."""
    hubs = [record.hub(address) for record in records]
    try:
        yield hubs
    finally:
        for h in hubs:
            h.close()


def _address(tag: str) -> bytes:
    return hub.hub_address(f"test-{tag}-{os.getpid()}-{id(object())}")


async def _delivered() -> None:
    for _ in range(5):  # the datagrams are read by the loop's readers
        await asyncio.sleep(0.01)


async def test_a_notification_wakes_the_fewest_idle_workers_that_have_room_in_every_queue() -> None:
    address = _address("queues")
    leader, first, second, other = Record(), Record(), Record(), Record()
    with bound(address, leader, first, second, other) as hubs:
        assert [h.leading for h in hubs] == [True, False, False, False]
        assert leader.listens == [True]
        hubs[1].idle(["default"])
        hubs[3].idle(["exports"])
        hubs[2].idle(["default"])
        await _delivered()
        hubs[0].notified()
        await _delivered()
        # the most recently idle with room in `default`, and the one with room in `exports`;
        # not the hub (it is not idle)
        assert (leader.wakes, first.wakes, second.wakes, other.wakes) == (0, 0, 1, 1)
        hubs[0].notified()
        await _delivered()
        assert (leader.wakes, first.wakes, second.wakes, other.wakes) == (0, 1, 1, 1)
        hubs[0].notified()  # nobody is idle any more
        await _delivered()
        assert (leader.wakes, first.wakes, second.wakes, other.wakes) == (0, 1, 1, 1)
        hubs[1].idle(["default", "exports"])
        hubs[3].idle(["exports"])
        hubs[2].idle(["default"])
        await _delivered()
        hubs[0].notified()  # one worker has room in both, but two more recent ones cover them
        await _delivered()
        assert (leader.wakes, first.wakes, second.wakes, other.wakes) == (0, 1, 2, 2)
        hubs[0].idle(["default"])
        hubs[1].idle(["default"])
        await _delivered()
        hubs[0].notified()  # the hub itself first, though a follower was idle more recently
        await _delivered()
        assert (leader.wakes, first.wakes) == (1, 1)


async def test_more_wakes_another_with_room_there_and_a_cancel_reaches_every_follower() -> None:
    address = _address("more")
    leader, asking, idle, elsewhere = Record(), Record(), Record(), Record()
    with bound(address, leader, asking, idle, elsewhere) as hubs:
        hubs[2].idle(["default"])
        hubs[3].idle(["exports"])
        hubs[1].idle(["default"])  # the most recently idle...
        await _delivered()
        hubs[1].more(["default"])  # ...asks for more: another with room there, not itself
        await _delivered()
        assert (asking.wakes, idle.wakes, elsewhere.wakes) == (0, 1, 0)
        hubs[0].idle(["default"])
        hubs[0].more(["default"])  # the hub asking for more wakes a follower, never itself
        await _delivered()
        assert (leader.wakes, asking.wakes) == (0, 1)
        hubs[0].cancelled(42)
        await _delivered()
        assert leader.cancels == asking.cancels == idle.cancels == elsewhere.cancels == [42]


async def test_a_follower_replaces_a_hub_that_is_gone_and_a_gone_follower_is_forgotten() -> None:
    address = _address("takeover")
    old, follower, gone = Record(), Record(), Record()
    with bound(address, old, follower, gone) as hubs:
        hubs[1].idle(["default"])
        hubs[2].idle(["default"])
        await _delivered()
        hubs[2].close()  # it died without a word
        hubs[0].notified()  # its wake-up cannot be sent: the next idle one gets it
        await _delivered()
        assert (follower.wakes, gone.wakes) == (1, 0)
        hubs[0].close()
        hubs[1].idle(["default"])  # finds no hub: becomes it
        assert hubs[1].leading
        assert follower.listens == [True]


async def test_the_hubs_poll_wakes_the_followers_of_queues_it_has_no_room_in() -> None:
    address = _address("poll")
    leader, same, other = Record(), Record(), Record()
    with bound(address, leader, same, other) as hubs:
        hubs[1].idle(["default"])
        hubs[2].idle(["exports"])
        await _delivered()
        hubs[0].polled(["default"])  # its own claim covers `default`
        await _delivered()
        assert (leader.wakes, same.wakes, other.wakes) == (0, 0, 1)


async def test_a_follower_whose_hub_does_not_answer_listens_itself_until_it_answers() -> None:
    address = _address("hung")
    leader, follower = Record(), Record()
    with bound(address, leader, follower) as hubs:
        hubs[1].hello()
        await _delivered()
        hubs[1].hello()  # answered: all is well
        await _delivered()
        assert follower.listens == []
        assert hubs[0]._sock is not None
        asyncio.get_running_loop().remove_reader(hubs[0]._sock.fileno())  # its loop is stuck
        await _delivered()
        hubs[1].hello()
        await _delivered()
        assert follower.listens == []  # one hello may be unanswered yet
        hubs[1].hello()
        assert hubs[1].orphaned
        assert follower.listens == [True]
        hubs[1].notified()  # what it hears itself wakes it
        assert follower.wakes == 1
        asyncio.get_running_loop().add_reader(hubs[0]._sock.fileno(), hubs[0]._receive)
        await _delivered()  # it reads the hellos and answers
        assert not hubs[1].orphaned
        assert follower.listens == [True, False]


@pytest.mark.skipif(os.geteuid() != 0, reason="sending as another user needs root")
async def test_datagrams_of_another_user_are_ignored() -> None:
    address = _address("strangers")
    leader, follower = Record(), Record()
    with bound(address, leader, follower) as hubs:
        assert hubs[1]._sock is not None
        target = hubs[1]._sock.getsockname()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child, as user nobody
            try:
                os.setuid(65534)
                with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as theirs:
                    theirs.sendto(b"c 7", target)
                    theirs.sendto(b"w", target)
            finally:
                os._exit(0)
        _, status = await asyncio.to_thread(os.waitpid, pid, 0)
        assert status == 0
        await _delivered()
        assert (follower.wakes, follower.cancels) == (0, [])
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as mine:
            mine.sendto(b"c 7", target)
        await _delivered()
        assert follower.cancels == [7]  # the same message from this user is heard


class Running:
    """Jobs that run until `release` is set; counts how many run at once, by worker."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.by_worker: Counter[int] = Counter()
        self.started = 0

    def handlers(self) -> Registry:
        handlers = Registry()

        @handlers.handler("hold", args=Args)
        async def hold(args: Args, job: JobContext) -> None:
            self.by_worker[job.worker_id] += 1
            self.started += 1
            await self.release.wait()

        return handlers

    async def burst(self, count: int) -> None:
        """Enqueue `count` "hold" jobs in one transaction (one notification) and wait until
        all have started (with `release` set: have run)."""
        async with transaction():
            for n in range(count):
                await enqueue(Job(job_type="hold", arguments={"n": n}))

        async def all_started() -> bool:
            return self.started == count

        await eventually(all_started, within=10, what=f"{count} jobs")


@asynccontextmanager
async def fleet(
    new_worker: NewWorker, handlers: Registry, size: int, **overrides: Any
) -> AsyncIterator[list[tuple[Worker, asyncio.Event, asyncio.Task[None]]]]:
    """`size` workers in `run(stop)` in this process, settled into their idle sleep, woken by
    their hub alone (not by this process's own wake-up events); stopped at the end."""
    members = []
    overrides.setdefault("poll_interval", SLOW_POLL)
    for _ in range(size):
        worker = new_worker(handlers, **overrides)
        await worker.start()
        stop = asyncio.Event()
        members.append((worker, stop, asyncio.create_task(worker.run(stop))))
    saved = set(wakeup.events)
    wakeup.events.clear()
    try:
        await asyncio.sleep(0.3)  # each found nothing, told the hub it is idle and sleeps
        yield members
    finally:
        wakeup.events.update(saved)
        for _, stop, _task in members:
            stop.set()
        await asyncio.gather(*(task for _, _, task in members))


def count_claims(monkeypatch: pytest.MonkeyPatch) -> Counter[int]:
    """Count every claim statement (`store.record_and_claim`) from now on, by worker id."""
    claims = Counter[int]()
    real = store.record_and_claim

    async def counted(*args: Any, **kw: Any) -> Any:
        claims[kw["worker_id"]] += 1
        return await real(*args, **kw)

    monkeypatch.setattr(store, "record_and_claim", counted)
    return claims


async def test_one_worker_listens_and_a_job_wakes_one_worker(
    new_worker: NewWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    claims = count_claims(monkeypatch)
    done = Running()
    done.release.set()
    async with fleet(new_worker, done.handlers(), 4) as members:
        assert sum(w.wakeups.listening for w, _, _ in members) == 1
        claims.clear()
        jobs = 20
        for n in range(jobs):
            await enqueue(Job(job_type="hold", arguments={"n": n}))

            async def started(count: int = n + 1) -> bool:
                return done.started >= count

            await eventually(started, within=10, what=f"job {n} to start")
        # each job: the claim that takes it and the one that records its outcome; were every
        # worker woken, each job would cost four claims and a record
        assert sum(claims.values()) <= 2 * jobs + 4, claims


async def test_a_burst_wakes_as_many_workers_as_it_needs(new_worker: NewWorker) -> None:
    held = Running()
    async with fleet(new_worker, held.handlers(), 4, max_concurrent_jobs=2) as members:
        async with transaction():  # one commit, one notification
            for n in range(8):
                await enqueue(Job(job_type="hold", arguments={"n": n}))

        async def all_running() -> bool:
            return held.started == 8

        await eventually(all_running, within=10, what="8 jobs running on 4 workers of 2 slots")
        assert sorted(held.by_worker.values()) == [2, 2, 2, 2]
        assert set(held.by_worker) == {w.id for w, _, _ in members}
        held.release.set()


async def test_a_burst_of_jobs_that_end_at_once_stays_with_the_worker_that_keeps_up(
    new_worker: NewWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the jobs end well within `SLOW_JOB_S` of their start: more workers would only
    # take turns on the same cores. (Were help asked at every full claim, all 4 would run some.)
    monkeypatch.setattr(wakeup, "SLOW_JOB_S", SLOW_JOB_S)
    done = Running()
    done.release.set()
    async with fleet(new_worker, done.handlers(), 4, max_concurrent_jobs=2):
        await done.burst(40)
        # one worker, or two where a claim's jobs were held up past `SLOW_JOB_S`
        assert len(done.by_worker) <= 2, done.by_worker


async def test_fast_jobs_after_slow_jobs_of_another_type_stay_with_the_worker_that_keeps_up(
    new_worker: NewWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # run times are learned by job type: the hub's 250 ms "slow" jobs do not make the "hold"
    # jobs of the same queue after them look slow (a queue's average would, for some 8 jobs,
    # and each full claim of those would wake one more worker)
    monkeypatch.setattr(wakeup, "SLOW_JOB_S", SLOW_JOB_S)
    done = Running()
    done.release.set()
    handlers = done.handlers()
    slow_ran: list[int] = []

    @handlers.handler("slow", args=Args)
    async def slow(args: Args, job: JobContext) -> None:
        await asyncio.sleep(5 * SLOW_JOB_S)
        slow_ran.append(job.worker_id)

    async with fleet(new_worker, handlers, 4, max_concurrent_jobs=2) as members:
        hub_worker = next(
            w for w, _, _ in members if w.wakeups.hub is not None and w.wakeups.hub.leading
        )
        for n in range(2):
            await enqueue(Job(job_type="slow", arguments={"n": n}))

            async def ran() -> bool:
                return len(slow_ran) == n + 1  # noqa: B023 - awaited within the iteration

            await eventually(ran, within=10, what=f"slow job {n}")
        assert slow_ran == [hub_worker.id, hub_worker.id]  # the hub wakes itself first
        await done.burst(40)
        # one worker, or two where a claim's jobs were held up past `SLOW_JOB_S`
        assert len(done.by_worker) <= 2, done.by_worker


async def test_a_burst_of_jobs_that_keep_their_slots_taken_spreads_over_the_workers(
    new_worker: NewWorker,
) -> None:
    # each job runs 50 ms, far above `SLOW_JOB_S`: once a worker knows it, each claim that fills
    # its 2 slots asks the hub for another worker
    ran: Counter[int] = Counter()
    handlers = Registry()

    @handlers.handler("slow", args=Args)
    async def slow(args: Args, job: JobContext) -> None:
        await asyncio.sleep(0.05)
        ran[job.worker_id] += 1

    async with fleet(new_worker, handlers, 4, max_concurrent_jobs=2):
        for n in range(2):  # a first pair: the worker that runs them learns how long they take
            await enqueue(Job(job_type="slow", arguments={"n": n}))

        async def first_ran() -> bool:
            return sum(ran.values()) == 2

        await eventually(first_ran, within=10, what="the first 2 jobs")
        async with transaction():
            for n in range(2, 42):
                await enqueue(Job(job_type="slow", arguments={"n": n}))

        async def all_ran() -> bool:
            return sum(ran.values()) == 42

        await eventually(all_ran, within=30, what="42 slow jobs")
        assert len(ran) == 4, ran


async def test_a_followers_poll_leaves_the_claim_to_its_hub_whose_poll_covers_it(
    new_worker: NewWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    claims = count_claims(monkeypatch)
    done = Running()
    done.release.set()
    poll = 0.1
    async with fleet(new_worker, done.handlers(), 2, poll_interval=poll) as members:
        hub_worker = next(
            w for w, _, _ in members if w.wakeups.hub is not None and w.wakeups.hub.leading
        )
        follower = next(w for w, _, _ in members if w is not hub_worker)
        assert hub_worker.id is not None
        assert follower.id is not None
        claims.clear()
        await asyncio.sleep(10 * poll)  # the follower's naps end 3 times, the hub's 10
        assert claims[follower.id] == 0, claims  # it said it is idle again, claimed nothing
        assert claims[hub_worker.id] >= 3, claims  # the hub polled
        # a job with no notification and no wake-up: the hub's poll claims it
        monkeypatch.setattr(wakeup, "wake_workers", lambda database: None)
        await enqueue(Job(job_type="hold"))

        async def ran() -> bool:
            return done.started == 1

        await eventually(ran, within=10, what="the job, claimed at the hub's poll")
        assert done.by_worker == {hub_worker.id: 1}


async def test_when_the_hub_and_the_leader_stop_other_workers_take_their_places(
    new_worker: NewWorker,
) -> None:
    done = Running()
    done.release.set()
    async with fleet(new_worker, done.handlers(), 3, heartbeat_interval=0.05) as members:
        assert [w.leader for w, _, _ in members].count(True) == 1
        hub_worker, stop, task = next(m for m in members if m[0].wakeups.listening)
        leader = next(w for w, _, _ in members if w.leader)
        stop.set()
        await task
        if leader is not hub_worker:
            next(m for m in members if m[0] is leader)[1].set()
        rest = [w for w, _, t in members if not t.done() and w is not leader]

        async def taken() -> bool:
            return sum(w.wakeups.listening for w in rest) == 1 and sum(w.leader for w in rest) == 1

        await eventually(taken, within=10, what="another hub and leader")
        await enqueue(Job(job_type="hold"))

        async def started() -> bool:
            return done.started == 1

        await eventually(started, within=10, what="the job, woken by the new hub")


async def test_the_lead_passes_at_the_next_heartbeat_when_its_leader_dies_or_hangs(
    conn: Connection, make_worker: MakeWorker
) -> None:
    handlers = Registry()
    a, b, c = [await make_worker(handlers) for _ in range(3)]
    t0 = datetime.now(UTC)
    with freeze_time(t0, real_asyncio=True) as frozen:
        for worker in (a, b, c):
            await worker.heartbeat()
        assert (a.leader, b.leader, c.leader) == (True, False, False)
        # dead: its liveness lock gone, the next heartbeat of any worker takes the lead
        pid = a.listener.conn.get_server_pid() if a.listener.conn is not None else 0
        assert await conn.fetchval("SELECT pg_terminate_backend($1, 5000)", pid)
        await b.heartbeat()
        assert b.leader
        await c.heartbeat()
        assert not c.leader
        # hung: it stops renewing; before its lead runs out nobody takes it, then one does
        frozen.tick(b.settings.heartbeat_grace - timedelta(seconds=1))
        await c.heartbeat()
        assert not c.leader
        frozen.tick(timedelta(seconds=2))
        await c.heartbeat()
        assert c.leader
        await b.heartbeat()  # back: it finds the lead taken, and runs no upkeep
        assert not b.leader
