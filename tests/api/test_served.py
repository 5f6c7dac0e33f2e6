"""The app served by hypercorn on 127.0.0.1 and called with httpx: the cases where what a real
client sends (Content-Length, chunked bodies) differs from Quart's test client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest

from jobq.config import Settings
from jobq.db import Connection
from tests.api.helpers import bearer, without_key

USER = {"name": "Ann", "email": "ann@example.com"}


async def chunks(data: bytes) -> AsyncIterator[bytes]:
    """A body sent with `Transfer-Encoding: chunked` (no Content-Length)."""
    yield data[:10]
    yield data[10:]


async def test_create_and_read_a_user_over_http(served_http: httpx.AsyncClient) -> None:
    created = await served_http.post("/users", json=USER)
    assert created.status_code == 201
    user = created.json()
    fetched = await served_http.get(f"/users/{user['id']}", headers=bearer(user["api_key"]))
    assert fetched.status_code == 200
    assert fetched.json() == without_key(user)


async def test_chunked_json_body_is_accepted(served_http: httpx.AsyncClient) -> None:
    response = await served_http.post(
        "/users",
        content=chunks(json.dumps(USER).encode()),
        headers={"Content-Type": "application/json"},
    )
    assert response.request.headers["Transfer-Encoding"] == "chunked"
    assert response.status_code == 201


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_wrong_content_type_is_415(
    served_http: httpx.AsyncClient, conn: Connection, chunked: bool
) -> None:
    body = json.dumps(USER).encode()
    response = await served_http.post(
        "/users",
        content=chunks(body) if chunked else body,
        headers={"Content-Type": "text/plain"},
    )
    assert response.status_code == 415
    assert response.json()["error"] == "unsupported_media_type"
    assert await conn.fetchval("SELECT count(*) FROM users") == 0
    assert (await served_http.get("/health")).status_code == 200


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_body_too_large_is_413(
    served_http: httpx.AsyncClient, conn: Connection, settings: Settings, chunked: bool
) -> None:
    body = json.dumps({**USER, "name": "n" * settings.max_body_bytes}).encode()
    response = await served_http.post(
        "/users",
        content=chunks(body) if chunked else body,
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 413
    assert response.json()["error"] == "request_entity_too_large"
    assert await conn.fetchval("SELECT count(*) FROM users") == 0
    assert (await served_http.get("/health")).status_code == 200


async def test_405_names_the_allowed_methods(served_http: httpx.AsyncClient) -> None:
    response = await served_http.put("/users", json=USER)
    assert response.status_code == 405
    assert response.json()["error"] == "method_not_allowed"
    assert "POST" in response.headers["Allow"]


async def test_invalid_utf8_body_is_400(served_http: httpx.AsyncClient, conn: Connection) -> None:
    response = await served_http.post(
        "/users",
        content=b'{"name": "\xc3\x28", "email": "ann@example.com"}',
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 400
    assert response.json()["error"] == "bad_request"
    assert await conn.fetchval("SELECT count(*) FROM users") == 0
    assert (await served_http.get("/health")).status_code == 200
