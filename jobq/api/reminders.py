"""`/reminders/<id>`: the caller's own reminders (another user's answer 404)."""

from __future__ import annotations

from quart import Blueprint, current_app
from quart_schema import validate_response

from jobq.api.auth import current_user_id, user_only
from jobq.config import Settings
from jobq.db import read_transaction, write_transaction
from jobq.domain import reminders
from jobq.domain.reminders import Reminder

bp = Blueprint("reminders", __name__)


@bp.get("/reminders/<int:reminder_id>")
@user_only
@validate_response(Reminder)
@read_transaction
async def get_reminder(reminder_id: int) -> Reminder:
    """A reminder with its status (`scheduled`, `sent`, `failed`; recurring: `active`,
    `paused`, `ended`), attempts and last error; a recurring one with its next occurrences."""
    return await reminders.get_reminder(reminder_id, current_user_id())


@bp.delete("/reminders/<int:reminder_id>")
@user_only
@write_transaction
async def delete_reminder(reminder_id: int) -> tuple[str, int]:
    """Delete a reminder: 204. One not yet sent is cancelled with its job (a delivery running
    is cancelled too; a recurring one's future occurrences stop); a sent one is forgotten."""
    settings: Settings = current_app.extensions["jobq.settings"]
    await reminders.cancel_reminder(reminder_id, current_user_id(), retain=settings.retain)
    return "", 204


@bp.post("/reminders/<int:reminder_id>/pause")
@user_only
@validate_response(Reminder)
@write_transaction
async def pause_reminder(reminder_id: int) -> Reminder:
    """Pause a recurring reminder: its occurrence queued is cancelled, none comes until it is
    resumed. 409 for a one-off reminder."""
    return await reminders.pause_reminder(reminder_id, current_user_id(), paused=True)


@bp.post("/reminders/<int:reminder_id>/resume")
@user_only
@validate_response(Reminder)
@write_transaction
async def resume_reminder(reminder_id: int) -> Reminder:
    """Resume a paused recurring reminder from its next occurrence after now (those missed
    while paused are not made up). 409 for a one-off reminder."""
    return await reminders.pause_reminder(reminder_id, current_user_id(), paused=False)
