"""The queue's operations: thin verbs over the statements in `jobq.queue.sql`.

`enqueue` and `enqueue_many` join the transaction in progress (or open their own); the
worker's operations take an explicit connection and run as single autocommit statements.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from jobq import clock, tracing
from jobq.db import Connection, current_database, current_transaction, json_arg, write_transaction
from jobq.db import conn as current_conn
from jobq.errors import DuplicateJob
from jobq.queue import metrics, sql
from jobq.queue.model import ClaimedJob, Enqueued, Job, Outcome, Unique, Verdict
from jobq.queue.registry import DEFAULT_QUEUE, Registry, registry
from jobq.queue.wakeup import wake_workers_after_commit

Slots = int | Mapping[str, int]
"""Free slots to claim into: per queue, or an int for the `default` queue alone."""


async def enqueue(job: Job, *, handlers: Registry = registry) -> Enqueued:
    """Queue `job` in the transaction in progress and return its id; outside a transaction its
    one statement runs alone (autocommit: one round trip).

    When the job has a twin (its `Unique`, else its handler's: by default an identical job,
    same `job_type` and `arguments`, queued), nothing is inserted and the twin's id is returned
    with `duplicate=True`; by default a queued twin due later is moved to this job's `ripe_at`
    (never postponed). Workers are woken once per transaction, after its commit
    (`jobq.queue.wakeup.wake_workers`): by a `NOTIFY jobq` sent then and, in this process, by
    an event.
    `handlers` tells a job that names no `queue`, `max_retries` or `unique` its handler's
    (default: the process's registry).
    Raises: `DuplicateJob` when the twin's `Unique.on_conflict` is `raise`;
    `asyncpg.PostgresError` on database errors.
    """
    if current_transaction() is not None:
        return await _enqueue(current_conn(), job, handlers)
    async with current_database().pool.acquire() as conn:
        return await _enqueue(conn, job, handlers)


def queue_of(job: Job, handlers: Registry = registry) -> str:
    """The queue `job` goes to: its own `queue`, else its handler's, else `default`."""
    return job.queue if job.queue is not None else handlers.queue_of(job.job_type)


def max_retries_of(job: Job, handlers: Registry = registry) -> int:
    """`job`'s retries: its own `max_retries`, else its handler's, else the default (5)."""
    return job.max_retries if job.max_retries is not None else handlers.max_retries_of(job.job_type)


def unique_of(job: Job, handlers: Registry = registry) -> Unique:
    """`job`'s uniqueness: its own `unique`, else its handler's, else `DEFAULT_UNIQUE`."""
    return job.unique if job.unique is not None else handlers.unique_of(job.job_type)


async def _enqueue(conn: Connection, job: Job, handlers: Registry) -> Enqueued:
    unique = unique_of(job, handlers)
    held = unique.among in ("active", "period")
    statement = sql.job_enqueue_held if held else sql.job_enqueue
    queue = queue_of(job, handlers)
    for _ in range(3):
        row = await statement.fetchrow(
            conn,
            job_type=job.job_type,
            arguments=job.arguments,
            ripe_at=job.ripe_at,
            priority=job.priority,
            max_retries=max_retries_of(job, handlers),
            now=clock.now(),
            queue=queue,
            concurrency_key=job.concurrency_key,
            unique_mode=unique.among,
            unique_key=unique.key,
            **({"period": unique.period} if held else {}),
        )
        if row is not None:
            break
        # The identical job committed while we waited on its index entry, or was claimed
        # between the conflict and the lookup: try again with a fresh snapshot.
    else:
        raise RuntimeError("enqueue did not settle after 3 tries")
    if not row["duplicate"]:
        wake_workers_after_commit()
        metrics.count_after_commit([(queue, job.job_type)], "enqueued")
        await tracing.remember(conn, [row["id"]], now=clock.now())
    elif unique.on_conflict == "raise":
        raise DuplicateJob(f"a twin of this {job.job_type} job exists", job_id=row["id"])
    elif unique.on_conflict == "earlier" and await _hasten(conn, row["id"], job.ripe_at):
        wake_workers_after_commit()
    return Enqueued(id=row["id"], duplicate=row["duplicate"])


def enqueue_columns(job: Job, *, handlers: Registry = registry) -> dict[str, Any]:
    """`job` as the SQL function `job_enqueue` takes it (sql/functions/job_enqueue.sql), for a
    statement of the caller's that enqueues `job` while it writes rows of its own, atomically
    and in one round trip: `job_type`, `arguments` (a dict), `ripe_at`, `priority`,
    `max_retries`, `queue`, `concurrency_key`, `unique_mode`, `unique_key` and `traceparent`
    (the current span's, or None), each filled in from `handlers` as `enqueue` does; the
    statement gives the time. Once the statement has run, `enqueued` does the rest.
    A queued twin (`Unique` `queued`) is left as it is, whatever its `on_conflict`:
    `job_enqueue` then returns NULL, and the caller decides.
    Raises: `ValueError` for a `Unique` `active` or `period` (use `enqueue`)."""
    unique = unique_of(job, handlers)
    if unique.among not in ("none", "queued"):
        raise ValueError(f"enqueue_columns takes no {unique!r}: use enqueue")
    return {
        "job_type": job.job_type,
        "arguments": job.arguments,
        "ripe_at": job.ripe_at,
        "priority": job.priority,
        "max_retries": max_retries_of(job, handlers),
        "queue": queue_of(job, handlers),
        "concurrency_key": job.concurrency_key,
        "unique_mode": unique.among,
        "unique_key": unique.key,
        "traceparent": tracing.current_traceparent(),
    }


def enqueued(job: Job, *, handlers: Registry = registry) -> None:
    """Tell that `job` was enqueued by a statement of the caller's (`enqueue_columns`): the
    workers are woken and it is counted once the transaction in progress commits (outside a
    transaction, now: the statement has committed)."""
    wake_workers_after_commit()
    metrics.count_after_commit([(queue_of(job, handlers), job.job_type)], "enqueued")


async def _hasten(conn: Connection, job_id: int, ripe_at: datetime) -> bool:
    """Move queued job `job_id` to `ripe_at` if that is earlier; return whether it moved."""
    return await sql.job_hasten.execute(conn, job_id=job_id, ripe_at=ripe_at) != "UPDATE 0"


@write_transaction
async def enqueue_many(jobs: Iterable[Job], *, handlers: Registry = registry) -> list[int]:
    """Queue many jobs in one statement; return the ids of those that were not duplicates.

    Joins the transaction in progress like `enqueue`. Only the `Unique` modes `none` and
    `queued` are taken here. Duplicates (of queued jobs, or within the batch: the earliest
    `ripe_at` of the batch's twins is kept) are skipped; their twins are moved earlier as
    `enqueue` does, unless `on_conflict` is `keep`.
    Raises: `ValueError` for a job whose `Unique` is `active` or `period`, or `raise` on
    conflict (enqueue those one at a time); `asyncpg.PostgresError` on database errors.
    """
    batch: dict[tuple[str, ...], tuple[Job, Unique, str]] = {}
    for job in jobs:
        unique = unique_of(job, handlers)
        if unique.among in ("active", "period") or unique.on_conflict == "raise":
            raise ValueError(f"enqueue_many takes no {unique!r}: enqueue such jobs one by one")
        arguments = json_arg(job.arguments)  # the parameter, and the key of the job's twins
        twin = (job.job_type, unique.key or arguments)
        key = (str(len(batch)),) if unique.among == "none" else twin
        if key not in batch or job.ripe_at < batch[key][0].ripe_at:
            batch[key] = (job, unique, arguments)
    if not batch:
        return []
    conn = current_conn()
    triples = list(batch.values())
    rows = await sql.job_enqueue_many.fetch(
        conn,
        job_types=[j.job_type for j, _, _ in triples],
        arguments=[a for _, _, a in triples],
        ripe_ats=[j.ripe_at for j, _, _ in triples],
        priorities=[j.priority for j, _, _ in triples],
        max_retries=[max_retries_of(j, handlers) for j, _, _ in triples],
        now=clock.now(),
        queues=[queue_of(j, handlers) for j, _, _ in triples],
        concurrency_keys=[j.concurrency_key for j, _, _ in triples],
        unique_modes=[u.among for _, u, _ in triples],
        unique_keys=[u.key for _, u, _ in triples],
        hasten=[u.on_conflict == "earlier" for _, u, _ in triples],
    )
    if rows:
        wake_workers_after_commit()
        metrics.count_after_commit([(r["queue"], r["job_type"]) for r in rows], "enqueued")
        await tracing.remember(conn, [r["id"] for r in rows], now=clock.now())
    return [r["id"] for r in rows]


def _outcome_args(outcomes: Sequence[Outcome], now: datetime, retain: bool) -> dict[str, Any]:
    """The parameters of `job_record` for `outcomes`."""
    completed: list[int] = []
    results: list[str | None] = []
    requeued: tuple[
        list[int], list[datetime | None], list[str | None], list[int], list[str | None]
    ] = ([], [], [], [], [])
    buried: tuple[list[int], list[str | None], list[str | None]] = ([], [], [])
    for o in outcomes:
        if o.verdict is Verdict.COMPLETE:
            completed.append(o.token)
            results.append(o.result)
        elif o.verdict is Verdict.BURY:
            buried[0].append(o.token)
            buried[1].append(o.error)
            buried[2].append(o.traceback)
        else:
            requeued[0].append(o.token)
            requeued[1].append(None if o.verdict is Verdict.RELEASE else o.ripe_at or now)
            requeued[2].append(o.error if o.verdict is Verdict.RETRY else None)
            requeued[3].append(1 if o.verdict is Verdict.RETRY else 0)
            requeued[4].append(o.traceback)
    return {
        "completed": completed,
        "results": results,
        "retain": retain,
        "failed": requeued[0],
        "failed_ripe_ats": requeued[1],
        "failed_errors": requeued[2],
        "failed_charges": requeued[3],
        "failed_tracebacks": requeued[4],
        "buried": buried[0],
        "buried_errors": buried[1],
        "buried_tracebacks": buried[2],
        "now": now,
    }


async def claim(
    conn: Connection,
    *,
    worker_id: int,
    max_jobs: Slots,
    now: datetime,
    lease_expires_at: datetime,
    retain: bool = True,
    limits: bool = True,
) -> list[ClaimedJob]:
    """Move ripe jobs (`ripe_at <= now`) from `job` to `job_running` in one statement, up to
    `max_jobs` of each queue (an int: of `default`), and return them, each with a new fencing
    token. Per queue: highest priority, then earliest ripe_at; rows locked by another claim are
    skipped; paused queues are skipped; queues with limits take no more than these allow
    (`limits=False`: the lean claim of `record_and_claim`, which skips them)."""
    jobs, *_ = await record_and_claim(
        conn,
        [],
        worker_id=worker_id,
        max_jobs=max_jobs,
        now=now,
        lease_expires_at=lease_expires_at,
        retain=retain,
        limits=limits,
    )
    return jobs


class Claimed(NamedTuple):
    """What `record_and_claim` did: the claimed `jobs`, the tokens of the outcomes `recorded`,
    and `next_ripe_at`: when a claim of the queues it did not fill may next find work (the
    earliest `ripe_at` after `now` of their jobs, or the moment a full rate window of theirs
    opens; None: neither), as `next_ripe_at()` would tell."""

    jobs: list[ClaimedJob]
    recorded: set[int]
    next_ripe_at: datetime | None
    limited: tuple[str, ...] = ()
    """The queues a claim with `limits=False` skipped: they have limits in the database."""


async def record_and_claim(
    conn: Connection,
    outcomes: Sequence[Outcome],
    *,
    worker_id: int,
    max_jobs: Slots,
    now: datetime,
    lease_expires_at: datetime,
    retain: bool = True,
    limits: bool = True,
) -> Claimed:
    """Record `outcomes` (as `record` does) and claim up to `max_jobs` (as `claim` does), so
    that the jobs whose outcome is recorded free the slots the claim fills: one statement
    (`job_claim`) when every outcome is a success, else `job_record` then `job_claim` in one
    transaction. Return what it did (`Claimed`): a worker needs no second statement to set its
    timer. `retain`: keep the jobs that end in `job_done` (False: retention is off).
    `limits`: False when no queue of `max_jobs` has limits as this process declared them: the
    lean claim (`job_claim_unlimited`), which skips the queues that have limits in the database
    and names them in `Claimed.limited`.

    Raises: `asyncpg.PostgresError` (then nothing happened).
    """
    slots = {DEFAULT_QUEUE: max_jobs} if isinstance(max_jobs, int) else max_jobs
    completed = [o for o in outcomes if o.verdict is Verdict.COMPLETE]
    claiming: dict[str, Any] = {
        "completed": [o.token for o in completed],
        "results": [o.result for o in completed],
        "retain": retain,
        "now": now,
        "queues": list(slots),
        "slots": list(slots.values()),
        "worker_id": worker_id,
        "lease_expires_at": lease_expires_at,
    }
    statement = sql.job_claim if limits else sql.job_claim_unlimited
    if len(completed) == len(outcomes):
        row = await statement.fetchrow(conn, **claiming)
        recorded: set[int] = set()
    else:
        others = [o for o in outcomes if o.verdict is not Verdict.COMPLETE]
        async with conn.transaction():
            recorded = await record(conn, others, now=now, retain=retain)
            row = await statement.fetchrow(conn, **claiming)
    # job_claimed: token, id, job_type, arguments (JSON text), attempts, max_retries, ripe_at,
    # claimed_at, queue, concurrency_key
    jobs = [
        ClaimedJob(j[1], j[2], json.loads(j[3]), j[4], j[5], j[0], j[6], j[7], j[8], j[9])
        for j in row["jobs"]
    ]
    limited = () if limits else tuple(row["limited"])
    return Claimed(jobs, recorded | set(row["recorded"]), row["next_ripe_at"], limited)


async def record(
    conn: Connection, outcomes: Sequence[Outcome], *, now: datetime, retain: bool = True
) -> set[int]:
    """Record the outcomes of many claimed jobs in one statement (`sql.job_record`) and return
    the tokens that were still held; a rescued job's stale token matches nothing.

    A re-queued job identical to one queued meanwhile is merged into it.
    A completed job goes to `job_done` with its result when `retain`; a job cancelled while it
    ran ends there `cancelled` whatever its outcome. `now` (aware UTC) stamps `died_at` of
    buried and merged jobs and `finished_at`.
    Raises: `asyncpg.PostgresError` on database errors (then nothing is recorded).
    """
    rows = await sql.job_record.fetch(conn, **_outcome_args(outcomes, now, retain))
    return {r["token"] for r in rows}


async def rescue(
    conn: Connection, *, now: datetime, heartbeat_grace: timedelta, retain: bool = True
) -> int:
    """Return the jobs of dead and hung workers to `job`, ripe at `now`, charging an attempt;
    those out of retries go to `job_dead`. Also forget dead workers' rows. Return how many
    jobs were rescued.

    Dead: no liveness lock, and either no session of its process is left or its last
    heartbeat is older than `heartbeat_grace` (a worker whose listener alone dropped keeps its
    jobs while it reconnects). Hung: its leases expired before `now`.
    """
    count: int = await sql.job_rescue.fetchval(
        conn,
        now=now,
        heartbeat_grace=heartbeat_grace,
        error="worker lost while running the job",
        retain=retain,
    )
    return count


async def release_orphans(
    conn: Connection, *, worker_id: int, held: Sequence[int], now: datetime, retain: bool = True
) -> int:
    """Put back in the queue the jobs of `job_running` claimed for `worker_id` whose tokens are
    not in `held`: claims that committed while their answer was lost with the connection, so
    the worker never started them. They keep their place and no attempt is charged (merged into
    a queued twin if any, as on a release). Return how many. Call it with no claim in flight."""
    count: int = await sql.job_release_orphans.fetchval(
        conn, worker_id=worker_id, tokens=list(held), now=now, retain=retain
    )
    return count


async def next_ripe_at(
    conn: Connection, *, now: datetime, queues: Sequence[str] = (DEFAULT_QUEUE,)
) -> datetime | None:
    """Return when a claim of `queues` may next find work after `now`: the earliest `ripe_at`
    after `now` of their queued jobs, or the moment a full rate window of theirs lets one more
    job start, whichever comes first; None when neither exists."""
    value: datetime | None = await sql.job_next_ripe_at.fetchval(conn, now=now, queues=list(queues))
    return value


async def prune_rates(conn: Connection, *, now: datetime) -> int:
    """Forget the starts in the rate windows (`job_rate`) older than their period (and a
    minute) at `now`; return how many rows went."""
    status = await sql.job_rate_prune.execute(conn, now=now)
    return int(status.split()[-1])
