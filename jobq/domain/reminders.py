"""Reminders: a message for a user at a time, delivered by a `send_reminder` job; or, with a
recurrence (an RFC 5545 RRULE in an IANA time zone), at each of its occurrences, by a schedule
of its own (`jobq.queue.schedule`, named `reminder:<id>`).

A reminder's status is derived, never copied. One-off: `sent` once `sent_at` is set, `failed`
while its job is in the dead letter (or after it was discarded from there), `scheduled`
otherwise (queued or running). Recurring: `active`, `paused`, or `ended` (no occurrence to
come). The queue tells where a job is (`jobq.queue.control.job_states`) and a schedule's next
occurrence (`jobq.queue.schedule.next_at`): the domain never reads the queue's tables.
(`jobq.domain.recurring` says why an RRULE.) Making reminders is `jobq.domain.creation`;
the delivery's reads and writes are `jobq.domain.deliveries`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Self

from pydantic import AwareDatetime, BaseModel, Field, model_validator

from jobq import clock, db, statements
from jobq.domain.recurring import UPCOMING, Recurrence
from jobq.domain.types import NOT_BLANK, REQUEST, Text
from jobq.domain.users import require_user
from jobq.errors import Conflict, NotFound
from jobq.queue import control, dead, schedule
from jobq.queue.control import JobState

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
