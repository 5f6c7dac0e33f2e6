"""Job control: find a job wherever it is, cancel it, and wait for its end.

A job's states: `waiting` for other jobs (`job_waiting`: workflows, batches and sequences,
`jobq.queue.flow`), `scheduled` or `queued` (in `job`, before or after its `ripe_at`), `running`
(`job_running`), then `succeeded` or `cancelled` (`job_done`, kept `JOBQ_RETENTION_S`) or
`failed` (the dead letter, `job_dead`). A cancel of a running job marks its row; its worker hears
of it (NOTIFY `jobq_cancel`, or its next heartbeat) and cancels an async handler, or sets
`JobContext.cancelled` for a synchronous one; whatever outcome it records then, the job ends
`cancelled` (the statements in `jobq.queue.sql` see to it, fenced by the row).

Waiting: `wait_for` marks the job awaited (`job_await`); the statement that ends it notifies
`jobq_done` with its id, which one listener connection per process (`Waiters`) hears. No poll:
the waiter looks at the job when woken, and once more when its time is up.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import weakref
from collections.abc import AsyncIterator, Collection
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, NamedTuple

import asyncpg
from pydantic import AwareDatetime, BaseModel, Field, WithJsonSchema

from jobq import clock, db
from jobq.db import Connection, Database, current_database
from jobq.errors import Conflict, JobqError, NotFound
from jobq.queue import metrics, sql, wakeup
from jobq.queue.notify import DONE_CHANNEL

log = logging.getLogger("jobq.control")

_LOOKS = 3
"""How many times a statement looks for a job that moved between two tables under it."""


class JobState(StrEnum):
    """Where a job is in its life. The last three are final."""

    WAITING = "waiting"
    SCHEDULED = "scheduled"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        """True for `succeeded`, `failed` and `cancelled`."""
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class FailedAttempt(BaseModel):
    """One failed attempt of a job: its number (1 for the first), the worker that ran it, its
    error, its traceback (the last 8,000 characters; null when nothing was raised: a rescue,
    a timeout) and when its failure was recorded."""

    attempt: int
    worker_id: int | None
    error: str | None
    traceback: str | None
    failed_at: AwareDatetime


Arguments = Annotated[
    dict[str, Any],
    WithJsonSchema(
        {
            "description": "the job's arguments: a JSON object, its keys those of its job type",
            "additionalProperties": True,
        }
    ),
]
"""A job's arguments. Documented without `"type": "object"`: a generated client then gives
them as the JSON object itself (a dict), not as an empty model of its own per use."""


class JobView(BaseModel):
    """A job as it is now. Times are aware UTC datetimes; null where they do not apply."""

    id: int
    job_type: str
    queue: str
    state: JobState
    arguments: Arguments
    priority: int | None = Field(description="null once finished")
    attempts: int = Field(description="attempts started, the one running included")
    max_retries: int | None = Field(description="null once finished")
    last_error: str | None = Field(description="the last failed attempt's error")
    created_at: AwareDatetime
    ripe_at: AwareDatetime | None = Field(description="when it may run (queued or running)")
    started_at: AwareDatetime | None = Field(
        description="when its running attempt (finished: its last attempt) was claimed; null "
        "when it never ran. Its run time: finished_at - started_at"
    )
    finished_at: AwareDatetime | None
    cancelled_at: AwareDatetime | None = Field(
        description="when it was cancelled (a running job then ends cancelled)"
    )
    result: Any = Field(default=None, description="what its handler returned (succeeded)")
    progress: float | None = Field(
        default=None, description="its last progress report while it runs, 0 to 1"
    )
    progress_message: str | None = Field(
        default=None, description="the message of its last progress report while it runs"
    )
    failed_attempts: list[FailedAttempt] = Field(
        default_factory=list,
        description="each failed attempt, in order (by id only: empty in lists)",
    )


class JobFailed(JobqError):
    """The job failed: it is in the dead letter."""

    status = 409
    code = "job_failed"


class JobCancelled(JobqError):
    """The job was cancelled."""

    status = 409
    code = "job_cancelled"


async def find(conn: Connection, job_id: int, *, now: datetime) -> JobView | None:
    """Return job `job_id` as it is at `now` (aware), with its failed attempts, or None when no
    table holds it (never enqueued, or finished longer ago than the retention, or discarded
    from the dead letter)."""
    row = await sql.job_find.fetchrow(conn, job_id=job_id, now=now)
    if row is None:
        return None
    attempts = [dict(r) for r in await sql.job_attempts.fetch(conn, job_id=job_id)]
    return JobView.model_validate(dict(row) | {"failed_attempts": attempts})


class JobStatus(NamedTuple):
    """Where a job is (`QUEUED` whether ripe or not), its attempts ended (a running one is not
    counted) and its last failed attempt's error."""

    state: JobState
    attempts: int
    last_error: str | None


async def job_states(conn: Connection, job_ids: Collection[int]) -> dict[int, JobStatus]:
    """Return where each of jobs `job_ids` is now, by id, in one statement however many there
    are (`job_state_of`); a job no table holds (discarded from the dead letter, or finished
    longer ago than the retention) is absent."""
    if not job_ids:
        return {}
    rows = await sql.job_state_of.fetch(conn, job_ids=list(job_ids))
    return {r["id"]: JobStatus(JobState(r["state"]), r["attempts"], r["last_error"]) for r in rows}


async def list_jobs(
    conn: Connection,
    *,
    now: datetime,
    limit: int,
    after: int | None = None,
    queue: str | None = None,
    job_type: str | None = None,
    state: JobState | None = None,
    arguments: dict[str, Any] | None = None,
) -> list[JobView]:
    """Return up to `limit` jobs with ids below `after` (None: from the newest), newest (highest
    id) first, of `queue`, `job_type` and `state`, whose arguments contain `arguments` (JSON
    containment, `@>`; each None: any), as they are at `now`. No index serves `arguments`:
    the tables are walked by id until a page is found (callers bound the time)."""
    rows = await sql.job_list.fetch(
        conn,
        now=now,
        limit=limit,
        after=after,
        queue=queue,
        job_type=job_type,
        state=None if state is None else str(state),
        arguments=arguments,
    )
    return [JobView.model_validate(dict(r)) for r in rows]


class Cancel(NamedTuple):
    """What a cancel did: the job's state after it (`CANCELLED`, or `RUNNING` while its worker
    stops it), and whether it was cancelled already (then the cancel changed nothing)."""

    state: JobState
    already: bool


async def cancel(conn: Connection, job_id: int, *, now: datetime, retain: bool) -> Cancel:
    """Cancel job `job_id` whatever its state, in the caller's transaction (or alone).

    Queued, scheduled or waiting: it leaves the queue and ends `cancelled` (kept in `job_done`
    when `retain`; a waiting one always), and the jobs that wait for it are told (cancelled in
    turn, unless they run anyway: `jobq.queue.flow`). Running: it is marked, and its worker is
    told after the commit; it ends `cancelled` when its worker records any outcome (or the
    rescue returns it), and never runs again. A cancel of a cancelled job (or of one being
    cancelled) changes nothing and says so (`already`). The metrics count the job `cancelled`
    once the cancel commits.
    Raises: `NotFound`; `Conflict` when it succeeded or failed already.
    """
    for _ in range(_LOOKS):
        row = await sql.job_cancel.fetchrow(conn, job_id=job_id, now=now, retain=retain)
        if row["queued"] or row["running"]:
            if row["queued"]:  # the jobs that wait for it (workflows, sequences) are told
                await sql.job_flow_cancel.fetch(conn, job_ids=[job_id], now=now)
            metrics.count_after_commit([(row["queue"], row["job_type"])], "cancelled")
            return Cancel(JobState.CANCELLED if row["queued"] else JobState.RUNNING, False)
        waited = await sql.job_flow_cancel.fetch(conn, job_ids=[job_id], now=now)
        if waited:  # it waited for other jobs
            metrics.count_after_commit([(r["queue"], r["job_type"]) for r in waited], "cancelled")
            return Cancel(JobState.CANCELLED, False)
        job = await find(conn, job_id, now=now)
        if job is None:
            continue  # gone, or moved to job_done after the cancel's snapshot: look again
        if job.state is JobState.CANCELLED:
            return Cancel(job.state, True)
        if job.state is JobState.RUNNING and job.cancelled_at is not None:
            return Cancel(job.state, True)
        if job.state.finished:
            raise Conflict(f"the job has {job.state} already", job_id=job_id, state=job.state)
        # queued or running, moved after the cancel's snapshot: look again
    raise NotFound("no such job", job_id=job_id)


class Waiters:
    """One listener connection of a process (`direct_dsn`: LISTEN needs a session) on
    `jobq_done`, and the events of the tasks waiting for each job id. Connected at the first
    wait; a lost connection wakes every waiter (each then looks at its job) and is replaced at
    the next wait. Once `draining` (`drain_waits`: process-wide), a wait ends at its next look."""

    draining = False

    def __init__(self, database: Database) -> None:
        self._database = weakref.ref(database)
        self._events: dict[int, set[asyncio.Event]] = {}
        self._listener: asyncpg.Connection[asyncpg.Record] | None = None
        self._connecting = asyncio.Lock()

    async def subscribe(self, job_id: int) -> asyncio.Event:
        """Return an event set when job `job_id` ends (or the listener is lost), listening
        before it returns. Raises: `OSError` / `asyncpg.PostgresError`."""
        async with self._connecting:
            if self._listener is None or self._listener.is_closed():
                database = self._database()
                assert database is not None
                listener = await db.connect(database.direct_dsn)
                await listener.add_listener(DONE_CHANNEL, self._on_done)
                listener.add_termination_listener(self._on_lost)
                self._listener = listener
        event = asyncio.Event()
        self._events.setdefault(job_id, set()).add(event)
        return event

    def unsubscribe(self, job_id: int, event: asyncio.Event) -> None:
        """Forget `event` (the wait is over)."""
        waiting = self._events.get(job_id)
        if waiting is not None:
            waiting.discard(event)
            if not waiting:
                del self._events[job_id]

    def _on_done(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        if isinstance(payload, str) and payload.isdigit():
            for event in self._events.get(int(payload), ()):
                event.set()

    def _on_lost(self, *_: object) -> None:
        self._listener = None
        self.wake_all()

    def wake_all(self) -> None:
        """Wake every waiter: each looks at its job (and, `draining`, ends its wait)."""
        for event in itertools.chain.from_iterable(self._events.values()):
            event.set()

    async def close(self) -> None:
        """Close the listener."""
        listener, self._listener = self._listener, None
        if listener is not None and not listener.is_closed():
            await listener.close()


_waiters: weakref.WeakKeyDictionary[Database, Waiters] = weakref.WeakKeyDictionary()


def drain_waits() -> None:
    """End every wait of this process, now and later, at its next look (its server stops)."""
    Waiters.draining = True
    for registry in list(_waiters.values()):
        registry.wake_all()


def waiters(database: Database) -> Waiters:
    """Return the `Waiters` of `database` (one per pool; closed with it)."""
    found = _waiters.get(database)
    if found is None:
        found = _waiters[database] = Waiters(database)
        database.before_close.append(found.close)
    return found


async def await_end(
    job_id: int,
    timeout: float,  # noqa: ASYNC109 - the time limit is the request's (`?wait=`)
    *,
    database: Database | None = None,
) -> JobView:
    """Wait up to `timeout` seconds for job `job_id` to finish and return it as it is then:
    finished, or still queued or running when the time is up or the server stops
    (`drain_waits`). Woken by the notification of the statement that ends it (`Waiters`),
    within milliseconds of its commit.

    Runs its statements alone (not in the caller's transaction: the job's end must be seen).
    Raises: `NotFound` for an unknown job; `OSError` / `asyncpg.PostgresError`.
    """
    last: JobView | None = None
    async for view in watch(job_id, timeout, database=database):
        last = view
    assert last is not None  # watch yields the job at least once
    return last


async def watch(
    job_id: int,
    timeout: float,  # noqa: ASYNC109 - the time limit is the caller's (`?wait=`)
    *,
    database: Database | None = None,
) -> AsyncIterator[JobView]:
    """Yield job `job_id` as it is now, then again each time it reports progress
    (`jobq.queue.progress`) and when it ends, until it has finished (the last view yielded)
    or `timeout` seconds have passed. Woken as `await_end` is (its reports notify `jobq_done`
    with its id while someone awaits it).
    Raises: as `await_end`."""
    database = database or current_database()
    registry = waiters(database)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        event = await registry.subscribe(job_id)
        try:
            job = await _mark_awaited(database, job_id)
            yield job
            remaining = deadline - loop.time()
            if job.state.finished or remaining <= 0 or registry.draining:
                return
            try:
                async with asyncio.timeout(remaining):
                    await event.wait()
            except TimeoutError:
                pass
        finally:
            registry.unsubscribe(job_id, event)


async def _mark_awaited(database: Database, job_id: int) -> JobView:
    """Mark the job awaited where it is queued or running, and return it as it is now."""
    async with database.pool.acquire() as conn:
        for _ in range(_LOOKS):
            marked = await sql.job_await.fetchval(conn, job_id=job_id)
            job = await find(conn, job_id, now=clock.now())
            if job is not None and (marked or job.state.finished):
                if marked and job.state in (JobState.QUEUED, JobState.SCHEDULED):
                    # a claim that met the row while it was being marked skipped it: wake them
                    wakeup.wake_workers(database)
                return job
            # elsewhere, or moved after the mark's snapshot: look again
    raise NotFound("no such job", job_id=job_id)


async def wait_for(
    job_id: int,
    timeout: float,  # noqa: ASYNC109 - `wait_for(job_id, timeout)`, like asyncio.wait_for
    *,
    database: Database | None = None,
) -> Any:
    """Wait up to `timeout` seconds for job `job_id` to finish and return its result (what its
    handler returned, as JSON types; None when it returned None).

    Raises: `JobFailed` (it is in the dead letter; the message is its last error),
    `JobCancelled`, `TimeoutError` when it has not finished in time, `NotFound` for an unknown
    job (or one finished and pruned, or retention off).
    """
    job = await await_end(job_id, timeout, database=database)
    if job.state is JobState.SUCCEEDED:
        return job.result
    if job.state is JobState.FAILED:
        raise JobFailed(job.last_error or "the job failed", job_id=job_id)
    if job.state is JobState.CANCELLED:
        raise JobCancelled(job_id=job_id)
    raise TimeoutError(f"job {job_id} is {job.state} after {timeout:g} s")
