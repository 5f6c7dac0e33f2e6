"""How a claim writes its starts (`job_rate`, sql/schema.sql), and that a key's
starts are counted whichever way they were written.

A claim that no key's rate can stop (the queue's starts within the key period plus the claim's
budget stay within the key rate) writes one row, its keys folded into it; a claim near a key's
rate writes a row per key. A key's count is the sum of both: its starts just after a folded
claim hold it back, and the idle worker's timer knows when they leave its window.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from jobq import db
from jobq.db import Connection, Database
from jobq.queue import ClaimedJob, Job, enqueue_many, limits, store
from jobq.queue.registry import QueueSpec, Rate
from tests.claim_log import max_starts_in_window

T0 = datetime(2030, 7, 1, 8, 0, tzinfo=UTC)
LEASE = timedelta(minutes=5)
QUEUE = "rows"
SECOND = timedelta(seconds=1)


async def claim_at(
    conn: Connection, now: datetime, free: int, worker_id: int = 1
) -> list[ClaimedJob]:
    return await store.claim(
        conn, worker_id=worker_id, max_jobs={QUEUE: free}, now=now, lease_expires_at=now + LEASE
    )


async def enqueue_keyed(keys: Sequence[str | None]) -> None:
    """One ripe job per item of `keys`, in that order in the line."""
    await enqueue_many(
        [
            Job(job_type="noop", arguments={"n": n}, queue=QUEUE, concurrency_key=key).runs_at(
                T0 - timedelta(minutes=1) + n * timedelta(milliseconds=1)
            )
            for n, key in enumerate(keys)
        ]
    )


async def rate_rows(conn: Connection) -> list[tuple[str, int, list[str] | None]]:
    rows = await conn.fetch(
        "SELECT concurrency_key, n, keys FROM job_rate WHERE queue = $1 ORDER BY seq, 1", QUEUE
    )
    return [(r["concurrency_key"], r["n"], r["keys"] and sorted(r["keys"])) for r in rows]


async def test_a_claim_that_no_key_can_stop_writes_one_row_with_its_keys(
    conn: Connection,
) -> None:
    spec = QueueSpec(
        QUEUE,
        max_running=100,
        max_running_per_key=50,
        rate=Rate(1000, SECOND),
        rate_per_key=Rate(100, SECOND),
    )
    await limits.declare_queues(conn, [spec])
    await enqueue_keyed(["a", "b", None, "a", "c", "a", None, "b"] * 3)
    claimed = await claim_at(conn, T0, 16)
    assert len(claimed) == 16
    keys = sorted(j.concurrency_key for j in claimed if j.concurrency_key is not None)
    assert await rate_rows(conn) == [("", 16, keys)]


async def test_starts_folded_into_one_row_hold_their_key_back_until_they_leave_its_window(
    conn: Connection,
) -> None:
    await limits.declare_queues(conn, [QueueSpec(QUEUE, rate_per_key=Rate(3, SECOND))])
    await enqueue_keyed(["k"] * 6 + ["j"] * 4)
    # 0 starts + a budget of 3 cannot exceed 3 per key: one row, the keys folded
    first = await claim_at(conn, T0, 3)
    assert [j.concurrency_key for j in first] == ["k"] * 3
    assert await rate_rows(conn) == [("", 3, ["k", "k", "k"])]
    # now a key could reach its rate: k's 3 folded starts hold it back, j starts, counted per key
    second = await claim_at(conn, T0 + SECOND / 2, 4)
    assert [j.concurrency_key for j in second] == ["j"] * 3
    assert (await rate_rows(conn))[1:] == [("", 3, None), ("j", 3, None)]
    # the idle worker's timer: k's window opens when its folded starts leave it
    later = T0 + SECOND / 2
    assert await store.next_ripe_at(conn, now=later, queues=[QUEUE]) == T0 + SECOND
    assert await claim_at(conn, T0 + SECOND * 0.99, 4) == []
    third = await claim_at(conn, T0 + SECOND, 4)
    assert [j.concurrency_key for j in third] == ["k"] * 3


async def test_a_key_filled_by_one_folded_claim_is_a_full_window_for_the_timer(
    conn: Connection,
) -> None:
    """Every start of the window is of one key: the folded row alone fills the key's window."""
    await limits.declare_queues(conn, [QueueSpec(QUEUE, rate_per_key=Rate(2, SECOND))])
    await enqueue_keyed(["k"] * 3)
    assert len(await claim_at(conn, T0, 2)) == 2
    assert await rate_rows(conn) == [("", 2, ["k", "k"])]
    assert await store.next_ripe_at(conn, now=T0, queues=[QUEUE]) == T0 + SECOND


async def test_per_key_rates_hold_when_claims_switch_between_the_two_ways(
    conn: Connection, database: Database
) -> None:
    """Four connections claim at once, round after round, on a clock that moves a little:
    claims fold their keys while the queue's window is quiet and write per-key rows when it
    fills, and no key ever starts more than its rate in any window of its period."""
    period = timedelta(seconds=2)
    max_per_key = 6
    spec = QueueSpec(QUEUE, rate=Rate(40, SECOND), rate_per_key=Rate(max_per_key, period))
    await limits.declare_queues(conn, [spec])
    keys = [f"k{n % 5}" for n in range(600)]
    await enqueue_keyed(list(keys))
    claimers = [await db.connect(database.direct_dsn) for _ in range(4)]
    starts: list[ClaimedJob] = []
    try:
        now = T0
        for n in range(48):
            # bursts of 12 rounds 150 ms apart, each after a quiet 2.5 s: the queue's window
            # empties (claims fold their keys), then fills (claims write per-key rows)
            now += timedelta(milliseconds=2500 if n % 12 == 0 else 150)
            rounds = await asyncio.gather(
                *(claim_at(c, now, 2, worker_id=w) for w, c in enumerate(claimers, 1))
            )
            starts += [j for claimed in rounds for j in claimed]
    finally:
        for c in claimers:
            await c.close()
    by_key: dict[str, list[datetime]] = {}
    for job in starts:
        assert job.concurrency_key is not None
        by_key.setdefault(job.concurrency_key, []).append(job.claimed_at)
    assert max(max_starts_in_window(t, period) for t in by_key.values()) == max_per_key
    kinds = Counter(
        "folded" if r[2] else ("queue" if r[0] == "" else "key") for r in await rate_rows(conn)
    )
    # both ways were taken
    assert kinds["folded"] > 0, kinds
    assert kinds["key"] > 0, kinds
