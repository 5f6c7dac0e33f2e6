"""The claim of a queue with limits against a model of its rule, claim after claim.

The rule (sql/functions/job_claim_turns.sql): a queue's budget is its free slots within
its running limit and its rate; the budget goes to the first ripe jobs of its line (priority,
then ripe_at) whose key has room, each key's allowance (running limit and rate per key) going to
its own first jobs. The claim reads the head of the line, and walks the keys only when the head
is held back; both ways must choose exactly the jobs the rule names. The model below is that
rule in Python, fed with what the test itself claimed and finished; random lines with a few
crowded keys drive both ways (a crowded key's jobs fill the head of the line while it is full).
A per-key limit is checked only when some key could reach it in the claim: with limits that keys
reach now and then (`LOOSE`), claims that skip the checks (and fold their keys into one start
row) alternate with claims that count what those started.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from jobq.db import Connection
from jobq.queue import Job, enqueue_many, limits, store
from jobq.queue.model import Outcome, Verdict
from jobq.queue.registry import QueueSpec, Rate

T0 = datetime(2030, 3, 1, 9, 0, tzinfo=UTC)
LEASE = timedelta(hours=1)
QUEUE = "modelled"
PERIOD = timedelta(seconds=1)
TIGHT = QueueSpec(
    QUEUE,
    max_running=9,
    max_running_per_key=2,
    rate=Rate(12, PERIOD),
    rate_per_key=Rate(3, PERIOD),
)
LOOSE = QueueSpec(
    QUEUE,
    max_running=9,
    max_running_per_key=4,
    rate=Rate(12, PERIOD),
    rate_per_key=Rate(7, PERIOD / 2),
)
"""Limits that keys reach now and then only: some claims skip the per-key checks (and fold
their keys into one start row, `job_rate` in sql/schema.sql), the next ones count them."""
KEYS = ["crowded", "busy", "a", "b", "c", "d", None]
WEIGHTS = [30, 10, 2, 2, 2, 2, 4]
"""Most jobs are of two keys, so that the head of the line is often all held back."""


@dataclass(frozen=True)
class Queued:
    id: int
    priority: int
    ripe_at: datetime
    key: str | None


class Model:
    """What the claim may take, from the jobs queued and what the test claimed and finished."""

    def __init__(self, spec: QueueSpec) -> None:
        assert spec.max_running is not None
        assert spec.max_running_per_key is not None
        assert spec.rate is not None
        assert spec.rate_per_key is not None
        self.max_running, self.max_running_per_key = spec.max_running, spec.max_running_per_key
        self.rate, self.rate_per_key = spec.rate, spec.rate_per_key
        self.starts: list[tuple[datetime, str | None]] = []
        self.running: dict[int, str | None] = {}

    def choose(self, queued: list[Queued], now: datetime, free: int) -> set[int]:
        at = max([now, *(t for t, _ in self.starts)])
        recent = [k for t, k in self.starts if t > at - self.rate.period]
        budget = min(free, self.max_running - len(self.running), self.rate.max_starts - len(recent))
        running = Counter(self.running.values())
        started = Counter(k for t, k in self.starts if t > at - self.rate_per_key.period)
        taken: Counter[str | None] = Counter()
        chosen: set[int] = set()
        for job in line(queued, now):
            if len(chosen) >= budget:
                break
            if job.key is not None:
                allowance = min(
                    self.max_running_per_key - running[job.key],
                    self.rate_per_key.max_starts - started[job.key],
                )
                if taken[job.key] >= allowance:
                    continue
            taken[job.key] += 1
            chosen.add(job.id)
        return chosen


def line(queued: list[Queued], now: datetime) -> list[Queued]:
    """The queue's ripe jobs in the order of its line."""
    return sorted((j for j in queued if j.ripe_at <= now), key=lambda j: (-j.priority, j.ripe_at))


@pytest.mark.parametrize("spec", [TIGHT, LOOSE], ids=["tight", "loose"])
async def test_the_claim_takes_exactly_the_jobs_the_rule_names(
    conn: Connection, spec: QueueSpec
) -> None:
    rng = random.Random(20261123)
    await limits.declare_queues(conn, [spec])
    jobs = []
    for n in range(400):
        key = rng.choices(KEYS, WEIGHTS)[0]
        ripe_at = T0 + timedelta(milliseconds=rng.randrange(-60_000, 20_000))
        job = Job(
            job_type="noop",
            arguments={"n": n},
            queue=QUEUE,
            concurrency_key=key,
            priority=rng.choice([0, 0, 0, 5]),
        )
        jobs.append(job.runs_at(ripe_at))
    await enqueue_many(jobs)

    model = Model(spec)
    tokens: dict[int, int] = {}
    now = T0
    claimed_total = 0
    walked = 0
    for _ in range(150):
        now += timedelta(milliseconds=rng.choice([0, 50, 150, 400]))
        # finish some running jobs: their slots and their keys' slots free up
        done = [i for i in model.running if rng.random() < 0.4]
        if done:
            outcomes = [Outcome(tokens.pop(i), Verdict.COMPLETE) for i in done]
            assert len(await store.record(conn, outcomes, now=now)) == len(done)
            for i in done:
                del model.running[i]
        queued = [
            Queued(r["id"], r["priority"], r["ripe_at"], r["concurrency_key"])
            for r in await conn.fetch(
                "SELECT id, priority, ripe_at, concurrency_key FROM job WHERE queue = $1", QUEUE
            )
        ]
        free = rng.randint(1, 6)
        expected = model.choose(queued, now, free)
        head = {j.id for j in line(queued, now)[: 4 * free]}
        walked += len(head) == 4 * free and not head >= expected

        claimed = await store.claim(
            conn, worker_id=1, max_jobs={QUEUE: free}, now=now, lease_expires_at=now + LEASE
        )
        assert {j.id for j in claimed} == expected, (now, free)
        for started in claimed:
            assert started.claimed_at >= now
            model.starts.append((started.claimed_at, started.concurrency_key))
            model.running[started.id] = started.concurrency_key
            tokens[started.id] = started.token
        claimed_total += len(claimed)

    assert claimed_total > 150  # the claims did take jobs, under every limit
    assert walked > 5  # and the head of the line was held back often enough to walk the keys
    folded, per_key = await conn.fetchrow(
        "SELECT count(*) FILTER (WHERE keys IS NOT NULL),"
        " count(*) FILTER (WHERE concurrency_key <> '') FROM job_rate"
    ) or (0, 0)
    # both ways of writing a claim's starts were taken
    assert folded > 0
    assert per_key > 0
