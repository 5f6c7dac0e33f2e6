"""Anonymous callers throttled per client address (`jobq.api.throttle`), over real connections
to the served app: sign-ups, failed API keys and admin tokens; and a taken e-mail address that
tells nothing."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from jobq import db
from jobq.api.throttle import FAILURE_BURST, SIGNUP_BURST, RateLimiter, client_key
from jobq.app import create_app
from jobq.db import Connection, Database
from tests.api.conftest import ADMIN, ADMIN_TOKEN
from tests.conftest import make_settings
from tests.toolkit.served import served


@pytest.fixture
async def http(pool_url: str, database: Database) -> AsyncIterator[httpx.AsyncClient]:
    """The app served with the default throttles (an admin token set), and a client with up
    to 20 connections."""
    settings = make_settings(
        pool_url, admin_token=ADMIN_TOKEN, signup_rate_per_hour=20, auth_failures_per_min=10
    )
    limits = httpx.Limits(max_connections=20)
    try:
        async with (
            served(create_app(settings)) as url,
            httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client,
        ):
            yield client
    finally:
        db.bind(database)


def user(n: int) -> dict[str, Any]:
    return {"name": f"User {n}", "email": f"user{n}@example.com"}


async def test_sign_ups_from_one_address_are_throttled(
    http: httpx.AsyncClient, conn: Connection
) -> None:
    answers = await asyncio.gather(*(http.post("/users", json=user(n)) for n in range(30)))
    statuses = Counter(a.status_code for a in answers)
    assert statuses == {201: SIGNUP_BURST, 429: 30 - SIGNUP_BURST}
    refused = next(a for a in answers if a.status_code == 429)
    assert refused.json()["error"] == "too_many_requests"
    assert 60 <= int(refused.headers["Retry-After"]) <= 180  # 20 an hour: one every 3 minutes
    assert await conn.fetchval("SELECT count(*) FROM users") == SIGNUP_BURST
    invalid = await http.post("/users", json={"name": "x"})  # counted before validation
    assert invalid.status_code == 429


async def test_failed_api_keys_slow_their_sender_down(
    http: httpx.AsyncClient, conn: Connection
) -> None:
    ann = (await http.post("/users", json=user(1))).json()
    right = {"Authorization": f"Bearer {ann['api_key']}"}
    wrong_key = ann["api_key"][:-4] + "AAAA"
    guesses = await asyncio.gather(
        *(
            http.get(f"/users/{ann['id']}", headers={"Authorization": f"Bearer {wrong_key}"})
            for _ in range(FAILURE_BURST + 15)
        )
    )
    statuses = Counter(g.status_code for g in guesses)
    assert statuses[401] + statuses[429] == FAILURE_BURST + 15
    assert statuses[401] >= FAILURE_BURST
    throttled = await http.get(f"/users/{ann['id']}", headers=right)  # the right key waits too
    assert throttled.status_code == 429
    # Guesses sent at once may all be checked (each awaits the database) but each costs its
    # token: the sender waits until the refill (10 a minute: 6 s each) has paid for them all.
    debt = statuses[401] - FAILURE_BURST
    assert int(throttled.headers["Retry-After"]) >= 6 * debt
    assert (await http.get("/health")).status_code == 200  # no credential: not throttled


async def test_admin_token_guessing_is_throttled(http: httpx.AsyncClient) -> None:
    wrong = {"Authorization": "Bearer not-the-admin-token-0123"}
    guesses = [await http.get("/workers", headers=wrong) for _ in range(FAILURE_BURST)]
    assert {g.status_code for g in guesses} == {401}
    for path in ("/workers", "/jobs/stats", "/metrics", "/dashboard/"):
        for headers in (wrong, ADMIN):
            response = await http.get(path, headers=headers)
            assert response.status_code == 429, (path, headers)
            assert response.json()["error"] == "too_many_requests"
            assert int(response.headers["Retry-After"]) >= 1


async def test_a_taken_email_gets_the_same_answer_as_a_new_one(
    http: httpx.AsyncClient, conn: Connection
) -> None:
    """Sign-up sends no mail and answers with a working key at once: a unique address would
    make its answer an oracle of who is registered. Two users may give the same address."""
    first = await http.post("/users", json={"name": "Ann", "email": "ann@example.com"})
    again = await http.post("/users", json={"name": "Eve", "email": "ANN@example.com"})
    fresh = await http.post("/users", json={"name": "Cy", "email": "cy@example.com"})
    assert first.status_code == again.status_code == fresh.status_code == 201
    assert set(again.json()) == set(fresh.json())
    assert set(again.headers) == set(fresh.headers)
    assert again.json()["id"] != first.json()["id"]
    for created in (first, again):
        body = created.json()
        mine = await http.get(
            f"/users/{body['id']}", headers={"Authorization": f"Bearer {body['api_key']}"}
        )
        assert mine.json()["name"] == body["name"]
    assert (
        await conn.fetchval("SELECT count(*) FROM users WHERE lower(email) = 'ann@example.com'")
        == 2
    )


def test_buckets_refill_at_their_rate() -> None:
    limiter = RateLimiter(per_s=0.5, burst=2)
    assert [limiter.take("a", now=0) for _ in range(2)] == [0, 0]
    assert limiter.wait("a", now=0) == pytest.approx(2)
    assert limiter.take("a", now=0) == pytest.approx(2)  # refused: nothing taken
    assert limiter.wait("a", now=1) == pytest.approx(1)
    assert limiter.take("a", now=2) == 0
    assert limiter.take("b", now=2) == 0  # another address has its own
    for _ in range(3):
        limiter.charge("b", now=2)  # into debt: 1 - 3 = -2 tokens
    assert limiter.wait("b", now=2) == pytest.approx(6)


@pytest.mark.parametrize(
    ("address", "key"),
    [
        ("203.0.113.7", "203.0.113.7"),
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
        ("2001:db8:1:2::ffff", "2001:db8:1:2::/64"),
        ("::ffff:203.0.113.7", "203.0.113.7"),
        (None, "-"),
        ("unix-socket", "unix-socket"),
    ],
)
def test_an_ipv6_client_counts_by_its_64(address: str | None, key: str) -> None:
    assert client_key(address) == key
