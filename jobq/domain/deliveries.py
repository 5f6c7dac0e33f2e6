"""Delivering reminders: what the `send_reminder` job (`jobq.jobs.reminders`) reads before it
delivers, and how it records a delivery once, however often the job runs."""

from __future__ import annotations

from datetime import datetime

from pydantic import AwareDatetime, BaseModel

from jobq import clock, db, statements


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
