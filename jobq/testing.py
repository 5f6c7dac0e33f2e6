"""Helpers for the tests of code that uses jobq, against the real database: run the ripe jobs
inline until none is left (`drain`), move a frozen clock and run what ripens on the way
(`advance`), and check what is queued (`assert_enqueued`, `assert_not_enqueued`, `enqueued`).

    with freeze_time(T0, real_asyncio=True) as frozen:
        await signup(...)  # enqueues "greet" now and "follow_up" in a day
        await assert_enqueued("greet", arguments={"user_id": 1})
        assert await drain() == {"completed": 1}
        assert await advance(frozen, timedelta(days=1)) == {"completed": 1}

The jobs run in a real `jobq.queue.Worker`, started for the call and stopped at its end, on the
calling event loop: the same claim, handlers, timeouts, retries with backoff and dead letter as
in production. Only the waiting is gone: a round claims what is ripe at `jobq.clock.now()`,
runs it and records its outcomes before the next round claims. The helpers find the `Database`
bound in the caller's context (`jobq.db.bind`; jobq's own test fixture binds it) unless given
one. Freeze the clock with freezegun's `freeze_time(..., real_asyncio=True)`, so that asyncio
keeps real time (timeouts, sleeps) while `jobq.clock.now()` stays where the test puts it.

Like procrastinate's `testing.py` and Oban's `drain_jobs` and `assert_enqueued`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any, Protocol

from jobq import clock, db
from jobq.config import Settings
from jobq.db import Database
from jobq.queue import Registry, Worker, registry, sql, store
from jobq.queue.model import Verdict

DEFAULT_MAX_ROUNDS = 100
"""Rounds one call may take before it calls the queue a runaway (`NotDrained`)."""

MAX_LISTED = 20
"""How many queued jobs an assertion's message lists."""


class NotDrained(AssertionError):
    """Jobs were still ripe after the last round allowed: a job that enqueues itself, or snoozes
    without end? (Or a bigger backlog than `max_rounds` rounds run: raise it.)"""


class FrozenClock(Protocol):
    """What `advance` needs of a frozen clock: `move_to(aware datetime)`, as the object that
    freezegun's `freeze_time(...)` gives (`with freeze_time(T0, real_asyncio=True) as frozen`)."""

    def move_to(self, target_datetime: datetime, /) -> object: ...


async def drain(
    *,
    database: Database | None = None,
    handlers: Registry = registry,
    settings: Settings | None = None,
    state: dict[str, Any] | None = None,
    max_rounds: int = DEFAULT_MAX_ROUNDS,
) -> Counter[str]:
    """Run every ripe job (`ripe_at <= jobq.clock.now()`) to its outcome, round after round,
    until a round finds none; the jobs that a run enqueues ripe run too, those that ripen later
    (a retry's backoff, a `Snooze`, `runs_in(...)`) stay queued. Return the outcomes recorded:
    a `Counter` of `completed`, `retried`, `snoozed`, `buried` (and `rejected` or `lost_acks`
    should recording an outcome go wrong), which compares equal to a plain dict:
    `assert await drain() == {"completed": 2}`.

    The worker serves the queues of `handlers` (default: the process's registry): a job of
    another queue, of a paused queue, or held back by a queue's limits stays queued; a job
    without a handler goes to the dead letter, as in production. `settings` default to
    `Settings()` (the environment's, as a worker process reads them): they give the slots per
    round, the timeouts and the backoff. `state` is the handlers' `JobContext.state` (default:
    `{"settings": settings}`; jobq's own handlers want `jobq.jobs.job_state(settings)`). A
    round claims up to the worker's free slots of each queue.

    Raises: `NotDrained` (an `AssertionError`) when jobs are still ripe after `max_rounds`
    rounds that found some, with what is ripe in its message; `RuntimeError` inside a
    transaction (a worker cannot see its uncommitted jobs) or when no `Database` is bound;
    `asyncpg.PostgresError` / `OSError` when the database fails.
    """
    async with _worker(database, handlers, settings, state) as worker:
        await _run_ripe(worker, max_rounds, max_rounds)
        return _outcomes(worker)


async def advance(
    frozen: FrozenClock,
    by: timedelta | float,
    *,
    database: Database | None = None,
    handlers: Registry = registry,
    settings: Settings | None = None,
    state: dict[str, Any] | None = None,
    max_rounds: int = DEFAULT_MAX_ROUNDS,
) -> Counter[str]:
    """Move the frozen clock `by` (a `timedelta`, or seconds) forward, running each job at the
    moment it ripens on the way, and return the outcomes recorded, as `drain` does.

    It drains what is ripe now, then moves the clock to the next `ripe_at` (or the moment a
    full rate window of a served queue opens: `jobq.queue.store.next_ripe_at`) and drains
    again, until the next one lies beyond `now + by`; the clock ends at `now + by`, where what
    is ripe is drained. So a handler sees `jobq.clock.now()` equal to its job's `ripe_at`, and
    a job that ripens meanwhile (a retry after its backoff, a job enqueued for later) runs in
    the same call. Every move of the clock counts as a round of `max_rounds` too.

    Raises: `ValueError` when `by` is negative; as `drain` otherwise.
    """
    step = by if isinstance(by, timedelta) else timedelta(seconds=by)
    if step < timedelta(0):
        raise ValueError(f"the clock only moves forward, not by {step}")
    until = clock.now() + step
    async with _worker(database, handlers, settings, state) as worker:
        rounds_left = await _run_ripe(worker, max_rounds, max_rounds)
        while True:
            async with worker.database.pool.acquire() as conn:
                upcoming = await store.next_ripe_at(
                    conn, now=clock.now(), queues=list(worker.slots.capacity)
                )
            if upcoming is None or upcoming >= until:
                break
            if rounds_left == 0:
                raise await _not_drained(worker, max_rounds)
            frozen.move_to(upcoming)
            rounds_left = await _run_ripe(worker, rounds_left - 1, max_rounds)
        frozen.move_to(until)
        await _run_ripe(worker, rounds_left, max_rounds)
        return _outcomes(worker)


async def enqueued(
    job_type: str | None = None,
    *,
    arguments: Mapping[str, Any] | None = None,
    queue: str | None = None,
    ripe_at: datetime | None = None,
    database: Database | None = None,
) -> list[dict[str, Any]]:
    """Return the queued jobs (rows of `job`: waiting to run, or for their retry; not running,
    finished nor dead) that match, earliest `ripe_at` first, each a dict of `id`, `job_type`,
    `arguments`, `queue`, `priority`, `ripe_at` and `created_at` (aware UTC), `attempts`,
    `max_retries`, `last_error`, `concurrency_key`.

    Each filter given must hold: `job_type` and `queue` equal; `arguments` a subset of the
    job's arguments (every key given is there with an equal value; other keys may be there
    too; `{}` matches any); `ripe_at` equal (an aware datetime).

    Reads through the transaction in progress in this context when there is one (so a test
    inside a transaction sees its own uncommitted jobs), else through `database` or the bound
    one. Raises: `RuntimeError` when neither is there.
    """
    rows = await _queued(database, job_type)
    return [
        row
        for row in rows
        if (queue is None or row["queue"] == queue)
        and (ripe_at is None or row["ripe_at"] == ripe_at)
        and (arguments is None or _contains(row["arguments"], arguments))
    ]


async def assert_enqueued(
    job_type: str,
    *,
    arguments: Mapping[str, Any] | None = None,
    queue: str | None = None,
    ripe_at: datetime | None = None,
    database: Database | None = None,
) -> list[dict[str, Any]]:
    """Assert that at least one queued job matches (the filters of `enqueued`) and return the
    matching jobs (`[job] = await assert_enqueued(...)` when there is one).

    Raises: `AssertionError` naming what was looked for and listing the jobs that are queued.
    """
    found = await enqueued(
        job_type, arguments=arguments, queue=queue, ripe_at=ripe_at, database=database
    )
    if not found:
        wanted = _describe_filters(job_type, arguments, queue, ripe_at)
        queued = await enqueued(database=database)
        raise AssertionError(f"no queued job {wanted}; {_list('queued', queued)}")
    return found


async def assert_not_enqueued(
    job_type: str,
    *,
    arguments: Mapping[str, Any] | None = None,
    queue: str | None = None,
    ripe_at: datetime | None = None,
    database: Database | None = None,
) -> None:
    """Assert that no queued job matches (the filters of `enqueued`).

    Raises: `AssertionError` listing the jobs that match.
    """
    found = await enqueued(
        job_type, arguments=arguments, queue=queue, ripe_at=ripe_at, database=database
    )
    if found:
        wanted = _describe_filters(job_type, arguments, queue, ripe_at)
        raise AssertionError(f"expected no queued job {wanted}; {_list('found', found)}")


# -- the worker's rounds -------------------------------------------------------------------


@asynccontextmanager
async def _worker(
    database: Database | None,
    handlers: Registry,
    settings: Settings | None,
    state: dict[str, Any] | None,
) -> AsyncIterator[Worker]:
    """A started worker, stopped hard at the end (nothing runs by then unless the caller was
    cancelled: its jobs go back to the queue)."""
    if db.current_transaction() is not None:
        raise RuntimeError(
            "drain/advance inside a transaction: the worker cannot see its uncommitted jobs"
        )
    settings = settings if settings is not None else Settings()
    worker = Worker(
        database or db.current_database(),
        settings,
        handlers=handlers,
        state=state if state is not None else {"settings": settings},
    )
    await worker.start()
    try:
        yield worker
    finally:
        await worker.abort()


async def _run_ripe(worker: Worker, rounds_left: int, max_rounds: int) -> int:
    """Claim and run what is ripe, one round after another, until a round claims nothing and
    records no outcome (an outcome recorded by a round's claim may move jobs that waited for it
    into the queue: `jobq.queue.flow`); return the rounds left. Raises `NotDrained` when a
    round claims with none left."""
    while True:
        recorded = sum(worker.counts[v.counted] for v in Verdict)
        worker.wakeups.wake()  # a round by hand looks at every queue (no notification comes)
        claimed = await worker.run_once()
        await worker.wait_idle()
        if not claimed and sum(worker.counts[v.counted] for v in Verdict) == recorded:
            return rounds_left
        if rounds_left == 0:
            raise await _not_drained(worker, max_rounds)
        rounds_left -= 1


async def _not_drained(worker: Worker, max_rounds: int) -> NotDrained:
    async with worker.database.pool.acquire() as conn:
        ripe = await sql.job_ripe_counts.fetch(conn, now=clock.now())
    still = ", ".join(f"{r['job_type']} x{r['n']}" for r in ripe) or "none"
    return NotDrained(
        f"the queue did not settle within max_rounds={max_rounds} rounds: a job that enqueues "
        f"itself, or snoozes, without end? Outcomes so far: {dict(_outcomes(worker))}; "
        f"ripe now: {still}"
    )


def _outcomes(worker: Worker) -> Counter[str]:
    return Counter({k: n for k, n in worker.counts.items() if k != "claimed" and n})


# -- reading the queue ---------------------------------------------------------------------


async def _queued(database: Database | None, job_type: str | None) -> list[dict[str, Any]]:
    tx = db.current_transaction()
    if database is None and tx is not None:
        return [dict(r) for r in await sql.job_queued.fetch(tx.conn, job_type=job_type)]
    async with (database or db.current_database()).pool.acquire() as conn:
        return [dict(r) for r in await sql.job_queued.fetch(conn, job_type=job_type)]


def _contains(job_arguments: Any, wanted: Mapping[str, Any]) -> bool:
    return isinstance(job_arguments, dict) and all(
        key in job_arguments and job_arguments[key] == value for key, value in wanted.items()
    )


def _describe_filters(
    job_type: str, arguments: Mapping[str, Any] | None, queue: str | None, ripe_at: datetime | None
) -> str:
    parts = [repr(job_type)]
    if arguments is not None:
        parts.append(f"with arguments including {dict(arguments)!r}")
    if queue is not None:
        parts.append(f"in queue {queue!r}")
    if ripe_at is not None:
        parts.append(f"ripe at {_time(ripe_at)}")
    return " ".join(parts)


def _list(heading: str, jobs: list[dict[str, Any]]) -> str:
    if not jobs:
        return "the queue is empty"
    lines = [
        f"  #{j['id']} {j['job_type']} {j['arguments']!r} queue={j['queue']} "
        f"ripe_at={_time(j['ripe_at'])} attempts={j['attempts']}"
        for j in jobs[:MAX_LISTED]
    ]
    if len(jobs) > MAX_LISTED:
        lines.append(f"  ... and {len(jobs) - MAX_LISTED} more")
    return f"{heading} ({len(jobs)}):\n" + "\n".join(lines)


def _time(at: datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")
