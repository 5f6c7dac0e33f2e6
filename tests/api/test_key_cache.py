"""The cache of API key lookups (`jobq.domain.keys.KeyCache`): a key in use is looked up once per
TTL, a revocation made by another process is seen once the TTL has passed, and at once in the
process that made it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from quart.typing import TestClientProtocol as Client

from jobq.db import Connection, Database
from jobq.domain import keys
from jobq.domain.keys import KeyCache
from tests.api.helpers import bearer, create_user


class Monotonic:
    """The cache's monotonic clock, moved by the test: a TTL passes, or not, however slow the
    machine."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 1000.0
        monkeypatch.setattr(keys, "time", SimpleNamespace(monotonic=lambda: self.now))

    def advance(self, seconds: float) -> None:
        self.now += seconds


async def revoke_elsewhere(conn: Connection, key_id: int) -> None:
    """Revoke a key as another process would: in the database, behind this one's cache."""
    await conn.execute("UPDATE api_keys SET revoked_at = now() WHERE id = $1", key_id)


async def test_a_key_in_use_is_looked_up_once_per_ttl(
    client: Client, database: Database, conn: Connection
) -> None:
    ann = await create_user(client)
    cache = KeyCache(ttl_s=3600)
    assert await keys.authenticate(ann["api_key"], cache) == (ann["id"], ann["api_key_id"])
    await revoke_elsewhere(conn, ann["api_key_id"])
    # within the TTL the lookup is not made again (what the cache is for)
    assert await keys.authenticate(ann["api_key"], cache) == (ann["id"], ann["api_key_id"])
    assert await keys.authenticate(ann["api_key"]) is None  # no cache: looked up


async def test_a_revocation_elsewhere_is_seen_once_the_ttl_has_passed(
    client: Client, database: Database, conn: Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Monotonic(monkeypatch)
    ann = await create_user(client)
    cache = KeyCache(ttl_s=60)
    assert await keys.authenticate(ann["api_key"], cache) is not None
    await revoke_elsewhere(conn, ann["api_key_id"])
    clock.advance(59)
    assert await keys.authenticate(ann["api_key"], cache) is not None  # within the TTL: cached
    clock.advance(2)
    assert await keys.authenticate(ann["api_key"], cache) is None


async def test_a_wrong_secret_is_refused_even_when_its_key_is_cached(
    client: Client, database: Database
) -> None:
    ann = await create_user(client)
    cache = KeyCache(ttl_s=3600)
    assert await keys.authenticate(ann["api_key"], cache) is not None
    wrong = ann["api_key"][:-4] + ("AAAA" if not ann["api_key"].endswith("AAAA") else "BBBB")
    assert await keys.authenticate(wrong, cache) is None
    assert await keys.authenticate(ann["api_key"], cache) is not None


async def test_a_revocation_through_the_api_is_seen_at_once(client: Client) -> None:
    ann = await create_user(client)
    new = await (await client.post(f"/users/{ann['id']}/keys")).get_json()
    old = bearer(ann["api_key"])
    assert (await client.get(f"/users/{ann['id']}", headers=old)).status_code == 200  # cached
    revoked = await client.delete(
        f"/users/{ann['id']}/keys/{ann['api_key_id']}", headers=bearer(new["api_key"])
    )
    assert revoked.status_code == 204
    assert (await client.get(f"/users/{ann['id']}", headers=old)).status_code == 401


async def test_a_lookup_checks_again_the_keys_past_half_their_ttl(
    client: Client, database: Database, conn: Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Monotonic(monkeypatch)
    ann, bob, cid = [await create_user(client, email=f"{n}@example.com") for n in "abc"]
    cache = KeyCache(ttl_s=40)
    assert await keys.authenticate(ann["api_key"], cache) is not None
    assert await keys.authenticate(bob["api_key"], cache) is not None
    clock.advance(25)  # past half the TTL, within it
    await revoke_elsewhere(conn, ann["api_key_id"])
    # a key not cached is looked up with the aging ones: Ann's revocation is seen before her
    # entry's TTL is up, and Bob's entry starts a new TTL
    assert await keys.authenticate(cid["api_key"], cache) is not None
    assert cache.get(ann["api_key_id"]) is None
    clock.advance(20)  # Bob's first lookup is past the TTL now, his second is not
    assert cache.get(bob["api_key_id"]) is not None
    assert await keys.authenticate(ann["api_key"], cache) is None
