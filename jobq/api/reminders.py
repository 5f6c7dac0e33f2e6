"""`/reminders/<id>`."""

from __future__ import annotations

from quart import Blueprint
from quart_schema import validate_response

from jobq.db import read_transaction, write_transaction
from jobq.domain import reminders
from jobq.domain.reminders import Reminder

bp = Blueprint("reminders", __name__)


@bp.get("/reminders/<int:reminder_id>")
@validate_response(Reminder)
@read_transaction
async def get_reminder(reminder_id: int) -> Reminder:
    """A reminder with its status (`scheduled`, `sent`, `failed`), attempts and last error."""
    return await reminders.get_reminder(reminder_id)


@bp.delete("/reminders/<int:reminder_id>")
@write_transaction
async def delete_reminder(reminder_id: int) -> tuple[str, int]:
    """Cancel a reminder and its job. 409 once sent."""
    await reminders.cancel_reminder(reminder_id)
    return "", 204
