"""Abuse limits: a rate limit per API key (429 with `Retry-After`), and caps on a user's unsent
reminders and exports (409 `limit_reached`, nothing written)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from quart.typing import TestClientProtocol as Client

from jobq import db
from jobq.api.throttle import RateLimiter
from jobq.config import Settings
from jobq.db import Connection, Database
from tests.api.helpers import assert_error, bearer, create_reminder, create_user
from tests.conftest import app_of, make_settings


@pytest.fixture
def settings(database_url: str) -> Settings:
    return make_settings(
        database_url,
        rate_limit_per_s=0.5,
        rate_limit_burst=5,
        max_reminders_per_user=3,
        max_exports_per_user=2,
    )


def test_token_bucket() -> None:
    """`burst` at once, then one every 1/per_s seconds; the wait is what is missing."""
    limiter = RateLimiter(per_s=2, burst=3)
    assert [limiter.take(1, now=10.0) for _ in range(3)] == [0, 0, 0]
    assert limiter.take(1, now=10.0) == pytest.approx(0.5)
    assert limiter.take(2, now=10.0) == 0  # another key has its own bucket
    assert limiter.take(1, now=10.5) == 0  # refilled one token
    assert limiter.take(1, now=10.5) == pytest.approx(0.5)
    assert RateLimiter(per_s=0, burst=1).take(1) == 0  # 0: no limit


def test_the_limiter_forgets_the_least_recent_keys() -> None:
    limiter = RateLimiter(per_s=1, burst=1, max_keys=2)
    for key in (1, 2, 3):
        assert limiter.take(key, now=0.0) == 0
    assert limiter.take(1, now=0.0) == 0  # forgotten: a full bucket again
    assert limiter.take(3, now=0.0) > 0


async def test_a_key_over_its_rate_is_429_with_retry_after(client: Client) -> None:
    ann = await create_user(client)
    bob = await create_user(client, "Bob", "bob@example.com")
    statuses = [
        (await client.get(f"/users/{ann['id']}", headers=bearer(ann["api_key"]))).status_code
        for _ in range(5)
    ]
    assert statuses == [200] * 5
    response = await client.get(f"/users/{ann['id']}", headers=bearer(ann["api_key"]))
    assert response.status_code == 429
    assert response.headers["Retry-After"] == "2"  # one token at 0.5/s, whole seconds
    body = await response.get_json()
    assert_error(body, "too_many_requests")
    assert body["detail"]["retry_after_s"] == 2
    # Bob's key is not Ann's
    other = await client.get(f"/users/{bob['id']}", headers=bearer(bob["api_key"]))
    assert other.status_code == 200


async def test_a_restarted_app_gives_each_key_its_whole_burst_again(
    settings: Settings, database: Database
) -> None:
    """A serving's state (rate limits, key cache, throttles) is made at each start of the app,
    so a test process can serve one app to many tests: a key that spent its burst in one
    serving has all of it in the next serving of the same app."""
    app = app_of(settings)
    statuses: list[list[int]] = []
    ann: dict[str, Any] = {}
    try:
        for serving in range(2):
            async with app.test_app() as test_app:
                client = test_app.test_client()
                if serving == 0:
                    ann = await create_user(client)
                statuses.append(
                    [
                        (
                            await client.get(f"/users/{ann['id']}", headers=bearer(ann["api_key"]))
                        ).status_code
                        for _ in range(6)
                    ]
                )
    finally:
        db.bind(database)
    assert statuses == [[200] * 5 + [429]] * 2


async def test_a_limited_request_writes_nothing(client: Client, conn: Connection) -> None:
    ann = await create_user(client)
    for _ in range(5):
        await client.get(f"/users/{ann['id']}")
    response = await client.post(
        f"/users/{ann['id']}/reminders", json={"message": "x", "remind_in_seconds": 60}
    )
    assert response.status_code == 429
    assert await conn.fetchval("SELECT count(*) FROM reminders") == 0


class TestCaps:
    @pytest.fixture
    def settings(self, database_url: str) -> Settings:
        return make_settings(database_url, max_reminders_per_user=3, max_exports_per_user=2)

    async def test_unsent_reminders_are_capped(self, client: Client, conn: Connection) -> None:
        ann = await create_user(client)
        for i in range(3):
            await create_reminder(client, ann["id"], message=f"r{i}", remind_in_seconds=60)
        response = await client.post(
            f"/users/{ann['id']}/reminders", json={"message": "one more", "remind_in_seconds": 60}
        )
        assert response.status_code == 409
        body = await response.get_json()
        assert_error(body, "limit_reached")
        assert body["detail"]["limit"] == 3
        assert "reminders" in body["detail"]["message"]
        assert await conn.fetchval("SELECT count(*) FROM reminders") == 3
        assert await conn.fetchval("SELECT count(*) FROM job") == 3
        # a sent reminder no longer counts
        await conn.execute("UPDATE reminders SET sent_at = now() WHERE message = 'r0'")
        await create_reminder(client, ann["id"], message="now it fits", remind_in_seconds=60)

    async def test_concurrent_reminders_do_not_overshoot_the_cap(
        self, client: Client, conn: Connection
    ) -> None:
        ann = await create_user(client)
        responses = await asyncio.gather(
            *(
                client.post(
                    f"/users/{ann['id']}/reminders",
                    json={"message": f"r{i}", "remind_in_seconds": 60},
                )
                for i in range(8)
            )
        )
        assert sorted(r.status_code for r in responses) == [201] * 3 + [409] * 5
        assert await conn.fetchval("SELECT count(*) FROM reminders") == 3

    async def test_exports_are_capped(self, client: Client, conn: Connection) -> None:
        ann = await create_user(client)
        for _ in range(2):
            assert (await client.post(f"/users/{ann['id']}/exports")).status_code == 202
        response = await client.post(f"/users/{ann['id']}/exports")
        assert response.status_code == 409
        body = await response.get_json()
        assert_error(body, "limit_reached")
        assert body["detail"]["limit"] == 2
        assert await conn.fetchval("SELECT count(*) FROM exports") == 2
