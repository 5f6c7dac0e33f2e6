"""POST /users and GET /users/<id>."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from quart.typing import TestClientProtocol as Client

from jobq.db import Connection
from tests.api.helpers import assert_error, create_user, error_locs, without_key


async def test_create_user_returns_201_and_stores_it(client: Client, conn: Connection) -> None:
    before = datetime.now(UTC)
    response = await client.post(
        "/users",
        json={
            "name": "  Ann Smith ",
            "email": "ann@example.com",
            "webhook_url": "https://hooks.example.com/ann",
        },
    )
    assert response.status_code == 201
    assert response.content_type == "application/json"
    body = await response.get_json()
    assert set(body) == {"id", "name", "email", "webhook_url", "created_at"} | {
        "api_key",
        "api_key_id",
    }
    assert isinstance(body["id"], int)
    assert body["name"] == "  Ann Smith "  # kept as sent: lengths are raw lengths
    assert body["email"] == "ann@example.com"
    assert body["webhook_url"] == "https://hooks.example.com/ann"
    created_at = datetime.fromisoformat(body["created_at"])
    assert created_at.tzinfo is not None
    assert before - timedelta(seconds=1) <= created_at <= datetime.now(UTC) + timedelta(seconds=1)

    row = await conn.fetchrow("SELECT * FROM users WHERE id = $1", body["id"])
    assert row is not None
    assert (row["name"], row["email"], row["webhook_url"]) == (
        "  Ann Smith ",
        "ann@example.com",
        "https://hooks.example.com/ann",
    )
    assert row["created_at"] == created_at


async def test_create_user_without_webhook(client: Client, conn: Connection) -> None:
    body = await create_user(client, "Bob", "bob@example.com")
    assert body["webhook_url"] is None
    assert await conn.fetchval("SELECT webhook_url FROM users WHERE id = $1", body["id"]) is None


@pytest.mark.parametrize("email", ["ann@example.com", "ANN@Example.COM", "Ann@example.com"])
async def test_a_taken_email_makes_another_user(
    client: Client, conn: Connection, email: str
) -> None:
    """Addresses are not unique (`jobq.domain.users`): a refusal would tell who is registered."""
    first = await create_user(client, "Ann", "ann@example.com")
    other = await create_user(client, "Other Ann", email)
    assert other["id"] != first["id"]
    assert other["api_key"] != first["api_key"]
    rows = await conn.fetch("SELECT id, name FROM users ORDER BY id")
    assert [(r["id"], r["name"]) for r in rows] == [
        (first["id"], "Ann"),
        (other["id"], "Other Ann"),
    ]


INVALID_USERS: list[tuple[str, Any, str]] = [
    ("missing name", {"email": "x@example.com"}, "name"),
    ("empty name", {"name": "", "email": "x@example.com"}, "name"),
    ("blank name", {"name": "   ", "email": "x@example.com"}, "name"),
    ("name too long", {"name": "n" * 201, "email": "x@example.com"}, "name"),
    ("NUL in name", {"name": "Ann\x00Smith", "email": "x@example.com"}, "name"),
    ("missing email", {"name": "Ann"}, "email"),
    ("bad email", {"name": "Ann", "email": "not-an-email"}, "email"),
    ("email without domain", {"name": "Ann", "email": "ann@"}, "email"),
    (
        "bad webhook_url",
        {"name": "Ann", "email": "x@example.com", "webhook_url": "nope"},
        "webhook_url",
    ),
    (
        "webhook_url not http",
        {"name": "Ann", "email": "x@example.com", "webhook_url": "ftp://example.com/x"},
        "webhook_url",
    ),
    ("unknown field", {"name": "Ann", "email": "x@example.com", "admin": True}, "admin"),
    ("name not a string", {"name": 123, "email": "x@example.com"}, "name"),
    ("email not a string", {"name": "Ann", "email": ["x@example.com"]}, "email"),
    (
        "webhook_url not a string",
        {"name": "Ann", "email": "x@example.com", "webhook_url": 5},
        "webhook_url",
    ),
    ("name null", {"name": None, "email": "x@example.com"}, "name"),
]


@pytest.mark.parametrize(
    ("body", "field"), [(b, f) for _, b, f in INVALID_USERS], ids=[i for i, _, _ in INVALID_USERS]
)
async def test_invalid_user_is_422_and_writes_nothing(
    client: Client, conn: Connection, body: Any, field: str
) -> None:
    response = await client.post("/users", json=body)
    assert response.status_code == 422
    assert response.content_type == "application/json"
    payload = await response.get_json()
    assert_error(payload, "validation_error")
    assert any(field in loc for loc in error_locs(payload)), payload
    for error in payload["detail"]:
        assert isinstance(error["msg"], str)
        assert isinstance(error["type"], str)
    assert await conn.fetchval("SELECT count(*) FROM users") == 0


@pytest.mark.parametrize("body", [[], ["Ann", "ann@example.com"], "Ann", 42, None])
async def test_body_not_an_object_is_422(client: Client, conn: Connection, body: Any) -> None:
    response = await client.post("/users", json=body)
    assert response.status_code == 422
    assert_error(await response.get_json(), "validation_error")
    assert await conn.fetchval("SELECT count(*) FROM users") == 0


async def test_get_user(client: Client) -> None:
    created = await create_user(client, "Ann", "ann@example.com", webhook_url="http://h.test/a")
    await create_user(client, "Bob", "bob@example.com")
    response = await client.get(f"/users/{created['id']}")
    assert response.status_code == 200
    assert await response.get_json() == without_key(created)


async def test_get_unknown_user_is_404(client: Client) -> None:
    created = await create_user(client)
    response = await client.get(f"/users/{created['id'] + 1}")
    assert response.status_code == 404
    assert response.content_type == "application/json"
    body = await response.get_json()
    assert_error(body, "not_found")
    assert body["detail"]["user_id"] == created["id"] + 1
