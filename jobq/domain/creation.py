"""Making reminders: a one-off reminder and its `send_reminder` job in one statement, a recurring
one and its schedule in one transaction, each under the user's cap of reminders not yet sent.

The cap holds exactly without serialising a user's requests: a hold on one more unsent
reminder is taken first, alone, in a short transaction (`reminder_hold_take` says why that is
exact), and the reminder's statement or transaction then turns the hold into the reminder.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from jobq import clock, db, statements
from jobq.domain import shares
from jobq.domain.recurring import Plan, plan
from jobq.domain.reminders import (
    QUEUE,
    SEND_REMINDER,
    NewReminder,
    Reminder,
    ReminderStatus,
    schedule_name,
)
from jobq.errors import InvalidRecurrence, LimitReached, NotFound
from jobq.queue import Job, enqueue_columns, enqueued, rrules, schedule

log = logging.getLogger(__name__)


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
