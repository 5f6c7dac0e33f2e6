"""Users: who reminders are for, and where they are delivered (an optional webhook).

An e-mail address is the user's own say-so: nothing verifies it, nothing looks a user up by it,
and two users may give the same one. Sign-up answers at once with a working API key and sends
no mail, so with unique addresses its answer (a key, or a refusal) would tell anyone which
addresses are registered; without, every well-formed sign-up gets the same answer, a new user.
"""

from __future__ import annotations

from pydantic import AwareDatetime, BaseModel, EmailStr, Field

from jobq import clock, db, statements
from jobq.domain.types import NOT_BLANK, REQUEST, Text, WebhookUrl
from jobq.errors import NotFound


class NewUser(BaseModel):
    """`POST /users` body."""

    model_config = REQUEST

    name: Text = Field(min_length=1, max_length=200, pattern=NOT_BLANK)
    email: EmailStr = Field(max_length=254)
    webhook_url: WebhookUrl | None = None
    """Where reminders are POSTed (JSON, signed by Standard Webhooks: `jobq.domain.signing`)."""


class User(BaseModel):
    """A user."""

    id: int
    name: str
    email: str
    webhook_url: str | None
    created_at: AwareDatetime


class UserWithKey(User):
    """A new user, with their first API key: `api_key` is shown only in this answer; send it
    as `Authorization: Bearer <api_key>`. `api_key_id` names it for revocation."""

    api_key: str
    api_key_id: int


async def create_user(data: NewUser) -> User:
    """Insert a user (whether or not another one gave the same e-mail address)."""
    row = await statements.user_create.fetchrow(
        db.conn(),
        name=data.name,
        email=data.email,
        webhook_url=str(data.webhook_url) if data.webhook_url else None,
        now=clock.now(),
    )
    return User.model_validate(dict(row))


async def get_user(user_id: int) -> User:
    """Return the user. Raises: `NotFound`."""
    row = await statements.user_get.fetchrow(db.conn(), user_id=user_id)
    if row is None:
        raise NotFound("no such user", user_id=user_id)
    return User.model_validate(dict(row))


async def require_user(user_id: int) -> None:
    """Raise `NotFound` unless the user exists (users are never deleted)."""
    if not await statements.user_exists.fetchval(db.conn(), user_id=user_id):
        raise NotFound("no such user", user_id=user_id)
