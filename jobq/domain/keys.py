"""API keys: each user's bearer credentials.

A key reads `jq_<id>_<secret>`: `id` names its row (lookup by primary key), `secret` is 32
random bytes from `secrets.token_urlsafe`. Only `sha256(key)` is stored: with 256 random bits
there is nothing to brute-force, so a slow password hash (scrypt) would only cost CPU on every
request. Digests are compared with `hmac.compare_digest`. A key is shown once, when made.
A user may hold several keys (up to `max_keys_per_user`): a new key does not revoke the old
ones, so a client can switch over before revoking its old key.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import secrets
import time
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


KEY_CACHE_TTL_S = 1.0
"""How long a process trusts a key's lookup: a revocation made elsewhere is seen within it."""

Found = dict[int, tuple[int, bytes]]
"""Keys looked up: each key's id to its owner's id and its digest (unrevoked keys only)."""


class KeyCache:
    """The owner and digest of each key looked up in the last `ttl_s` seconds (monotonic clock,
    from before the lookup was sent), at most `max_keys` of them: a revocation is seen within
    `ttl_s` everywhere (at once in the process that made it: `forget_after_commit`).

    A key not cached, or cached too long ago, is looked up together with every other key of the
    cache past half its `ttl_s`, in one statement (`lookup`): however many keys are in use, a
    process looks them up about twice per `ttl_s`, not once per key. Requests for a key whose
    lookup is in flight wait for it rather than send another."""

    def __init__(self, ttl_s: float = KEY_CACHE_TTL_S, max_keys: int = 10_000) -> None:
        self.ttl_s = ttl_s
        self.max_keys = max_keys
        self._found: dict[int, tuple[float, int, bytes]] = {}
        self._pending: dict[int, asyncio.Task[Found]] = {}

    def get(self, key_id: int) -> tuple[int, bytes] | None:
        """The cached `(user_id, digest)` of key `key_id`, unless missing or too old."""
        found = self._found.get(key_id)
        if found is None or time.monotonic() - found[0] > self.ttl_s:
            return None
        return found[1], found[2]

    def put(self, key_id: int, user_id: int, digest: bytes, looked_up: float) -> None:
        """Remember key `key_id`, looked up at `looked_up` (`time.monotonic()`)."""
        if len(self._found) >= self.max_keys:
            self._found.clear()  # a second's worth of keys: refilled as they come
        self._found[key_id] = (looked_up, user_id, digest)

    async def lookup(self, key_id: int) -> tuple[int, bytes] | None:
        """The `(user_id, digest)` of key `key_id` (None: unknown or revoked): cached, else
        looked up with the cache's aging keys in one statement, or by the lookup in flight that
        covers it (on a pooled connection of its own, autocommit). Raises: `asyncpg` errors."""
        cached = self.get(key_id)
        if cached is not None:
            return cached
        task = self._pending.get(key_id)
        if task is None:
            now = time.monotonic()
            aging = [
                k
                for k, (at, _, _) in self._found.items()
                if now - at > self.ttl_s / 2 and k not in self._pending
            ]
            ids = sorted({key_id, *aging})
            # a task: a request cancelled meanwhile does not cancel the others' lookup
            task = asyncio.get_running_loop().create_task(self._look_up(ids, now))
            for k in ids:
                self._pending[k] = task
        return (await asyncio.shield(task)).get(key_id)

    async def _look_up(self, ids: list[int], now: float) -> Found:
        try:
            async with db.current_database().pool.acquire() as conn:
                rows = await statements.api_key_find_many.fetch(conn, key_ids=ids)
        finally:
            for k in ids:
                self._pending.pop(k, None)
        found = {r["id"]: (r["user_id"], bytes(r["digest"])) for r in rows}
        for k in ids:
            if k in found:
                self.put(k, *found[k], now)
            else:
                self._found.pop(k, None)
        return found

    def forget_after_commit(self, key_id: int) -> None:
        """Forget key `key_id` once the transaction in progress commits (a revocation)."""

        def forget() -> None:
            self._found.pop(key_id, None)

        tx = db.current_transaction()
        if tx is None:
            forget()
        else:
            tx.after_commit.append(forget)


async def authenticate(key: str, cache: KeyCache | None = None) -> tuple[int, int] | None:
    """Return `(user_id, key_id)` of a valid, unrevoked key, else None. The lookup is one
    statement on a pooled connection of its own (autocommit), outside any transaction: it runs
    before the request's own transaction, unless `cache` has the key (`KeyCache.lookup`)."""
    found = key_id(key)
    if found is None:
        return None
    digest = _digest(key)
    if cache is not None:
        cached = cache.get(found)
        if cached is None or not hmac.compare_digest(cached[1], digest):
            cached = await cache.lookup(found)
    else:
        async with db.current_database().pool.acquire() as conn:
            row = await statements.api_key_find.fetchrow(conn, key_id=found)
        cached = None if row is None else (row["user_id"], bytes(row["digest"]))
    if cached is None or not hmac.compare_digest(cached[1], digest):
        return None
    return cached[0], found
