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
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Self
from urllib.parse import urlsplit

from pydantic import AwareDatetime, BaseModel, Field, model_validator

from jobq import clock, db, statements
from jobq.domain.recurring import UPCOMING, Plan, Recurrence, plan
from jobq.domain.types import NOT_BLANK, REQUEST, Text
from jobq.domain.users import require_user
from jobq.errors import Conflict, InvalidRecurrence, LimitReached, NotFound
from jobq.queue import Job, control, dead, enqueue, rrules, schedule
from jobq.queue.control import JobState

SEND_REMINDER = "send_reminder"
QUEUE = "reminders"
"""The queue of reminder deliveries; its per-key limits hold per webhook host."""


def delivery_key(webhook_url: str | None) -> str | None:
    """The concurrency key of a delivery to `webhook_url`: `host:<its host name>`, lower-case
    (None without a webhook: a delivery to the log is not limited)."""
    if webhook_url is None:
        return None
    host = urlsplit(webhook_url).hostname
    return f"host:{host}" if host else None


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
    retry), `sent`, or `failed` (retries exhausted); a recurring one is `active`, `paused` or
    `ended` (no occurrence to come)."""

    SCHEDULED = "scheduled"
    SENT = "sent"
    FAILED = "failed"
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
    deliveries: int = Field(default=0, description="occurrences delivered (recurring)")
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
    elif not _waiting(job):  # dead, cancelled, or gone (discarded, pruned)
        status = ReminderStatus.FAILED
    else:
        status = ReminderStatus.SCHEDULED
    if values["sent_at"] is None:
        values["attempts"] = 0 if job is None else job.attempts
    return Reminder.model_validate(
        values
        | {
            "status": status,
            "last_error": None if job is None else job.last_error,
            "recurrence": recurrence,
            "next_occurrences": upcoming,
        }
    )


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
    user_id: int, data: NewReminder, *, max_unsent: int, now: datetime, worked_out: Plan | None
) -> Reminder:
    """Insert a reminder due at `data.due_at(now)` and enqueue its `send_reminder` job (ripe
    then), or save its schedule (recurring: `worked_out`, from `plan_reminder`), in the same
    transaction. Raises: `NotFound` when the user does not exist; `LimitReached` when the user
    has `max_unsent` reminders not yet sent (checked under a lock of the user's row, so
    concurrent requests cannot overshoot)."""
    conn = db.conn()
    remind_at = data.due_at(now)
    user = await statements.user_lock.fetchrow(conn, user_id=user_id)
    if user is None:
        raise NotFound("no such user", user_id=user_id)
    unsent = await statements.reminder_unsent_count.fetchval(conn, user_id=user_id)
    if unsent >= max_unsent:
        raise LimitReached("too many reminders not yet sent: delete some or wait", limit=max_unsent)
    recurrence = data.recurrence
    reminder_id: int = await statements.reminder_create.fetchval(
        conn,
        user_id=user_id,
        message=data.message,
        remind_at=remind_at,
        now=now,
        rrule=None if recurrence is None else recurrence.rrule,
        tz=None if recurrence is None else recurrence.tz,
        until=None if recurrence is None else recurrence.until,
        count=None if recurrence is None else recurrence.count,
    )
    if recurrence is not None:
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
            concurrency_key=delivery_key(user["webhook_url"]),
            occurrence_arg="occurrence_at",
            first=worked_out.upcoming[0],
        )
        # As `get_reminder` would read it back inside this transaction: nothing else has seen it.
        return Reminder(
            id=reminder_id,
            user_id=user_id,
            message=data.message,
            remind_at=remind_at,
            status=ReminderStatus.ACTIVE,
            attempts=0,
            sent_at=None,
            last_error=None,
            job_id=None,
            created_at=now,
            recurrence=recurrence,
            next_occurrences=worked_out.upcoming,
        )
    job = await enqueue(
        Job(
            job_type=SEND_REMINDER,
            arguments={"reminder_id": reminder_id},
            ripe_at=remind_at,
            queue=QUEUE,
            concurrency_key=delivery_key(user["webhook_url"]),
        )
    )
    await statements.reminder_job_set.execute(conn, reminder_id=reminder_id, job_id=job.id)
    # As `get_reminder` would read it back inside this transaction: nothing else has seen it.
    return Reminder(
        id=reminder_id,
        user_id=user_id,
        message=data.message,
        remind_at=remind_at,
        status=ReminderStatus.SCHEDULED,
        attempts=0,
        sent_at=None,
        last_error=None,
        job_id=job.id,
        created_at=now,
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
    any occurrence), or None (sent already, or deleted)."""
    row = await statements.reminder_delivery.fetchrow(
        db.conn(), reminder_id=reminder_id, recurring=recurring
    )
    return None if row is None else Delivery.model_validate(dict(row))


async def mark_occurrence_sent(reminder_id: int, occurrence_at: datetime) -> bool:
    """Count occurrence `occurrence_at` of a recurring reminder delivered, once (a job that
    runs twice, or an older occurrence delivered late, counts no more); return whether it
    counted."""
    counted = await statements.reminder_occurrence_sent.fetchval(
        db.conn(), reminder_id=reminder_id, occurrence_at=occurrence_at
    )
    return counted is not None


async def mark_sent(reminder_id: int, *, attempts: int) -> bool:
    """Set `sent_at` (the app clock) once: return False when it was set already or the reminder
    is gone, so a job that runs twice marks the reminder sent exactly once."""
    marked = await statements.reminder_sent.fetchval(
        db.conn(), reminder_id=reminder_id, now=clock.now(), attempts=attempts
    )
    return marked is not None
