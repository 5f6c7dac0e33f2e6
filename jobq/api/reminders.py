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
    """A reminder with its status (`scheduled`, `sent`, `failed`), attempts and last error."""
    return await reminders.get_reminder(reminder_id, current_user_id())


@bp.delete("/reminders/<int:reminder_id>")
@user_only
@write_transaction
async def delete_reminder(reminder_id: int) -> tuple[str, int]:
    """Cancel a reminder and its job (a delivery running is cancelled too): 204. 409 once
    sent."""
    settings: Settings = current_app.extensions["jobq.settings"]
    await reminders.cancel_reminder(reminder_id, current_user_id(), retain=settings.retain)
    return "", 204
