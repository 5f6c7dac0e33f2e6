"""Reminders: a message for a user at a time, delivered by a `send_reminder` job; or, with a
recurrence (an RFC 5545 RRULE in an IANA time zone), at each of its occurrences, by a schedule
of its own (`jobq.queue.schedule`, named `reminder:<id>`).

A reminder's status is derived, never copied. One-off: `sent` once `sent_at` is set, `failed`
while its job is in the dead letter (or after it was discarded from there), `scheduled`
otherwise (queued or running). Recurring: `active`, `paused`, or `ended` (no occurrence to
come). The queue tells where a job is (`jobq.queue.control.job_states`) and a schedule's next
occurrence (`jobq.queue.schedule.next_at`): the domain never reads the queue's tables.
(`jobq.domain.recurring` says why an RRULE.)
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Self

from pydantic import AwareDatetime, BaseModel, Field, model_validator

from jobq import clock, db, statements
from jobq.domain import shares
from jobq.domain.recurring import UPCOMING, Plan, Recurrence, plan
from jobq.domain.types import NOT_BLANK, REQUEST, Text
from jobq.domain.users import require_user
from jobq.errors import Conflict, InvalidRecurrence, LimitReached, NotFound
from jobq.queue import Job, control, dead, enqueue_columns, enqueued, rrules, schedule
from jobq.queue.control import JobState

log = logging.getLogger(__name__)

SEND_REMINDER = "send_reminder"
QUEUE = "reminders"
"""The queue of reminder deliveries; its per-key limits hold per user (`jobq.domain.shares`)."""


MAX_AHEAD = timedelta(days=3660)
"""How far ahead a reminder may be scheduled (about ten years)."""


class NewReminder(BaseModel):
    """`POST /users/<id>/reminders` body: a message and exactly one of `remind_at` (ISO 8601
    with an offset) or `remind_in_seconds` (> 0)."""

    model_config = REQUEST

    message: Text = Field(min_length=1, max_length=1000, pattern=NOT_BLANK)
    remind_at: AwareDatetime | None = None
    remind_in_seconds: float | None = Field(
        default=None, gt=0, le=MAX_AHEAD.total_seconds(), allow_inf_nan=False
    )
    recurrence: Recurrence | None = None

    @model_validator(mode="after")
    def _one_time(self) -> Self:
        if (self.remind_at is None) == (self.remind_in_seconds is None):
            raise ValueError("give exactly one of remind_at or remind_in_seconds")
        now = clock.now()
        if self.remind_at is not None:
            if self.remind_at <= now:
                raise ValueError("remind_at must be in the future")
            if self.remind_at > now + MAX_AHEAD:
                raise ValueError("remind_at must be within ten years")
        if self.recurrence is not None:
            start = self.due_at(now)
            if self.recurrence.until is not None and self.recurrence.until <= start:
                raise ValueError("recurrence.until must be after the reminder's first time")
        return self

    def due_at(self, now: datetime) -> datetime:
        """Return when the reminder is due (aware UTC), given the current time."""
        if self.remind_at is not None:
            return self.remind_at.astimezone(UTC)
        assert self.remind_in_seconds is not None
        return now + timedelta(seconds=self.remind_in_seconds)


class ReminderStatus(StrEnum):
    """Where a reminder's delivery stands: `scheduled` (queued, running, or waiting for a
    retry), `sent`, `failed` (retries exhausted, or its job discarded: `last_error` says why)
    or `cancelled` (its job was cancelled, by an admin); a recurring one is `active`, `paused`
    or `ended` (no occurrence to come)."""

    SCHEDULED = "scheduled"
    SENT = "sent"
    FAILED = "failed"
    CANCELLED = "cancelled"
    ACTIVE = "active"
    PAUSED = "paused"
    ENDED = "ended"


class Reminder(BaseModel):
    """A reminder and where its delivery stands. `attempts`: delivery attempts made."""

    id: int
    user_id: int
    message: str
    remind_at: AwareDatetime
    status: ReminderStatus
    attempts: int
    sent_at: AwareDatetime | None
    last_error: str | None
    job_id: int | None
    created_at: AwareDatetime
    recurrence: Recurrence | None = None
    next_occurrences: list[AwareDatetime] = Field(
        default_factory=list,
        description="recurring, not paused: the next five (as far as ten years apart); in a "
        "list of reminders, the next one",
    )
    deliveries: int = Field(
        default=0,
        description="deliveries made: 1 once a one-off reminder is sent; a recurring one's "
        "occurrences delivered",
    )
    last_occurrence_at: AwareDatetime | None = None


class Reminders(BaseModel):
    """A user's reminders, by `remind_at`."""

    reminders: list[Reminder]


def schedule_name(reminder_id: int) -> str:
    """The name of recurring reminder `reminder_id`'s schedule."""
    return f"reminder:{reminder_id}"


async def _reminders(
    conn: db.Connection, rows: Sequence[Any], *, upcoming: int = 1
) -> list[Reminder]:
    """`reminder_get` rows as `Reminder`s: their status derived from their jobs' states and
    their schedules' next occurrences, which the queue gives (one statement each, for all the
    rows), with `upcoming` occurrences of those recurring (1: the stored next one, nothing
    computed; more: computed off the event loop, within a budget).

    The rows and the states are read by two statements, in two snapshots: a delivery whose job
    ended in between had marked its reminder sent first, so the reminders whose job is no
    longer waiting are read again (`reminder_sent_of`) before they are called `failed`."""
    jobs = await control.job_states(conn, [r["job_id"] for r in rows if r["job_id"] is not None])
    ended = [
        r["id"]
        for r in rows
        if r["rrule"] is None and r["sent_at"] is None and not _waiting(jobs.get(r["job_id"]))
    ]
    again = {}
    if ended:
        again = {
            r["id"]: dict(r)
            for r in await statements.reminder_sent_of.fetch(conn, reminder_ids=ended)
        }
    ahead = await schedule.upcoming(
        conn, [schedule_name(r["id"]) for r in rows if r["rrule"] is not None], upcoming
    )
    return [
        _reminder(
            dict(r) | again.get(r["id"], {}),
            jobs.get(r["job_id"]),
            ahead.get(schedule_name(r["id"]), []),
        )
        for r in rows
    ]


GONE = "its delivery job is gone (discarded from the dead letter, or pruned) before it was sent"
"""The `last_error` of a one-off reminder whose job no table holds any more."""


def _waiting(job: control.JobStatus | None) -> bool:
    """Whether `job` (None: the queue holds it no more) may still deliver its reminder."""
    return job is not None and job.state in (JobState.QUEUED, JobState.RUNNING)


def _reminder(
    values: dict[str, Any], job: control.JobStatus | None, upcoming: list[datetime]
) -> Reminder:
    """A `reminder_get` row as a `Reminder`, given where its job is (None: no job, or the queue
    holds it no more) and its schedule's next occurrences (recurring; none: it has ended, or
    is paused)."""
    recurrence = None
    if values["rrule"] is not None:
        recurrence = Recurrence.model_construct(
            rrule=values["rrule"], tz=values["tz"], until=values["until"], count=values["count"]
        )
        if values["paused"]:
            status = ReminderStatus.PAUSED
        elif not upcoming:
            status = ReminderStatus.ENDED
        else:
            status = ReminderStatus.ACTIVE
    elif values["sent_at"] is not None:
        status = ReminderStatus.SENT
    elif job is not None and job.state is JobState.CANCELLED:
        status = ReminderStatus.CANCELLED
    elif not _waiting(job):  # dead, or gone (discarded from the dead letter, pruned)
        status = ReminderStatus.FAILED
    else:
        status = ReminderStatus.SCHEDULED
    if values["sent_at"] is None:
        values["attempts"] = 0 if job is None else job.attempts
    last_error = None if job is None else job.last_error
    if status is ReminderStatus.FAILED and last_error is None:
        last_error = GONE if job is None else "its delivery job failed with no error recorded"
    return Reminder.model_validate(
        values
        | {
            "status": status,
            "last_error": last_error,
            "recurrence": recurrence,
            "next_occurrences": upcoming,
        }
    )


HOLD_GRACE = timedelta(minutes=1)
"""How long a hold on an unsent reminder waits for its request's transaction to turn it into the
reminder: an older hold that no transaction holds is its dead request's (a killed process), and
is dropped at the user's next recount (`reminder_hold_take`)."""


async def plan_reminder(data: NewReminder, *, now: datetime) -> Plan | None:
    """Work out a recurring reminder's recurrence from its time (`jobq.domain.recurring.plan`),
    off the event loop; None for a one-off reminder. Raises: `InvalidRecurrence` (422)."""
    if data.recurrence is None:
        return None
    try:
        return await rrules.off_loop(plan, data.recurrence, data.due_at(now))
    except ValueError as exc:
        raise InvalidRecurrence(str(exc)) from None


async def schedule_reminder(
    user_id: int,
    data: NewReminder,
    *,
    max_unsent: int,
    now: datetime | None = None,
    worked_out: Plan | None = None,
) -> Reminder:
    """Insert a reminder due at `data.due_at(now)` (`now`: aware UTC, default the clock's) and
    enqueue its `send_reminder` job (ripe then), or save its schedule (recurring: `worked_out`,
    from `plan_reminder`, worked out here when not given), atomically: a one-off reminder by one
    statement of its own (`reminder_create_one_off`); a recurring one in a transaction of its
    own; either, inside a transaction, in a savepoint of it.

    The user's cap, `max_unsent` reminders not yet sent, holds exactly without making the user's
    other requests wait for this one's commit: first a hold on one more unsent reminder is
    taken, alone, in a short transaction (`reminder_hold_take` says why that is exact); then the
    reminder's statement or transaction turns the hold into the reminder, or the hold is
    released when it fails (when an outer transaction rolls back afterwards, the hold counts
    until `HOLD_GRACE`). A one-off reminder made alone takes one pooled connection and two
    round trips.
    Raises: `NotFound` when the user does not exist; `LimitReached` at the cap;
    `InvalidRecurrence` for a rule with no occurrence or over its budget."""
    now = now or clock.now()
    if data.recurrence is not None and worked_out is None:
        worked_out = await plan_reminder(data, now=now)
    remind_at = data.due_at(now)
    alone = data.recurrence is None and db.current_transaction() is None
    database = db.current_database()
    async with database.pool.acquire() as conn:
        hold = await statements.reminder_hold_take.fetchrow(
            conn, user_id=user_id, max_unsent=max_unsent, now=now, grace=HOLD_GRACE
        )
        if hold is None:
            raise NotFound("no such user", user_id=user_id)
        reminder_id: int | None = hold["hold_id"]
        if reminder_id is None:
            raise LimitReached(
                "too many reminders not yet sent: delete some or wait", limit=max_unsent
            )
        if alone:  # one statement, on this connection, in autocommit
            try:
                return await _create_one_off(conn, reminder_id, user_id, data, remind_at, now)
            except BaseException:
                await _release_hold(reminder_id, conn)
                raise
    # A transaction takes a connection of its own once the hold's is back in the pool: a
    # request that held one while it waited for another could wait forever on a full pool.
    try:
        async with db.transaction() as conn:
            if data.recurrence is None:
                return await _create_one_off(conn, reminder_id, user_id, data, remind_at, now)
            return await _create(conn, reminder_id, user_id, data, remind_at, now, worked_out)
    except BaseException:
        await _release_hold(reminder_id)
        raise


async def _release_hold(hold_id: int, conn: db.Connection | None = None) -> None:
    """Release hold `hold_id`, whose creation failed, on `conn` (autocommit; None: a pooled
    connection); a failure is logged (the hold is then dropped after `HOLD_GRACE`)."""
    try:
        if conn is not None:
            await statements.reminder_hold_release.execute(conn, hold_id=hold_id)
            return
        async with db.current_database().pool.acquire() as pooled:
            await statements.reminder_hold_release.execute(pooled, hold_id=hold_id)
    except Exception as exc:
        log.warning("could not release a reminder's hold (%s: %s)", type(exc).__name__, exc)


async def _create_one_off(
    conn: db.Connection,
    reminder_id: int,
    user_id: int,
    data: NewReminder,
    remind_at: datetime,
    now: datetime,
) -> Reminder:
    """Make held reminder `reminder_id`, one-off, and its job, in one statement on `conn`
    (`reminder_create_one_off`). Returned as `get_reminder` would read it back."""
    job = Job(
        job_type=SEND_REMINDER,
        arguments={"reminder_id": reminder_id},
        ripe_at=remind_at,
        queue=QUEUE,
        concurrency_key=shares.delivery_key(user_id),
    )
    row = await statements.reminder_create_one_off.fetchrow(
        conn,
        id=reminder_id,
        user_id=user_id,
        message=data.message,
        remind_at=remind_at,
        now=now,
        **enqueue_columns(job),
    )
    if row is None:
        raise RuntimeError(f"the hold of reminder {reminder_id} was dropped: its request was slow")
    # The job's arguments name a reminder id fresh from its sequence: no queued twin can exist.
    assert row["job_id"] is not None
    enqueued(job)
    return _made(
        reminder_id,
        user_id,
        data,
        remind_at,
        now,
        status=ReminderStatus.SCHEDULED,
        job_id=row["job_id"],
    )


async def _create(
    conn: db.Connection,
    reminder_id: int,
    user_id: int,
    data: NewReminder,
    remind_at: datetime,
    now: datetime,
    worked_out: Plan | None,
) -> Reminder:
    """Make held reminder `reminder_id`, recurring, in the transaction of `conn`: its schedule,
    then the reminder (in place of its hold). Returned as `get_reminder` would read it back
    inside this transaction: nothing else has seen it."""
    recurrence = data.recurrence
    assert recurrence is not None
    assert worked_out is not None
    await schedule.save(
        conn,
        name=schedule_name(reminder_id),
        job_type=SEND_REMINDER,
        arguments={"reminder_id": reminder_id},
        rrule=worked_out.text,
        tz=recurrence.tz,
        starts_at=remind_at,
        queue=QUEUE,
        concurrency_key=shares.delivery_key(user_id),
        occurrence_arg="occurrence_at",
        first=worked_out.upcoming[0],
    )
    created = await statements.reminder_create.fetchval(
        conn,
        id=reminder_id,
        user_id=user_id,
        message=data.message,
        remind_at=remind_at,
        now=now,
        rrule=recurrence.rrule,
        tz=recurrence.tz,
        until=recurrence.until,
        count=recurrence.count,
    )
    if created is None:
        raise RuntimeError(f"the hold of reminder {reminder_id} was dropped: its request was slow")
    return _made(
        reminder_id,
        user_id,
        data,
        remind_at,
        now,
        status=ReminderStatus.ACTIVE,
        job_id=None,
        recurrence=recurrence,
        next_occurrences=worked_out.upcoming,
    )


def _made(
    reminder_id: int,
    user_id: int,
    data: NewReminder,
    remind_at: datetime,
    now: datetime,
    **state: Any,
) -> Reminder:
    """Reminder `reminder_id` just made at `now`, as `get_reminder` would read it back: not yet
    attempted; `state` gives its status, job id and recurrence."""
    return Reminder(
        id=reminder_id,
        user_id=user_id,
        message=data.message,
        remind_at=remind_at,
        attempts=0,
        sent_at=None,
        last_error=None,
        created_at=now,
        **state,
    )


async def get_reminder(reminder_id: int, user_id: int) -> Reminder:
    """Return the user's reminder with its derived status. Raises: `NotFound` (also when it is
    another user's)."""
    conn = db.conn()
    row = await statements.reminder_get.fetchrow(conn, reminder_id=reminder_id, user_id=user_id)
    if row is None:
        raise NotFound("no such reminder", reminder_id=reminder_id)
    [reminder] = await _reminders(conn, [row], upcoming=UPCOMING)
    return reminder


async def list_reminders(user_id: int) -> list[Reminder]:
    """Return the user's reminders by due time. Raises: `NotFound` for an unknown user."""
    await require_user(user_id)
    conn = db.conn()
    return await _reminders(conn, await statements.reminder_list.fetch(conn, user_id=user_id))


async def cancel_reminder(reminder_id: int, user_id: int, *, retain: bool = True) -> None:
    """Delete the user's reminder, sent or not; one not yet sent has its job cancelled
    (`jobq.queue.control.cancel`: a queued job leaves the queue, a delivery running is
    cancelled and never retried; a dead one is discarded, `jobq.queue.dead.discard`) and, when
    recurring, its schedule dropped, in the caller's transaction. `retain`: keep the cancelled
    job in `job_done` (the retention setting).

    Raises: `NotFound` (also when it is another user's).
    """
    conn = db.conn()
    deleted = await statements.reminder_delete.fetchrow(
        conn, reminder_id=reminder_id, user_id=user_id
    )
    if deleted is None:
        raise NotFound("no such reminder", reminder_id=reminder_id)
    if deleted["rrule"] is not None:  # its future occurrences stop, those queued too
        await schedule.drop(conn, schedule_name(reminder_id), now=clock.now())
    if deleted["job_id"] is not None and not deleted["sent"]:
        await _end_job(conn, deleted["job_id"], retain=retain)


async def _end_job(conn: db.Connection, job_id: int, *, retain: bool) -> None:
    """Cancel job `job_id`, or discard it from the dead letter; nothing when it ended otherwise
    or is gone."""
    with contextlib.suppress(NotFound):  # gone (pruned, discarded)
        try:
            await control.cancel(conn, job_id, now=clock.now(), retain=retain)
        except Conflict:  # it ended: succeeded, cancelled, or dead (then discarded)
            await dead.discard(conn, job_id)


async def pause_reminder(reminder_id: int, user_id: int, *, paused: bool) -> Reminder:
    """Pause a recurring reminder (the occurrence queued is cancelled, none comes until it
    resumes) or resume it (from its next occurrence after now: none missed is made up); return
    it. Raises: `NotFound` (also when it is another user's); `Conflict` for a one-off one."""
    conn = db.conn()
    found = await statements.reminder_pause.fetchrow(
        conn, reminder_id=reminder_id, user_id=user_id, paused=paused
    )
    if found is None:
        raise NotFound("no such reminder", reminder_id=reminder_id)
    if found["rrule"] is None:
        raise Conflict("only a recurring reminder can be paused", reminder_id=reminder_id)
    await schedule.pause(conn, schedule_name(reminder_id), paused=paused, now=clock.now())
    return await get_reminder(reminder_id, user_id)


class Delivery(BaseModel):
    """What the `send_reminder` job needs to deliver a reminder."""

    reminder_id: int
    user_id: int
    message: str
    remind_at: AwareDatetime
    webhook_url: str | None


async def pending_delivery(reminder_id: int, *, recurring: bool = False) -> Delivery | None:
    """Return the delivery of a reminder not yet sent (`recurring`: of a recurring reminder, at
    any occurrence), or None (sent already, or deleted): one statement on a pooled connection of
    its own (autocommit)."""
    async with db.current_database().pool.acquire() as conn:
        row = await statements.reminder_delivery.fetchrow(
            conn, reminder_id=reminder_id, recurring=recurring
        )
    return None if row is None else Delivery.model_validate(dict(row))


async def mark_occurrence_sent(
    reminder_id: int, occurrence_at: datetime, *, hold_id: int | None = None
) -> bool:
    """Count occurrence `occurrence_at` of a recurring reminder delivered, once (a job that
    runs twice, or an older occurrence delivered late, counts no more), and end its delivery's
    hold `hold_id` (`jobq.domain.shares`; None: none), in one statement on a pooled connection
    of its own (autocommit); return whether it counted."""
    async with db.current_database().pool.acquire() as conn:
        counted = await statements.reminder_occurrence_sent.fetchval(
            conn,
            reminder_id=reminder_id,
            occurrence_at=occurrence_at,
            hold_id=hold_id,
            now=clock.now(),
        )
    return counted is not None


async def mark_sent(reminder_id: int, *, attempts: int, hold_id: int | None = None) -> bool:
    """Set `sent_at` (the app clock) once, and end its delivery's hold `hold_id`
    (`jobq.domain.shares`; None: none), in one statement on a pooled connection of its own
    (autocommit): return False when it was set already or the reminder is gone, so a job that
    runs twice marks the reminder sent exactly once."""
    async with db.current_database().pool.acquire() as conn:
        marked = await statements.reminder_sent.fetchval(
            conn, reminder_id=reminder_id, now=clock.now(), attempts=attempts, hold_id=hold_id
        )
    return marked is not None
