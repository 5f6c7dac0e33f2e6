"""`/users`, a user's API keys, and the reminders and exports of a user.

Every route but `POST /users` needs the user's API key (`jobq.api.auth.user_only`);
`POST /users` is open, or needs the admin token with `JOBQ_SIGNUP=admin`.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from quart import Blueprint, current_app
from quart_schema import validate_request, validate_response

from jobq import clock
from jobq.api import admin, throttle
from jobq.api.audit import audit
from jobq.api.auth import user_only
from jobq.config import Settings
from jobq.db import read_transaction, transaction, write_transaction
from jobq.domain import creation, exports, keys, reminders, users, webhooks
from jobq.domain.exports import Export
from jobq.domain.keys import ApiKey
from jobq.domain.reminders import NewReminder, Reminder, Reminders
from jobq.domain.users import NewUser, User, UserWithKey

bp = Blueprint("users", __name__)

NO_STORE = {"Cache-Control": "no-store"}
"""The headers of an answer that carries a new API key: no cache (a browser's, a proxy's)
keeps it (RFC 9111, 5.2.2.5)."""

P = ParamSpec("P")
T = TypeVar("T")


def _settings() -> Settings:
    settings: Settings = current_app.extensions["jobq.settings"]
    return settings


def _signup_allowed(
    fn: Callable[P, Awaitable[T]],
) -> Callable[P, Coroutine[Any, Any, T]]:
    """With `JOBQ_SIGNUP=admin`, require the admin token (401 otherwise); else count the sign-up
    against its client's address (429 beyond `JOBQ_SIGNUP_RATE_PER_HOUR`, `jobq.api.throttle`).
    Both before the body is validated, so that a stranger learns nothing from validation."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        settings = _settings()
        if settings.signup == "admin":
            admin.authorize_request(settings, "sign-up")
        else:
            throttle.take_signup()
        return await fn(*args, **kwargs)

    return wrapper


@bp.post("/users")
@_signup_allowed
@validate_request(NewUser)
@validate_response(UserWithKey, 201)
async def create_user(data: NewUser) -> tuple[UserWithKey, int, dict[str, str]]:
    """Create a user and their first API key (`api_key`: shown only in this answer).

    E-mail addresses are not unique (the answer tells nothing of other users). 422 when the
    body is invalid or the webhook's address is refused (see the security guide); 429 past the
    sign-ups allowed to the client's address. With `JOBQ_SIGNUP=admin`, only the admin token
    may create users (401 otherwise)."""
    settings = _settings()
    if data.webhook_url is not None:
        await webhooks.check_url(str(data.webhook_url), settings)
    async with transaction():
        user = await users.create_user(data)
        key = await keys.create_key(user.id, max_keys=settings.max_keys_per_user)
    if settings.signup == "admin":
        audit("user.create", f"user:{user.id}")
    return UserWithKey(**user.model_dump(), api_key=key.api_key, api_key_id=key.id), 201, NO_STORE


@bp.get("/users/<int:user_id>")
@user_only
@validate_response(User)
@read_transaction
async def get_user(user_id: int) -> User:
    """The user the API key belongs to. 404 for any other id."""
    return await users.get_user(user_id)


@bp.post("/users/<int:user_id>/keys")
@user_only
@validate_response(ApiKey, 201)
@write_transaction
async def create_key(user_id: int) -> tuple[ApiKey, int, dict[str, str]]:
    """Make another API key (`api_key`: shown only in this answer). The older keys keep
    working until revoked (`DELETE /users/<user_id>/keys/<id>`): rotate by making a key,
    switching to it, and revoking the old one. 409 `limit_reached` beyond
    `JOBQ_MAX_KEYS_PER_USER` unrevoked keys."""
    key = await keys.create_key(user_id, max_keys=_settings().max_keys_per_user)
    audit("key.create", f"key:{key.id}")
    return key, 201, NO_STORE


@bp.delete("/users/<int:user_id>/keys/<int:key_id>")
@user_only
@write_transaction
async def revoke_key(user_id: int, key_id: int) -> tuple[str, int]:
    """Revoke one of the user's API keys (the one in use included): 204. 404 when the user
    holds no such unrevoked key."""
    await keys.revoke_key(user_id, key_id)
    key_cache: keys.KeyCache = current_app.extensions["jobq.key_cache"]
    key_cache.forget_after_commit(key_id)
    audit("key.revoke", f"key:{key_id}")
    return "", 204


@bp.post("/users/<int:user_id>/reminders")
@user_only
@validate_request(NewReminder)
@validate_response(Reminder, 201)
async def create_reminder(user_id: int, data: NewReminder) -> tuple[Reminder, int]:
    """Schedule a reminder; its delivery job (or, recurring, its schedule) commits with it (the
    domain opens the transaction, after its hold on the user's cap). 409 `limit_reached` when the
    user has `JOBQ_MAX_REMINDERS_PER_USER` unsent reminders; 422 when a recurrence has no
    occurrence or is over its budget (see `Recurrence`)."""
    limit = _settings().max_reminders_per_user
    now = clock.now()
    worked_out = await creation.plan_reminder(data, now=now)  # off the event loop
    created = await creation.schedule_reminder(
        user_id, data, max_unsent=limit, now=now, worked_out=worked_out
    )
    return created, 201


@bp.get("/users/<int:user_id>/reminders")
@user_only
@validate_response(Reminders)
@read_transaction
async def list_reminders(user_id: int) -> Reminders:
    """The user's reminders, by due time."""
    return Reminders(reminders=await reminders.list_reminders(user_id))


@bp.post("/users/<int:user_id>/exports")
@user_only
@validate_response(Export, 202)
@write_transaction
async def request_export(user_id: int) -> tuple[Export, int, dict[str, str]]:
    """Start an iCalendar export of the user's reminders; poll its `status_url` (also in the
    `Location` header). 409 `limit_reached` when the user has `JOBQ_MAX_EXPORTS_PER_USER`
    exports, or files of `JOBQ_MAX_EXPORT_BYTES_PER_USER` bytes (`detail.resource` says
    which): delete some (`DELETE /exports/<id>`)."""
    settings = _settings()
    export = await exports.request_export(
        user_id,
        max_exports=settings.max_exports_per_user,
        max_bytes=settings.max_export_bytes_per_user,
    )
    return export, 202, {"Location": export.status_url}
