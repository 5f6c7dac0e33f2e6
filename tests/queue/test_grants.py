"""Grants (sql/018_limits_grants.sql): a queue's turn that finds every limit far away lets the
claiming worker claim with no turn for a span. The grant's slots count as running jobs until it
ends, and its starts count in every rate window its span overlaps; a claim under it holds only
while its end has not passed and no turn is under way.

The claims of one connection (`store.record_and_claim`, as a worker makes them) pin what each
count includes: each assertion names the number a turn would allow without the grant's share.
Then workers claiming at once, each on its own connection, check the limits on what happened.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from jobq import clock
from jobq.db import Connection, Database
from jobq.queue import Job, enqueue_many, store
from jobq.queue.model import Grant
from jobq.queue.registry import QueueSpec, Rate
from jobq.queue.store import Claimed
from tests import claim_log
from tests.queue.conftest import NewWorker
from tests.queue.test_queues import WAIT_S, Overlap, running_workers
from tests.toolkit.procs import eventually

QUEUE = "granted"
SECOND = timedelta(seconds=1)
TURN_LOCK = 1785684594
"""The class of the transaction locks by which the claims of a limited queue take turns."""


async def fill(conn: Connection, spec: QueueSpec, num: int, key: str | None = None) -> None:
    await store.declare_queues(conn, [spec])
    await enqueue_many(
        [
            Job(
                job_type="noop",
                queue=spec.name,
                arguments={"n": n, "queue": spec.name},
                concurrency_key=key,
            )
            for n in range(num)
        ]
    )


async def claim(
    conn: Connection,
    free: int,
    now: datetime,
    *,
    worker_id: int,
    capacity: int | None = None,
    grant: datetime | None = None,
    queue: str = QUEUE,
) -> Claimed:
    """Claim up to `free` jobs of `queue` at `now` as worker `worker_id` would: asking for a
    grant with its `capacity`, or under the grant ending at `grant` (with no turn)."""
    return await store.record_and_claim(
        conn,
        [],
        worker_id=worker_id,
        max_jobs={queue: free},
        now=now,
        lease_expires_at=now + timedelta(minutes=5),
        limits=grant is None,
        capacity={queue: capacity} if capacity else None,
        grants={queue: grant} if grant else None,
    )


async def granted(
    conn: Connection, free: int, now: datetime, capacity: int, queue: str = QUEUE
) -> Grant:
    """A claim of `free` jobs that gets a grant: return it."""
    first = await claim(conn, free, now, worker_id=1, capacity=capacity, queue=queue)
    assert len(first.jobs) == free
    assert queue in first.grants, "no grant: the limits should be far from binding"
    return first.grants[queue]


async def while_granted(spec: QueueSpec, conn: Connection, key: str | None = None) -> int:
    """Fill a queue like `spec` with 12 jobs (of `key`), get a grant of 4 slots with 4 of them,
    and return how many another worker's turn then claims of 4 free slots, the grant still
    running (by the server's clock, this host's). A claim that ended after the grant did (a
    very slow machine) tells nothing: the set-up is tried again, on a fresh queue."""
    for attempt in range(5):
        name = f"{spec.name}{attempt}"
        await fill(conn, replace(spec, name=name), 12, key=key)
        grant = await granted(conn, 4, clock.now(), capacity=4, queue=name)
        other = await claim(conn, 4, clock.now(), worker_id=2, queue=name)
        if clock.now() < grant.until:
            await asyncio.sleep(grant.span.total_seconds())
            after = await claim(conn, 4, clock.now(), worker_id=2, queue=name)
            return len(other.jobs) * 100 + len(after.jobs)
    pytest.fail("no claim ended within a grant's span in 5 tries")


async def test_a_grants_slots_count_as_running_jobs_until_it_ends(conn: Connection) -> None:
    # 0 running + 4 slots <= 6: a grant, with 4 jobs. Another worker's turn counts its 4 slots
    # besides its 4 running jobs: no room (without them, 2); once it ended, its jobs alone: 2.
    claimed = await while_granted(QueueSpec(QUEUE, max_running=6), conn)
    assert (claimed // 100, claimed % 100) == (0, 2)


async def test_a_grants_slots_count_for_every_key(conn: Connection) -> None:
    # the grant's 4 slots may all be key x's: no room (without them, 1); once it ended, 1
    claimed = await while_granted(QueueSpec(QUEUE, max_running_per_key=5), conn, key="x")
    assert (claimed // 100, claimed % 100) == (0, 1)


async def test_a_grants_starts_count_in_every_window_its_span_overlaps(conn: Connection) -> None:
    await fill(conn, QueueSpec(QUEUE, rate=Rate(10, SECOND)), 30)
    t0 = clock.now()
    grant = await granted(conn, 2, t0, capacity=2)
    assert grant.starts == 5  # half the rate's room
    # a window that begins after the grant's time but within its span still counts its 5
    # starts, though only 2 were made (without them, 10)
    late = t0 + SECOND + grant.span / 2
    assert len((await claim(conn, 10, late, worker_id=2)).jobs) == 5
    # and one that begins after its span and twice that (for the clocks) does not: 5 of the
    # claim above, 5 left
    assert len((await claim(conn, 10, t0 + SECOND + 3 * grant.span, worker_id=2)).jobs) == 5


async def test_a_grants_starts_count_for_every_key_in_a_window_its_span_overlaps(
    conn: Connection,
) -> None:
    await fill(conn, QueueSpec(QUEUE, rate_per_key=Rate(4, SECOND)), 10, key="x")
    t0 = clock.now()
    grant = await granted(conn, 2, t0, capacity=2)
    assert grant.starts == 2  # half the key rate's room
    # the key's starts counted in the late window: the grant's 2 (without them, 4)
    late = t0 + SECOND + grant.span / 2
    assert len((await claim(conn, 4, late, worker_id=2)).jobs) == 2


async def test_a_claim_under_a_grant_holds_only_before_its_end_and_never_waits_for_a_turn(
    conn: Connection, database: Database
) -> None:
    """Under a grant that holds, the claim takes the line with no turn (no start row); under one
    whose end passed, or while a turn is under way (the claim never waits for it), the queue
    is skipped and named, for the worker to claim it with its turn. (The ends are the claim's
    to pass: an hour ahead holds for the whole test.)"""
    await fill(conn, QueueSpec(QUEUE, max_running=100), 20)
    rows = "SELECT count(*) FROM job_rate WHERE queue = $1"
    ahead = clock.now() + timedelta(hours=1)

    under = await claim(conn, 4, clock.now(), worker_id=1, grant=ahead)
    assert (len(under.jobs), under.limited) == (4, frozenset())
    assert await conn.fetchval(rows, QUEUE) == 0  # no turn wrote a start

    ended = await claim(conn, 4, clock.now(), worker_id=1, grant=clock.now() - SECOND)
    assert (ended.jobs, ended.limited) == ([], frozenset({QUEUE}))

    queue_id = await conn.fetchval("SELECT id FROM job_queue WHERE name = $1", QUEUE)
    async with database.pool.acquire() as turn, turn.transaction():
        await turn.execute("SELECT pg_advisory_xact_lock($1, $2)", TURN_LOCK, queue_id)
        during = await asyncio.wait_for(
            claim(conn, 4, clock.now(), worker_id=1, grant=ahead), WAIT_S
        )
        assert (during.jobs, during.limited) == ([], frozenset({QUEUE}))
    assert len((await claim(conn, 4, clock.now(), worker_id=1, grant=ahead)).jobs) == 4


async def test_a_global_limit_holds_with_grants_across_workers(
    new_worker: NewWorker, conn: Connection
) -> None:
    """max_running 8 for 3 workers of 4 slots: a worker gets a grant while the others' running
    jobs and grants leave room for its slots; the peak never passes 8."""
    overlap = Overlap()
    handlers = overlap.handlers("capped")
    handlers.queue("capped", max_running=8)
    jobs = [
        Job(job_type="work", queue="capped", arguments={"n": n, "hold_s": 0.02}) for n in range(90)
    ]
    async with running_workers(new_worker, handlers, 3, queues={"capped": 4}):
        await enqueue_many(jobs)
        await eventually(lambda: len(overlap.done) == len(jobs), within=WAIT_S)
    assert overlap.peak[("capped", None)] <= 8, overlap.peak
    grants = "SELECT count(*) FROM job_rate WHERE queue = 'capped' AND until IS NOT NULL"
    assert await conn.fetchval(grants) > 0


async def test_a_rate_holds_in_every_window_with_grants_across_workers(
    new_worker: NewWorker, claims: Connection
) -> None:
    """40 starts per 0.5 s over 3 workers of 4 slots: turns grant up to half the room left, and
    no window of the journal holds more than 40 claims."""
    period = timedelta(seconds=0.5)
    overlap = Overlap()
    handlers = overlap.handlers("rated")
    handlers.queue("rated", rate=Rate(40, period))
    jobs = [Job(job_type="work", queue="rated", arguments={"n": n}) for n in range(150)]
    async with running_workers(new_worker, handlers, 3, queues={"rated": 4}):
        await enqueue_many(jobs)
        await eventually(lambda: len(overlap.done) == len(jobs), within=WAIT_S)
    times = [c["claimed_at"] for c in await claim_log.claims(claims, "rated")]
    assert len(times) == len(jobs)
    assert claim_log.max_starts_in_window(times, period) <= 40
    grants = "SELECT count(*) FROM job_rate WHERE queue = 'rated' AND until IS NOT NULL"
    assert await claims.fetchval(grants) > 0


async def test_limits_far_from_binding_cost_a_turn_once_in_many_claims(
    new_worker: NewWorker, claims: Connection
) -> None:
    """Every kind of limit, none near: one worker of 16 slots drains 2,000 jobs, taking a turn
    once in several claims (a turn at each claim would write a start row each), and every start
    is counted in the queue's start rows (turns' and grants'). The claims are told apart in the
    journal by their time: each claim stamps its jobs with its own."""
    overlap = Overlap()
    handlers = overlap.handlers("far")
    handlers.queue(
        "far",
        max_running=10_000,
        max_running_per_key=1_000,
        rate=Rate(1_000_000, SECOND),
        rate_per_key=Rate(100_000, SECOND),
    )
    jobs = [
        Job(
            job_type="work",
            queue="far",
            arguments={"n": n, "key": f"k{n % 20}"},
            concurrency_key=f"k{n % 20}",
        )
        for n in range(2000)
    ]
    async with running_workers(new_worker, handlers, 1, queues={"far": 16}) as (worker,):
        await enqueue_many(jobs)
        await eventually(lambda: len(overlap.done) == len(jobs), within=WAIT_S)
    rows = await claims.fetch(
        "SELECT n, until IS NOT NULL AS grant FROM job_rate"
        " WHERE queue = 'far' AND concurrency_key = ''"
    )
    kinds = Counter(r["grant"] for r in rows)
    assert kinds[True] > 0
    made = len({c["claimed_at"] for c in await claim_log.claims(claims, "far")})
    assert len(rows) * 3 < made, (kinds, made)
    assert sum(r["n"] for r in rows) >= len(jobs)  # no start left out of the counts
    assert worker.counts["claimed"] == len(jobs)


async def test_a_claim_under_a_grant_never_holds_a_lock_another_turn_waits_for(
    conn: Connection, database: Database
) -> None:
    """Queues `first` and `second` (in the turns' order). Claim Y takes the turns of both; claim
    X holds a grant in `second` and takes the turn of `first`. With `first`'s turn held
    elsewhere, Y waits for it, then X. Had X taken `second`'s lock shared before waiting (in
    the claim's first step), Y, once it had `first`, would wait for X's lock on `second` and X
    for Y's on `first`: a deadlock, one claim failed. Both claim."""
    specs = [QueueSpec("first", max_running=100), QueueSpec("second", max_running=100)]
    for spec in specs:
        await fill(conn, spec, 6)
    ids = {r["name"]: r["id"] for r in await conn.fetch("SELECT name, id FROM job_queue")}
    assert ids["first"] < ids["second"]

    async def waiting(claims: int) -> bool | None:
        """Whether `claims` claims wait for the turn of `first` (None: not yet)."""
        count = await conn.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = $1"
            " AND objid = $2 AND NOT granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            TURN_LOCK,
            ids["first"],
        )
        return count >= claims or None

    async def both(worker_id: int, grant: datetime | None) -> Claimed:
        now = clock.now()
        async with database.pool.acquire() as claimer:
            return await store.record_and_claim(
                claimer,
                [],
                worker_id=worker_id,
                max_jobs={"first": 2, "second": 2},
                now=now,
                lease_expires_at=now + timedelta(minutes=5),
                grants={"second": grant} if grant else None,
            )

    async with database.pool.acquire() as turn, turn.transaction():
        await turn.execute("SELECT pg_advisory_xact_lock($1, $2)", TURN_LOCK, ids["first"])
        y = asyncio.create_task(both(2, None))
        await eventually(lambda: waiting(1), within=WAIT_S)
        x = asyncio.create_task(both(3, clock.now() + timedelta(hours=1)))
        await eventually(lambda: waiting(2), within=WAIT_S)
    claimed = await asyncio.wait_for(asyncio.gather(x, y), WAIT_S)
    assert [Counter(j.queue for j in c.jobs) for c in claimed] == [Counter(first=2, second=2)] * 2


async def test_a_turn_takes_its_lock_whole_and_a_claim_under_a_grant_shared(
    conn: Connection,
) -> None:
    """Within the claim's transaction: a turn holds its queue's lock exclusive only (had it
    taken the lock shared first, two turns would each wait for the other's shared lock to
    become exclusive: a deadlock), a claim under a grant shared only."""
    await fill(conn, QueueSpec(QUEUE, max_running=100), 8)
    held = (
        "SELECT array_agg(mode ORDER BY mode) FROM pg_locks WHERE locktype = 'advisory'"
        " AND classid = $1 AND pid = pg_backend_pid()"
    )
    for grant, modes in ((None, ["ExclusiveLock"]), (clock.now() + SECOND * 3600, ["ShareLock"])):
        async with conn.transaction():
            claimed = await claim(conn, 2, clock.now(), worker_id=1, grant=grant)
            assert len(claimed.jobs) == 2
            assert await conn.fetchval(held, TURN_LOCK) == modes
