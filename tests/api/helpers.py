"""Helpers of the HTTP API tests."""

from __future__ import annotations

from typing import Any

from quart.typing import TestClientProtocol as Client

from tests.keyed_client import KeyedClient

JSON = dict[str, Any]


async def create_user(
    client: Client, name: str = "Ann", email: str = "ann@example.com", **extra: Any
) -> JSON:
    """POST /users and return the created user (asserting 201)."""
    response = await client.post("/users", json={"name": name, "email": email, **extra})
    assert response.status_code == 201, await response.get_data(as_text=True)
    body: JSON = await response.get_json()
    return body


async def create_reminder(client: Client, user_id: int, **body: Any) -> JSON:
    """POST /users/<id>/reminders and return the reminder (asserting 201)."""
    response = await client.post(f"/users/{user_id}/reminders", json=body)
    assert response.status_code == 201, await response.get_data(as_text=True)
    reminder: JSON = await response.get_json()
    return reminder


def assert_error(body: Any, code: str) -> None:
    """The error body every failure answers with: `{"error": code, "detail": ...}`."""
    assert isinstance(body, dict)
    assert body["error"] == code
    assert "detail" in body
    assert set(body) == {"error", "detail"}


def error_locs(body: JSON) -> list[tuple[Any, ...]]:
    """The `loc` of each field-level error in a 422 body."""
    detail = body["detail"]
    assert isinstance(detail, list)
    assert detail, "a validation error lists at least one error"
    return [tuple(e["loc"]) for e in detail]


def without_key(user: JSON) -> JSON:
    """A created user (`POST /users` answer) as `GET /users/<id>` shows it: without its key."""
    return {k: v for k, v in user.items() if k not in ("api_key", "api_key_id")}


def bearer(key: str) -> dict[str, str]:
    """The headers of a request with API key `key`."""
    return {"Authorization": f"Bearer {key}"}


def act_as(client: Client, user: JSON | None) -> None:
    """Make the test client (a `KeyedClient`) send `user`'s key by default (None: no key)."""
    assert isinstance(client, KeyedClient)
    client.key = None if user is None else user["api_key"]
