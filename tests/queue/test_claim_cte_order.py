"""What the limited claim's "busy-queue exemption" did, driven step by step, and that the claim
cannot do it.

Revision 6d4acc2^ let a limited queue take its turn when some of its jobs ended in the claim:
`EXISTS (SELECT FROM completed AS c WHERE c.queue = u.name)` in CTE `q` of the claim statement
(kept whole in `claim_6d4acc2_statement.sql`, run on that revision's tables and functions,
`claim_6d4acc2_schema.sql`). With it, the journal of `make chaos`'s limits scenario
(`tests/chaos/journal.py`) held 4 claims of a key whose limit is 2. The steps:

1. Reading CTE `completed` in `q` runs the DELETE of the worker's finished jobs from
   `job_running` before CTE `turns`: PostgreSQL runs a data-modifying CTE as far as its readers
   need, and the generic plan of the worker's claim session hashes that EXISTS, which reads
   `completed` to its end (a custom plan stops at its first row: one finished job, not all).
2. `job_claimable` is VOLATILE: its statements take snapshots after the turn's lock, with a
   later command id, so they see the claim's own deletions. The finished jobs no longer count,
   and the turn gives their key's slots to the key's next jobs, in the same statement.
3. That much is exact: the finished jobs leave and the new ones arrive at one commit, and no
   other session ever sees more than the limit (another turn waits for the lock; a reader sees
   the finished jobs until the commit). But the journal stamps rows with `clock_timestamp()` in
   AFTER STATEMENT triggers, which fire at the end of the statement; in the claim that records a
   failure too (three DELETEs from `job_running`) the departures are stamped after the claims.
   So for some microseconds inside one transaction the journal shows the key's 2 finished jobs
   and its 2 new ones: 4.

The 4 was the journal's, not the queue's: stamped one instant per transaction, as the journal
now reads its rows, it is 2. The test drives the same round against each claim in `CLAIMS` (a
turn held by another session while two workers wait for it, then let go): the kept claim shows
the 4 by the rows' own stamps; no claim lets another session see more than the limit, nor the
journal read one instant per transaction. The current claim is exact by construction: its turn
counts, chooses and moves in statements of one function (`job_claim_turns`), in that order.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from jobq import clock, db
from jobq.db import Connection, Database
from jobq.queue import Job, enqueue_many, limits, store
from jobq.queue.listener import CLAIM_SESSION
from jobq.queue.model import Outcome, Verdict
from jobq.queue.registry import QueueSpec
from tests.chaos import journal
from tests.claim_log import max_overlap
from tests.toolkit.procs import eventually

KEPT_SCHEMA = "claim_6d4acc2"
KEPT_TABLES = Path(__file__).with_name("claim_6d4acc2_schema.sql").read_text()
KEPT_STATEMENT = Path(__file__).with_name("claim_6d4acc2_statement.sql").read_text()
KEPT_SESSION = {"plan_cache_mode": "force_generic_plan", "jit": "off", "enable_seqscan": "off"}
"""The settings of the session that claimed at that revision (`jobq.queue.worker.CLAIM_SESSION`
there): its claims ran generic plans."""

QUEUE = "limited"
LIMIT = 2
"""The queue's `max_running_per_key`."""
KEY = "k"
JOBS = [KEY, KEY, "x", KEY, KEY, KEY, KEY]
"""The concurrency keys of the queue's jobs, in their line's order."""
TURN_LOCK = "SELECT pg_advisory_xact_lock(1785684594, id) FROM job_queue WHERE name = $1"
"""Takes a queue's turn as `job_claimable` takes it (a transaction lock), in both schemas."""
LEASE = timedelta(minutes=5)
LATER = timedelta(hours=1)
NEVER = datetime.max.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Round:
    """One worker's claim: the tokens of its jobs that completed and that failed (to retry in
    an hour), and its free slots in the queue, at `now`."""

    worker_id: int
    completed: list[int]
    failed: list[int]
    slots: int
    now: datetime


ClaimFn = Callable[[Connection, Round], Coroutine[Any, Any, list[tuple[int, str | None]]]]
"""Records a round's outcomes and claims; returns the (token, concurrency key) of each job
claimed."""


@dataclass(frozen=True)
class Claim:
    """A way to claim, and the tables it claims from: `prepare` creates the queue (`QUEUE`,
    `LIMIT` per key) and its jobs (`JOBS`) on a connection of `session`; `turn` takes the
    queue's turn (its one parameter: the queue's name) as the claim's own turns take it."""

    name: str
    session: dict[str, str]
    prepare: Callable[[Connection], Awaitable[None]]
    claim: ClaimFn
    turn: str = TURN_LOCK


async def kept_prepare(conn: Connection) -> None:
    await conn.execute(f"CREATE SCHEMA {KEPT_SCHEMA}")  # the connection's search_path
    await conn.execute(KEPT_TABLES)
    await conn.execute(
        "INSERT INTO job_queue (name, max_running_per_key) VALUES ($1, $2)", QUEUE, LIMIT
    )
    now = clock.now()
    for n, key in enumerate(JOBS):
        await conn.execute(
            "INSERT INTO job (job_type, arguments, ripe_at, created_at, queue, concurrency_key,"
            " max_retries) VALUES ('work', $1::jsonb, $2, $2, $3, $4, 3)",
            f'{{"n": {n}}}',
            now - timedelta(seconds=len(JOBS) - n),
            QUEUE,
            key,
        )


async def kept_claim(conn: Connection, r: Round) -> list[tuple[int, str | None]]:
    rows = await conn.fetch(
        KEPT_STATEMENT,
        r.completed,
        r.now,
        [None] * len(r.completed),
        True,
        r.failed,
        [r.now + LATER] * len(r.failed),
        ["failed"] * len(r.failed),
        [1] * len(r.failed),
        [None] * len(r.failed),
        [],
        [],
        [],
        [QUEUE],
        [r.slots],
        r.worker_id,
        r.now + LEASE,
    )
    return [(row["token"], row["concurrency_key"]) for row in rows if row["id"] is not None]


async def current_prepare(conn: Connection) -> None:
    await limits.declare_queues(conn, [QueueSpec(QUEUE, max_running_per_key=LIMIT)])
    now = clock.now()
    await enqueue_many(
        Job(job_type="work", arguments={"n": n}, queue=QUEUE, concurrency_key=key).runs_at(
            now - timedelta(seconds=len(JOBS) - n)
        )
        for n, key in enumerate(JOBS)
    )


async def current_claim(conn: Connection, r: Round) -> list[tuple[int, str | None]]:
    outcomes = [Outcome(token, Verdict.COMPLETE) for token in r.completed]
    outcomes += [
        Outcome(token, Verdict.RETRY, ripe_at=r.now + LATER, error="failed") for token in r.failed
    ]
    claimed = await store.record_and_claim(
        conn,
        outcomes,
        worker_id=r.worker_id,
        max_jobs={QUEUE: r.slots},
        now=r.now,
        lease_expires_at=r.now + LEASE,
    )
    return [(job.token, job.concurrency_key) for job in claimed.jobs]


KEPT = Claim("kept", {"search_path": KEPT_SCHEMA, **KEPT_SESSION}, kept_prepare, kept_claim)
CLAIMS = [Claim("current", CLAIM_SESSION, current_prepare, current_claim)]
"""The claims that must hold the limit in the journal too."""


@dataclass
class Seen:
    """What a round showed: how many of the finished jobs' rows worker A had deleted while it
    waited for the turn; the key's rows in `job_running` as another session saw them (before,
    during and after the round); the keys A and B claimed; and the most claims of the key at
    once in the journal, stamped as its triggers stamp them and one instant per transaction."""

    deleted_before_turn: int
    running: list[int]
    claimed_a: list[str]
    claimed_b: list[str]
    journal_peak: int
    journal_peak_per_transaction: int


@pytest.fixture
async def connect(database: Database) -> AsyncIterator[Callable[[Claim], Awaitable[Connection]]]:
    """Open connections in a claim's session; closed at the end, then the kept tables dropped
    and the journal removed."""
    opened: list[Connection] = []

    async def open_(claim: Claim) -> Connection:
        opened.append(await db.connect(database.direct_dsn, server_settings=claim.session))
        return opened[-1]

    yield open_
    for conn in opened:
        await conn.close()
    admin = await db.connect(database.direct_dsn)
    try:
        await journal.uninstall(admin)
        await admin.execute(f"DROP SCHEMA IF EXISTS {KEPT_SCHEMA} CASCADE")
    finally:
        await admin.close()


async def waits_for_a_lock(conn: Connection, pid: int) -> bool:
    return bool(
        await conn.fetchval(
            "SELECT EXISTS (SELECT FROM pg_locks WHERE pid = $1 AND NOT granted)", pid
        )
    )


async def journal_peaks(conn: Connection) -> tuple[int, int]:
    """The most claims of `KEY` in `job_running` at one instant, by the journal's stamps and
    with each transaction's rows at its first stamp (a claim still running lasts forever)."""
    rows = await conn.fetch(
        "SELECT xid, at, op, token, concurrency_key FROM chaos_journal"
        " WHERE tbl = 'job_running' ORDER BY id"
    )
    first: dict[object, datetime] = {}
    for r in rows:
        first.setdefault(r["xid"], r["at"])
    peaks = []
    for stamp in (lambda r: r["at"], lambda r: first[r["xid"]]):
        spans: dict[int, list[datetime]] = {}
        keyed: set[int] = set()
        for r in rows:
            if r["op"] == "insert":
                spans[r["token"]] = [stamp(r), NEVER]
                if r["concurrency_key"] == KEY:
                    keyed.add(r["token"])
            else:
                spans[r["token"]][1] = stamp(r)
        peaks.append(max_overlap((s, e) for t, (s, e) in spans.items() if t in keyed))
    return peaks[0], peaks[1]


async def drive(claim: Claim, connect: Callable[[Claim], Awaitable[Connection]]) -> Seen:
    """Worker A holds the queue's first 3 jobs (2 of `KEY`, its limit, and one of key x). Another
    session holds the queue's turn while A records that its 2 jobs of `KEY` completed and its x
    job failed and claims 3, and while B claims 2 after it; then it lets the turn go."""
    observer = await connect(claim)
    await claim.prepare(observer)
    await journal.install(observer)
    a, b, holder = await connect(claim), await connect(claim), await connect(claim)
    now = clock.now()
    held = await claim.claim(a, Round(1, [], [], 3, now))
    assert sorted(key or "" for _, key in held) == [KEY, KEY, "x"]
    finished = [token for token, key in held if key == KEY]
    failed = [token for token, key in held if key != KEY]

    def running() -> Awaitable[int]:
        return observer.fetchval(
            "SELECT count(*) FROM job_running WHERE queue = $1 AND concurrency_key = $2",
            QUEUE,
            KEY,
        )

    seen = [await running()]
    async with holder.transaction():
        await holder.execute(claim.turn, QUEUE)
        round_a = asyncio.create_task(claim.claim(a, Round(1, finished, failed, 3, now)))
        await eventually(lambda: waits_for_a_lock(observer, a.get_server_pid()), what="A waits")
        round_b = asyncio.create_task(claim.claim(b, Round(2, [], [], 2, now)))
        await eventually(lambda: waits_for_a_lock(observer, b.get_server_pid()), what="B waits")
        seen.append(await running())
        deleted = await observer.fetchval(
            "SELECT count(*) FROM job_running AS r, pg_stat_activity AS a"
            " WHERE a.pid = $1 AND r.xmax = a.backend_xid AND r.token = ANY($2::bigint[])",
            a.get_server_pid(),
            finished + failed,
        )
    claimed_a, claimed_b = await round_a, await round_b
    seen.append(await running())
    peak, per_transaction = await journal_peaks(observer)
    return Seen(
        deleted,
        seen,
        sorted(key or "" for _, key in claimed_a),
        sorted(key or "" for _, key in claimed_b),
        peak,
        per_transaction,
    )


async def test_the_kept_claim_frees_its_finished_jobs_before_its_turn_and_the_journal_shows_4(
    connect: Callable[[Claim], Awaitable[Connection]],
) -> None:
    seen = await drive(KEPT, connect)
    # its DELETE of the completed jobs ran before the turn (not the failed one's: CTE `failed`
    # is read after the claim)
    assert seen.deleted_before_turn == 2
    # the turn saw them gone and gave their slots to the key's next jobs, in the same statement
    assert seen.claimed_a == [KEY, KEY]
    assert seen.claimed_b == []
    # no session ever saw more than the limit running ...
    assert seen.running == [LIMIT, LIMIT, LIMIT]
    # ... but the journal stamped A's claims before A's departures: 2 + 2 at once
    assert seen.journal_peak == 2 * LIMIT
    assert seen.journal_peak_per_transaction == LIMIT


@pytest.mark.parametrize("claim", CLAIMS, ids=lambda c: c.name)
async def test_the_claim_never_shows_more_than_a_keys_limit_in_the_journal(
    claim: Claim, connect: Callable[[Claim], Awaitable[Connection]]
) -> None:
    seen = await drive(claim, connect)
    # the key's slots passed from the finished jobs to 2 new ones (A's or B's) in this round
    assert (seen.claimed_a + seen.claimed_b).count(KEY) == LIMIT
    assert max(seen.running) <= LIMIT, seen
    # the journal as the chaos scenario reads it (one instant per transaction). By its rows' own
    # stamps the claim can show more: job_claim_turns moves the jobs in a statement of its own,
    # whose trigger fires before the end of the claim statement that deletes the finished ones.
    assert seen.journal_peak_per_transaction <= LIMIT, seen
