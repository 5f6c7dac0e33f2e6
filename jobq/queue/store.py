"""The queue's operations: thin verbs over the statements in `jobq.queue.sql`.

`enqueue` and `enqueue_many` join the transaction in progress (or open their own); the
worker's operations take an explicit connection and run as single autocommit statements.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from jobq import clock
from jobq.db import (
    Connection,
    Database,
    current_database,
    current_transaction,
    json_arg,
    write_transaction,
)
from jobq.db import conn as current_conn
from jobq.queue import sql
from jobq.queue.model import ClaimedJob, Enqueued, Job, Outcome
from jobq.queue.notify import notifier

wakeups: set[asyncio.Event] = set()
"""Wake-up events of the workers of this process; set when a transaction that enqueued commits."""


def wake_workers(database: Database) -> None:
    """Wake the workers: those of this process at once (their events), those of every process
    by `NOTIFY jobq` on `database` (coalesced: `jobq.queue.notify`). Call it after the commit
    that put jobs in `job`."""
    for event in wakeups:
        event.set()
    notifier(database).notify()


def _wake_workers_of_this_transaction() -> None:
    wake_workers(current_database())


def wake_workers_after_commit() -> None:
    """Wake the workers once the transaction in progress commits (once per transaction, and
    never when it rolls back); outside a transaction, now."""
    tx = current_transaction()
    if tx is None:
        wake_workers(current_database())
    elif _wake_workers_of_this_transaction not in tx.after_commit:
        tx.after_commit.append(_wake_workers_of_this_transaction)


async def enqueue(job: Job) -> Enqueued:
    """Queue `job` in the transaction in progress and return its id; outside a transaction its
    one statement runs alone (autocommit: one round trip).

    When an identical job (same `job_type` and `arguments`) is queued already, nothing is
    inserted and that job's id is returned with `duplicate=True`. Workers are woken once per
    transaction, after its commit (`wake_workers`): by a `NOTIFY jobq` sent then and, in this
    process, by an event. A job already running does not count as a duplicate and never
    makes this wait.
    Raises: `asyncpg.PostgresError` on database errors.
    """
    if current_transaction() is not None:
        return await _enqueue(current_conn(), job)
    async with current_database().pool.acquire() as conn:
        return await _enqueue(conn, job)


async def _enqueue(conn: Connection, job: Job) -> Enqueued:
    for _ in range(3):
        row = await conn.fetchrow(
            sql.job_enqueue,
            job.job_type,
            job.arguments,
            job.ripe_at,
            job.priority,
            job.max_retries,
            clock.now(),
        )
        if row is not None:
            break
        # The identical job committed while we waited on its index entry, or was claimed
        # between the conflict and the lookup: try again with a fresh snapshot.
    else:
        raise RuntimeError("enqueue did not settle after 3 tries")
    if not row["duplicate"]:
        wake_workers_after_commit()
    return Enqueued(id=row["id"], duplicate=row["duplicate"])


@write_transaction
async def enqueue_many(jobs: Iterable[Job]) -> list[int]:
    """Queue many jobs in one statement; return the ids of those that were not duplicates.

    Joins the transaction in progress like `enqueue`. Duplicates (of queued jobs or within
    the batch) are skipped. Raises: `asyncpg.PostgresError` on database errors.
    """
    batch = list(jobs)
    if not batch:
        return []
    conn = current_conn()
    rows = await conn.fetch(
        sql.job_enqueue_many,
        [j.job_type for j in batch],
        [json_arg(j.arguments) for j in batch],
        [j.ripe_at for j in batch],
        [j.priority for j in batch],
        [j.max_retries for j in batch],
        clock.now(),
    )
    if rows:
        wake_workers_after_commit()
    return [r["id"] for r in rows]


def _outcome_args(outcomes: Sequence[Outcome], now: datetime) -> list[Any]:
    """The parameters $1..$8 of `sql._RECORD` for `outcomes`."""
    completed: list[int] = []
    requeued: tuple[list[int], list[datetime], list[str | None], list[int]] = ([], [], [], [])
    buried: tuple[list[int], list[str | None]] = ([], [])
    for o in outcomes:
        if o.kind == "complete":
            completed.append(o.token)
        elif o.kind == "bury":
            buried[0].append(o.token)
            buried[1].append(o.error)
        else:
            requeued[0].append(o.token)
            requeued[1].append(o.ripe_at if o.ripe_at is not None else now)
            requeued[2].append(o.error if o.kind == "retry" else None)
            requeued[3].append(1 if o.kind == "retry" else 0)
    return [completed, *requeued, *buried, now]


async def claim(
    conn: Connection, *, worker_id: int, max_jobs: int, now: datetime, lease_expires_at: datetime
) -> list[ClaimedJob]:
    """Move up to `max_jobs` ripe jobs (`ripe_at <= now`) from `job` to `job_running` in one
    statement (highest priority, then earliest ripe_at; rows locked by another claim are
    skipped) and return them, each with a new fencing token."""
    jobs, _ = await record_and_claim(
        conn, [], worker_id=worker_id, max_jobs=max_jobs, now=now, lease_expires_at=lease_expires_at
    )
    return jobs


async def record_and_claim(
    conn: Connection,
    outcomes: Sequence[Outcome],
    *,
    worker_id: int,
    max_jobs: int,
    now: datetime,
    lease_expires_at: datetime,
) -> tuple[list[ClaimedJob], set[int]]:
    """Record `outcomes` (as `record` does) and claim up to `max_jobs` (as `claim` does) in one
    statement, so that the jobs whose outcome is recorded free the slots the claim fills.
    Return the claimed jobs and the tokens of `outcomes` that were recorded.

    Raises: `asyncpg.PostgresError` (then nothing happened).
    """
    claiming = (max_jobs, worker_id, lease_expires_at)
    if all(o.kind == "complete" for o in outcomes):
        rows = await conn.fetch(sql.job_claim, [o.token for o in outcomes], now, *claiming)
    else:
        rows = await conn.fetch(sql.job_claim_recording, *_outcome_args(outcomes, now), *claiming)
    jobs = [
        ClaimedJob(
            id=r["id"],
            job_type=r["job_type"],
            arguments=r["arguments"],
            attempts=r["attempts"],
            max_retries=r["max_retries"],
            token=r["token"],
            ripe_at=r["ripe_at"],
            claimed_at=r["claimed_at"],
        )
        for r in rows
        if r["id"] is not None
    ]
    return jobs, {r["token"] for r in rows if r["id"] is None}


async def record(conn: Connection, outcomes: Sequence[Outcome], *, now: datetime) -> set[int]:
    """Record the outcomes of many claimed jobs in one statement (`sql.job_record`) and return
    the tokens that were still held; a rescued job's stale token matches nothing.

    A re-queued job identical to one queued meanwhile is merged into it (`sql._back_to_queue`).
    `now` (aware UTC) stamps `died_at` of buried and merged jobs.
    Raises: `asyncpg.PostgresError` on database errors (then nothing is recorded).
    """
    rows = await conn.fetch(sql.job_record, *_outcome_args(outcomes, now))
    return {r["token"] for r in rows}


async def complete(conn: Connection, tokens: list[int]) -> int:
    """Record the success of the jobs claimed with `tokens`: they leave `job_running`.
    Return how many were still held (a rescued job's stale token matches nothing)."""
    outcomes = [Outcome(token, "complete") for token in tokens]
    return len(await record(conn, outcomes, now=clock.now()))


async def retry(
    conn: Connection, token: int, *, ripe_at: datetime, error: str, now: datetime
) -> bool:
    """Record a failed attempt: back to `job` with one more attempt, `ripe_at` and `error`
    (merged into an identical job queued meanwhile, if any; see `sql._back_to_queue`).
    Return False when the token is stale (the job was rescued meanwhile)."""
    return bool(await record(conn, [Outcome(token, "retry", ripe_at, error)], now=now))


async def release(conn: Connection, token: int, *, now: datetime) -> bool:
    """Put a claimed job back in `job`, ripe at `now`, without charging an attempt (used when a
    worker stops). Return False when the token is stale."""
    return bool(await record(conn, [Outcome(token, "release", now)], now=now))


async def bury(conn: Connection, token: int, *, now: datetime, error: str) -> bool:
    """Move a claimed job to the dead letter (`job_dead`) with `error`, charging the attempt.
    Return False when the token is stale."""
    return bool(await record(conn, [Outcome(token, "bury", error=error)], now=now))


async def rescue(conn: Connection, *, now: datetime, heartbeat_grace: timedelta) -> int:
    """Return the jobs of dead and hung workers to `job`, ripe at `now`, charging an attempt;
    those out of retries go to `job_dead`. Also forget dead workers' rows. Return how many
    jobs were rescued.

    Dead: no liveness lock, and either no session of its process is left or its last
    heartbeat is older than `heartbeat_grace` (a worker whose listener alone dropped keeps its
    jobs while it reconnects). Hung: its leases expired before `now`.
    """
    count: int = await conn.fetchval(
        sql.job_rescue, now, heartbeat_grace, "worker lost while running the job"
    )
    return count


async def release_orphans(
    conn: Connection, *, worker_id: int, held: Sequence[int], now: datetime
) -> int:
    """Put back in the queue the jobs of `job_running` claimed for `worker_id` whose tokens are
    not in `held`: claims that committed while their answer was lost with the connection, so
    the worker never started them. They keep their place and no attempt is charged (merged into
    a queued twin if any, as on a release). Return how many. Call it with no claim in flight."""
    count: int = await conn.fetchval(sql.job_release_orphans, worker_id, list(held), now)
    return count


async def next_ripe_at(conn: Connection, *, now: datetime) -> datetime | None:
    """Return the earliest `ripe_at` after `now` among queued jobs, or None."""
    value: datetime | None = await conn.fetchval(sql.job_next_ripe_at, now)
    return value


async def stats(conn: Connection, *, now: datetime) -> list[dict[str, Any]]:
    """Return per job type: `ripe` and `scheduled` queued jobs, `running`, `dead`."""
    return [dict(r) for r in await conn.fetch(sql.job_stats, now)]


async def vacuum_stats(conn: Connection, *, now: datetime) -> dict[str, Any]:
    """Return what an operator needs to see the vacuum horizon pinned: `oldest_transaction_s`,
    the age in seconds at `now` of the oldest transaction open in this database other than
    ours (None when there is none), and `tables`: per queue table (`job`, `job_dead`,
    `job_running`) `n_live_tup`, `n_dead_tup` and `last_autovacuum_at` (None if never), from
    `pg_stat_user_tables`, which lags the tables by up to a second or so."""
    oldest: float | None = await conn.fetchval(sql.job_stats_oldest_transaction, now)
    tables = [dict(r) for r in await conn.fetch(sql.job_stats_tables)]
    return {"oldest_transaction_s": oldest, "tables": tables}
