"""API keys: each user's bearer credentials.

A key reads `jq_<id>_<secret>`: `id` names its row (lookup by primary key), `secret` is 32
random bytes from `secrets.token_urlsafe`. Only `sha256(key)` is stored: with 256 random bits
there is nothing to brute-force, so a slow password hash (scrypt) would only cost CPU on every
request. Digests are compared with `hmac.compare_digest`. A key is shown once, when made.
A user may hold several keys (up to `max_keys_per_user`): a new key does not revoke the old
ones, so a client can switch over before revoking its old key.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from datetime import datetime

from pydantic import AwareDatetime, BaseModel

from jobq import clock, db, statements
from jobq.domain.types import parse_id
from jobq.errors import LimitReached, NotFound

_KEY = re.compile(r"jq_([1-9][0-9]{0,18})_([A-Za-z0-9_-]{43})")


class ApiKey(BaseModel):
    """A new API key: `api_key` is shown only in this answer; keep it. `id` names it for
    `DELETE /users/<user_id>/keys/<id>`."""

    id: int
    user_id: int
    api_key: str
    created_at: AwareDatetime


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


async def create_key(user_id: int, *, max_keys: int, now: datetime | None = None) -> ApiKey:
    """Make a key for an existing user (the caller checked it) and return it (the only time its
    secret is seen). Raises: `LimitReached` when the user holds `max_keys` unrevoked keys."""
    conn = db.conn()
    now = now or clock.now()
    await statements.user_lock.execute(conn, user_id=user_id)
    held = await statements.api_key_count.fetchval(conn, user_id=user_id)
    if held >= max_keys:
        raise LimitReached(
            "too many API keys: revoke one first", limit=max_keys, resource="api_keys"
        )
    key_id: int = await statements.api_key_create.fetchval(conn, user_id=user_id, now=now)
    key = f"jq_{key_id}_{secrets.token_urlsafe(32)}"
    await statements.api_key_digest_set.execute(conn, key_id=key_id, digest=_digest(key))
    return ApiKey(id=key_id, user_id=user_id, api_key=key, created_at=now)


async def revoke_key(user_id: int, key_id: int) -> None:
    """Revoke one of the user's keys. Raises: `NotFound` when the user holds no such
    unrevoked key."""
    revoked = await statements.api_key_revoke.fetchval(
        db.conn(), key_id=key_id, user_id=user_id, now=clock.now()
    )
    if revoked is None:
        raise NotFound("no such key", key_id=key_id)


def key_id(key: str) -> int | None:
    """Return the id a well-formed key names, or None (a malformed key, or an id no `bigint`
    holds)."""
    match = _KEY.fullmatch(key)
    return parse_id(match.group(1)) if match else None


async def authenticate(key: str) -> tuple[int, int] | None:
    """Return `(user_id, key_id)` of a valid, unrevoked key, else None. One statement on a
    pooled connection of its own (autocommit), outside any transaction: it runs on every
    request, before the request's own transaction."""
    found = key_id(key)
    if found is None:
        return None
    async with db.current_database().pool.acquire() as conn:
        row = await statements.api_key_find.fetchrow(conn, key_id=found)
    if row is None or not hmac.compare_digest(bytes(row["digest"]), _digest(key)):
        return None
    return row["user_id"], found
