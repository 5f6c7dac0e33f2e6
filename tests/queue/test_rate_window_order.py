"""A per-key rate limit when claims reach the database out of the order of their clocks.

A claim's time is its worker's `now`, read before the statement runs; claims of a limited queue
take turns under a lock, so one that waited for the lock can come after a claim whose time is
later (and hosts' clocks differ a little). A claim then counts as starting at the window's last
start (`job_claim_turns`), never before it, so each window's starts stay in order and no window of
the period holds more than the rate. (The chaos limits scenario found the disorder: before, a
claim trimmed the window at its own time and a claim timed earlier over-counted nothing.)
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from jobq.db import Connection
from jobq.queue import ClaimedJob, Job, enqueue_many, limits, store
from jobq.queue.registry import QueueSpec, Rate

T0 = datetime(2030, 6, 1, 12, 0, tzinfo=UTC)
LEASE = timedelta(seconds=30)
QUEUE = "rate_order"
PERIOD = timedelta(seconds=1)


async def claim_at(conn: Connection, now: datetime, worker_id: int, n: int) -> list[ClaimedJob]:
    return await store.claim(
        conn, worker_id=worker_id, max_jobs={QUEUE: n}, now=now, lease_expires_at=now + LEASE
    )


def most_in_a_window(starts: list[datetime]) -> int:
    """The most starts within any half-open window of one period."""
    starts = sorted(starts)
    return max(sum(1 for t in starts if s <= t < s + PERIOD) for s in starts)


async def test_a_claim_timed_before_the_last_one_counts_from_the_last_one(
    conn: Connection,
) -> None:
    await limits.declare_queues(conn, [QueueSpec(QUEUE, rate_per_key=Rate(2, PERIOD))])
    ripe_at = T0 - timedelta(minutes=1)
    jobs = [
        Job(job_type="noop", arguments={"n": n}, queue=QUEUE, concurrency_key="k") for n in range(6)
    ]
    await enqueue_many([j.runs_at(ripe_at) for j in jobs])
    claimed: list[ClaimedJob] = []
    # worker 1 takes the key's 2 starts of [T0, T0 + 1 s)
    claimed += await claim_at(conn, T0, 1, 2)
    assert len(claimed) == 2
    # worker 2's claim, timed T0 + 1.05 s, comes first: its window is (T0 + 0.05, T0 + 1.05]
    claimed += await claim_at(conn, T0 + timedelta(seconds=1.05), 2, 1)
    assert len(claimed) == 3
    # worker 3's claim, timed T0 + 0.5 s (it read its clock, then waited for the turn), counts
    # from T0 + 1.05 s, the window's last start: one more start fits there, and no second
    late = await claim_at(conn, T0 + timedelta(seconds=0.5), 3, 2)
    assert [j.claimed_at for j in late] == [T0 + timedelta(seconds=1.05)]
    claimed += late
    assert most_in_a_window([j.claimed_at for j in claimed]) == 2
    # and a claim at T0 + 1.5 s finds (T0 + 0.5, T0 + 1.5] full: nothing
    assert await claim_at(conn, T0 + timedelta(seconds=1.5), 1, 2) == []
    rows = await conn.fetch("SELECT claimed_at FROM job_running WHERE queue = $1", QUEUE)
    assert most_in_a_window([r["claimed_at"] for r in rows]) == 2
