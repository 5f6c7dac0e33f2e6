"""`/users`, and the reminders and exports of a user."""

from __future__ import annotations

from quart import Blueprint
from quart_schema import validate_request, validate_response

from jobq.db import read_transaction, write_transaction
from jobq.domain import exports, reminders, users
from jobq.domain.exports import Export
from jobq.domain.reminders import NewReminder, Reminder, Reminders
from jobq.domain.users import NewUser, User

bp = Blueprint("users", __name__)


@bp.post("/users")
@validate_request(NewUser)
@validate_response(User, 201)
@write_transaction
async def create_user(data: NewUser) -> tuple[User, int]:
    """Create a user. 409 when the e-mail address is taken; 422 when the body is invalid."""
    return await users.create_user(data), 201


@bp.get("/users/<int:user_id>")
@validate_response(User)
@read_transaction
async def get_user(user_id: int) -> User:
    """A user. 404 when unknown."""
    return await users.get_user(user_id)


@bp.post("/users/<int:user_id>/reminders")
@validate_request(NewReminder)
@validate_response(Reminder, 201)
@write_transaction
async def create_reminder(user_id: int, data: NewReminder) -> tuple[Reminder, int]:
    """Schedule a reminder; its delivery job commits with it."""
    return await reminders.schedule_reminder(user_id, data), 201


@bp.get("/users/<int:user_id>/reminders")
@validate_response(Reminders)
@read_transaction
async def list_reminders(user_id: int) -> Reminders:
    """The user's reminders, by due time."""
    return Reminders(reminders=await reminders.list_reminders(user_id))


@bp.post("/users/<int:user_id>/exports")
@validate_response(Export, 202)
@write_transaction
async def request_export(user_id: int) -> tuple[Export, int, dict[str, str]]:
    """Start an iCalendar export of the user's reminders; poll its `status_url`."""
    export = await exports.request_export(user_id)
    return export, 202, {"Location": export.status_url}
