"""Every failure answers JSON `{"error": code, "detail": ...}` with a 4xx, writes nothing, and
the service keeps serving afterwards."""

from __future__ import annotations

import json

import pytest
from quart.typing import TestClientProtocol as Client

from jobq.config import Settings
from jobq.db import Connection
from tests.api.helpers import assert_error, create_user

USER = {"name": "Ann", "email": "ann@example.com"}
JSON_HEADERS = {"Content-Type": "application/json"}


async def assert_still_serving(client: Client, conn: Connection, *, users: int = 0) -> None:
    """GET /health answers 200 and nothing was written (besides `users` made by the test)."""
    response = await client.get("/health")
    assert response.status_code == 200
    assert await conn.fetchval("SELECT count(*) FROM users") == users
    assert await conn.fetchval("SELECT count(*) FROM job") == 0


@pytest.mark.parametrize("path", ["/nope", "/users/abc", "/users/1/nope", "/exports/1.pdf"])
async def test_unknown_route_is_404(client: Client, conn: Connection, path: str) -> None:
    response = await client.get(path)
    assert response.status_code == 404
    assert response.content_type == "application/json"
    assert_error(await response.get_json(), "not_found")
    await assert_still_serving(client, conn)


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("PUT", "/users", "POST"),
        ("GET", "/users", "POST"),
        ("DELETE", "/users/1", "GET"),
        ("POST", "/health", "GET"),
        ("PATCH", "/reminders/1", "DELETE"),
    ],
)
async def test_wrong_method_is_405(
    client: Client, conn: Connection, method: str, path: str, allowed: str
) -> None:
    response = await client.open(path, method=method, json=USER)
    assert response.status_code == 405
    assert response.content_type == "application/json"
    assert_error(await response.get_json(), "method_not_allowed")
    # RFC 9110, 15.5.6: a 405 names the methods the resource supports
    allow = {m.strip() for m in response.headers.get("Allow", "").split(",")}
    assert allowed in allow
    assert method not in allow
    await assert_still_serving(client, conn)


async def test_body_too_large_is_413(client: Client, conn: Connection, settings: Settings) -> None:
    body = json.dumps({**USER, "name": "n" * (settings.max_body_bytes + 1)}).encode()
    assert len(body) > settings.max_body_bytes
    response = await client.post("/users", data=body, headers=JSON_HEADERS)
    assert response.status_code == 413
    assert response.content_type == "application/json"
    assert_error(await response.get_json(), "request_entity_too_large")
    await assert_still_serving(client, conn)


async def test_body_at_the_limit_is_read(
    client: Client, conn: Connection, settings: Settings
) -> None:
    """Just under the limit the body is read (and here rejected as invalid, not as too large)."""
    padding = settings.max_body_bytes - len(json.dumps({**USER, "name": ""}))
    body = json.dumps({**USER, "name": "n" * padding}).encode()
    assert len(body) == settings.max_body_bytes
    response = await client.post("/users", data=body, headers=JSON_HEADERS)
    assert response.status_code == 422
    assert_error(await response.get_json(), "validation_error")
    await assert_still_serving(client, conn)


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "application/xml"]
)
@pytest.mark.parametrize("length", [True, False], ids=["content-length", "no-content-length"])
async def test_wrong_content_type_is_415(
    client: Client, conn: Connection, content_type: str, length: bool
) -> None:
    body = json.dumps(USER).encode()
    headers = {"Content-Type": content_type}
    if length:
        headers["Content-Length"] = str(len(body))
    response = await client.post("/users", data=body, headers=headers)
    assert response.status_code == 415
    assert response.content_type == "application/json"
    assert_error(await response.get_json(), "unsupported_media_type")
    await assert_still_serving(client, conn)


MALFORMED = {
    "unclosed": b"{",
    "trailing comma": b'{"name": "Ann",}',
    "not json": b"not json",
    "unterminated string": b'{"name": "Ann',
    "invalid utf-8": b'{"name": "\xc3\x28", "email": "ann@example.com"}',
    "utf-16 bom": b"\xff\xfe{}",
}


@pytest.mark.parametrize("body", MALFORMED.values(), ids=MALFORMED.keys())
async def test_malformed_json_is_400(client: Client, conn: Connection, body: bytes) -> None:
    response = await client.post("/users", data=body, headers=JSON_HEADERS)
    assert response.status_code == 400
    assert response.content_type == "application/json"
    assert_error(await response.get_json(), "bad_request")
    await assert_still_serving(client, conn)


@pytest.mark.parametrize(
    "body",
    [
        "[" * 10_000 + "]" * 10_000,
        '{"a":' * 10_000 + "1" + "}" * 10_000,
        '{"name": ' + "[" * 10_000 + "]" * 10_000 + ', "email": "ann@example.com"}',
    ],
    ids=["arrays", "objects", "in a field"],
)
async def test_deeply_nested_json_is_4xx(client: Client, conn: Connection, body: str) -> None:
    response = await client.post("/users", data=body.encode(), headers=JSON_HEADERS)
    assert 400 <= response.status_code < 500
    assert response.content_type == "application/json"
    payload = await response.get_json()
    assert isinstance(payload["error"], str)
    assert "detail" in payload
    await assert_still_serving(client, conn)


async def test_deeply_nested_reminder_is_4xx(client: Client, conn: Connection) -> None:
    response = await client.post(
        "/users/1/reminders", data=("[" * 10_000 + "]" * 10_000).encode(), headers=JSON_HEADERS
    )
    assert 400 <= response.status_code < 500
    assert "error" in await response.get_json()
    await assert_still_serving(client, conn)


async def test_empty_json_body_is_4xx(client: Client, conn: Connection) -> None:
    response = await client.post("/users", data=b"", headers=JSON_HEADERS)
    assert 400 <= response.status_code < 500
    assert "error" in await response.get_json()
    await assert_still_serving(client, conn)


async def test_many_bad_requests_in_a_row_leave_the_pool_usable(
    client: Client, conn: Connection
) -> None:
    """Failed requests return their connections: far more of them than the pool holds."""
    await create_user(client, "Zed", "zed@example.com")  # whose key the client sends
    for _ in range(50):
        assert (await client.get("/users/999999")).status_code == 404
        assert (await client.post("/users", json={"name": ""})).status_code == 422
    await assert_still_serving(client, conn, users=1)
    response = await client.post("/users", json=USER)
    assert response.status_code == 201


BIGINT_MAX = 2**63 - 1


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/users/{}"),
        ("GET", "/users/{}/reminders"),
        ("POST", "/users/{}/reminders"),
        ("POST", "/users/{}/exports"),
        ("GET", "/reminders/{}"),
        ("DELETE", "/reminders/{}"),
        ("GET", "/exports/{}"),
        ("GET", "/exports/{}.ics"),
    ],
)
@pytest.mark.parametrize(
    "number", [BIGINT_MAX, BIGINT_MAX + 1, 10**30], ids=["max", "max+1", "huge"]
)
async def test_id_out_of_range_is_404(
    client: Client, conn: Connection, method: str, path: str, number: int
) -> None:
    """An id no bigint column can hold names nothing: 404, not a database error."""
    await create_user(client)  # whose key the client sends
    url = path.format(number)
    if method == "POST" and path.endswith("/reminders"):
        response = await client.post(url, json={"message": "x", "remind_in_seconds": 60})
    elif method == "POST":
        response = await client.post(url)
    elif method == "DELETE":
        response = await client.delete(url)
    else:
        response = await client.get(url)
    assert response.status_code == 404
    assert_error(await response.get_json(), "not_found")
    await assert_still_serving(client, conn, users=1)
