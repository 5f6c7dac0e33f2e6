"""Hostile input, by hand: each case gets a clear 4xx with the JSON error body, writes nothing
(the rows of every table are counted before and after), and the service keeps serving.

Cases covered elsewhere are not repeated: malformed JSON, invalid UTF-8 to `/users`, JSON
nested 10,000 deep, ids beyond bigint, wrong methods and media types (`test_errors`); field by
field validation of users and reminders (`test_users`, `test_reminders`); the body limit just
over and at the limit (`test_errors`, `test_served`); SQL-looking values stored verbatim
(`test_security`); bad query strings of the admin list (`test_admin`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import threading
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from quart.typing import TestClientProtocol as Client

from jobq.config import Settings
from jobq.db import Connection
from tests.api.conftest import ADMIN, ADMIN_TOKEN
from tests.api.helpers import assert_error, create_reminder, create_user
from tests.conftest import make_settings

TABLES = ("users", "reminders", "exports", "job", "job_running", "job_dead")
JSON_HEADERS = {"Content-Type": "application/json"}
TEN_MB = 10 * 1024 * 1024


@pytest.fixture
def settings(database_url: str) -> Settings:
    """The test settings, with an admin token (the admin POST is attacked too)."""
    return make_settings(database_url, admin_token=ADMIN_TOKEN)


async def snapshot(conn: Connection) -> dict[str, list[Any]]:
    """Every row of every table the API writes, to compare before and after."""
    return {
        table: [dict(r) for r in await conn.fetch(f"SELECT * FROM {table} ORDER BY id")]
        for table in TABLES
    }


@pytest.fixture
async def ann(client: Client, conn: Connection) -> AsyncIterator[dict[str, Any]]:
    """User Ann, created before the attack; afterwards nothing has changed and a valid request
    still works."""
    user = await create_user(client)
    before = await snapshot(conn)
    yield user
    assert await snapshot(conn) == before
    assert (await client.get("/health")).status_code == 200
    assert (await client.get(f"/users/{user['id']}")).status_code == 200
    await create_user(client, "Bob", "bob@example.com")


async def post_raw(client: Client, path: str, body: bytes) -> tuple[int, Any]:
    response = await client.post(path, data=body, headers=JSON_HEADERS)
    assert response.content_type == "application/json"
    return response.status_code, await response.get_json()


def reminder(**fields: Any) -> bytes:
    return json.dumps({"message": "x", **fields}).encode()


# -- bodies of 10 MB ---------------------------------------------------------------------------


def ten_mb_json() -> bytes:
    return json.dumps({"name": "n" * TEN_MB, "email": "ann@example.com"}).encode()


@pytest.mark.parametrize("path", ["/users", "/users/1/reminders", "/users/1/exports"])
async def test_a_10_mb_body_is_413(client: Client, ann: dict[str, Any], path: str) -> None:
    status, body = await post_raw(client, path, ten_mb_json())
    assert status == 413
    assert_error(body, "request_entity_too_large")


async def test_a_10_mb_body_to_an_admin_endpoint_is_413(
    client: Client, ann: dict[str, Any]
) -> None:
    response = await client.post(
        "/jobs/dead/1/retry", data=ten_mb_json(), headers={**JSON_HEADERS, **ADMIN}
    )
    assert response.status_code == 413
    assert_error(await response.get_json(), "request_entity_too_large")


async def test_a_10_mb_body_without_a_json_type_is_413_not_read_whole(
    client: Client, ann: dict[str, Any]
) -> None:
    """The 415 check reads the body, within the limit: a large body is 413 first."""
    response = await client.post(
        "/users", data=b"x" * TEN_MB, headers={"Content-Type": "text/plain"}
    )
    assert response.status_code == 413
    assert_error(await response.get_json(), "request_entity_too_large")


async def test_a_10_mb_body_to_a_view_that_ignores_bodies_is_413_and_it_does_not_run(
    client: Client, conn: Connection
) -> None:
    """Every body is bounded, whatever the method: a DELETE with 10 MB is refused, not run."""
    user = await create_user(client)
    created = await create_reminder(client, user["id"], message="keep me", remind_in_seconds=60)
    before = await snapshot(conn)
    url = f"/reminders/{created['id']}"
    for send in (client.delete, client.get):
        response = await send(url, data=ten_mb_json())
        assert response.status_code == 413, send
        assert_error(await response.get_json(), "request_entity_too_large")
    assert await snapshot(conn) == before
    assert (await client.delete(f"/reminders/{created['id']}")).status_code == 204


def post_raw_http(port: int, path: str, body: bytes, *, chunked: bool) -> tuple[int, Any]:
    """POST `body` over a raw HTTP/1.1 connection, reading the answer while a thread still
    sends, as curl does (httpx reads nothing before it has sent everything, so a server that
    answers 413 early and closes makes it fail). Blocking: call it in a thread. Return the
    status and the JSON body."""
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}"
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"{framing}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:

        def send() -> None:
            with contextlib.suppress(OSError):  # the server answered and closed: expected
                sock.sendall(head.encode())
                for start in range(0, len(body), 65536):
                    piece = body[start : start + 65536]
                    sock.sendall(
                        f"{len(piece):x}\r\n".encode() + piece + b"\r\n" if chunked else piece
                    )
                if chunked:
                    sock.sendall(b"0\r\n\r\n")

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = sock.recv(65536)
            assert chunk, f"the connection ended before an answer: {received!r}"
            received += chunk
        header, _, rest = received.partition(b"\r\n\r\n")
        length = re.search(rb"(?i)content-length:\s*(\d+)", header)
        assert length is not None, header
        while len(rest) < int(length.group(1)):
            chunk = sock.recv(65536)
            assert chunk, "the connection ended within the answer"
            rest += chunk
    sender.join(timeout=10)
    return int(header.split(b" ", 2)[1]), json.loads(rest)


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_10_mb_body_over_http_is_413_and_the_server_keeps_serving(
    served_http: httpx.AsyncClient, conn: Connection, chunked: bool
) -> None:
    port = served_http.base_url.port
    assert port is not None
    status, payload = await asyncio.to_thread(
        post_raw_http, port, "/users", ten_mb_json(), chunked=chunked
    )
    assert status == 413
    assert_error(payload, "request_entity_too_large")
    assert await conn.fetchval("SELECT count(*) FROM users") == 0
    assert (await served_http.get("/health")).status_code == 200
    ok = await served_http.post("/users", json={"name": "Ann", "email": "ann@example.com"})
    assert ok.status_code == 201


# -- invalid UTF-8, NUL bytes ------------------------------------------------------------------

BAD_TEXT: dict[str, tuple[str, bytes, int, str]] = {
    "invalid utf-8 in a reminder": (
        "/users/1/reminders",
        b'{"message": "\xff\xfe", "remind_in_seconds": 60}',
        400,
        "bad_request",
    ),
    "overlong utf-8 (an encoded '/')": (
        "/users",
        b'{"name": "a\xc0\xafb", "email": "ann2@example.com"}',
        400,
        "bad_request",
    ),
    "utf-8 of a surrogate": (
        "/users",
        b'{"name": "a\xed\xa0\x80b", "email": "ann2@example.com"}',
        400,
        "bad_request",
    ),
    "a lone surrogate escaped in JSON": (
        "/users",
        b'{"name": "a\\ud800b", "email": "ann2@example.com"}',
        422,
        "validation_error",
    ),
    "a raw NUL byte in a JSON string": (
        "/users",
        b'{"name": "a\x00b", "email": "ann2@example.com"}',
        400,
        "bad_request",
    ),
    "a raw NUL byte outside strings": (
        "/users",
        b'{"name": "Ann",\x00 "email": "ann2@example.com"}',
        400,
        "bad_request",
    ),
    "NUL in an e-mail address": (
        "/users",
        b'{"name": "Ann", "email": "ann\\u0000@example.com"}',
        422,
        "validation_error",
    ),
    "NUL in a webhook url": (
        "/users",
        b'{"name": "Ann", "email": "ann2@example.com", "webhook_url": "http://h\\u0000.example/"}',
        422,
        "validation_error",
    ),
    "NUL in a reminder's message": (
        "/users/1/reminders",
        b'{"message": "\\u0000", "remind_in_seconds": 60}',
        422,
        "validation_error",
    ),
}


@pytest.mark.parametrize(("path", "body", "status", "error"), BAD_TEXT.values(), ids=BAD_TEXT)
async def test_bad_text_is_4xx(
    client: Client, ann: dict[str, Any], path: str, body: bytes, status: int, error: str
) -> None:
    got, payload = await post_raw(client, path, body)
    assert got == status, payload
    assert_error(payload, error)


@pytest.mark.parametrize("path", ["/users/1%00", "/users/%00", "/reminders/1%00/", "/users/1\x00"])
async def test_nul_in_the_path_is_404(client: Client, ann: dict[str, Any], path: str) -> None:
    response = await client.get(path)
    assert response.status_code == 404
    assert_error(await response.get_json(), "not_found")


# -- numbers beyond 64 bits --------------------------------------------------------------------

BIG_NUMBERS: dict[str, bytes] = {
    "2**64 seconds": reminder(remind_in_seconds=2**64),
    "-2**64 seconds": reminder(remind_in_seconds=-(2**64)),
    "400-digit seconds": reminder(remind_in_seconds=10**400),
    "1e400 seconds (infinite as a float)": b'{"message": "x", "remind_in_seconds": 1e400}',
    "-1e400 seconds": b'{"message": "x", "remind_in_seconds": -1e400}',
    "NaN seconds": b'{"message": "x", "remind_in_seconds": NaN}',
    "Infinity seconds": b'{"message": "x", "remind_in_seconds": Infinity}',
    "2**64 as a unix time": reminder(remind_at=2**64),
    "1e20 as a unix time": reminder(remind_at=1e20),
    "a 2**64 message": reminder(message=2**64),
}


@pytest.mark.parametrize("body", BIG_NUMBERS.values(), ids=BIG_NUMBERS)
async def test_numbers_beyond_64_bits_are_4xx(
    client: Client, ann: dict[str, Any], body: bytes
) -> None:
    status, payload = await post_raw(client, f"/users/{ann['id']}/reminders", body)
    if status == 201:
        pytest.fail(f"accepted: {payload}")
    assert status in (400, 422), payload
    assert_error(payload, "validation_error" if status == 422 else "bad_request")


@pytest.mark.parametrize("digits", [4301, 20_000])
async def test_an_integer_too_long_to_parse_is_400(
    client: Client, ann: dict[str, Any], digits: int
) -> None:
    """Python refuses to convert integers of more than 4,300 digits (CVE-2020-10735)."""
    body = b'{"message": "x", "remind_in_seconds": 1' + b"0" * digits + b"}"
    status, payload = await post_raw(client, f"/users/{ann['id']}/reminders", body)
    assert status in (400, 422), payload
    assert_error(payload, "validation_error" if status == 422 else "bad_request")


# -- SQL-looking strings -----------------------------------------------------------------------

SQL = "'; DROP TABLE users; --"


@pytest.mark.parametrize(
    "email",
    [f"{SQL}@example.com", f"ann@example.com{SQL}", "ann@example.com' OR '1'='1", SQL],
)
async def test_sql_looking_email_is_422(client: Client, ann: dict[str, Any], email: str) -> None:
    response = await client.post("/users", json={"name": "Eve", "email": email})
    assert response.status_code == 422
    assert_error(await response.get_json(), "validation_error")


@pytest.mark.parametrize(
    "path",
    [
        "/users/1;DROP TABLE users",
        "/users/1%20OR%201=1",
        "/users/1'--",
        "/reminders/1%3B%20DELETE%20FROM%20reminders",
        "/users/1%27%20UNION%20SELECT%20*%20FROM%20users--/reminders",
    ],
)
async def test_sql_looking_path_is_404(client: Client, ann: dict[str, Any], path: str) -> None:
    response = await client.get(path)
    assert response.status_code == 404
    assert_error(await response.get_json(), "not_found")


async def test_sql_looking_webhook_url_is_422(client: Client, ann: dict[str, Any]) -> None:
    response = await client.post(
        "/users",
        json={"name": "Eve", "email": "eve@example.com", "webhook_url": f"http://{SQL}/"},
    )
    assert response.status_code == 422
    assert_error(await response.get_json(), "validation_error")


# -- naive and far-future datetimes ------------------------------------------------------------

BAD_TIMES = [
    "2031-03-05T10:00:00",  # naive
    "2031-03-05",  # a date, no time nor offset
    "9999-12-31T23:59:59Z",  # far future
    "9999-12-31T23:59:59-14:00",  # beyond year 9999 once in UTC
    "+10000-01-01T00:00:00Z",  # a five-digit year
    "0001-01-01T00:00:00+14:00",  # before year 1 once in UTC
    "1970-01-01T00:00:00Z",  # the past
    "2031-02-30T10:00:00Z",  # no such day
    "2031-03-05T25:00:00Z",  # no such hour
    "2031-03-05T10:00:00+24:00",  # no such offset
    "2031-03-05T10:00:00 Europe/Paris",  # a zone name is not an offset
    "",
]


@pytest.mark.parametrize("remind_at", BAD_TIMES)
async def test_naive_and_far_future_datetimes_are_422(
    client: Client, ann: dict[str, Any], remind_at: str
) -> None:
    status, payload = await post_raw(
        client, f"/users/{ann['id']}/reminders", reminder(remind_at=remind_at)
    )
    assert status == 422, payload
    assert_error(payload, "validation_error")


# -- unicode e-mail addresses ------------------------------------------------------------------


@pytest.mark.parametrize(
    "email",
    [
        "ann\u202e@example.com",  # right-to-left override
        "ann\u200b@example.com",  # zero-width space
        "ann\uff20example.com",  # full-width at sign
        "ann@exa mple.com",
        "ann@b\u00fccher",  # no top-level domain
        "ann@b\u00fccher.test",  # a special-use domain
        "\u0430nn@@example.com",
        "ann@" + "\u00e4" * 300 + ".com",  # over 254 characters
    ],
)
async def test_invalid_unicode_email_is_422(
    client: Client, ann: dict[str, Any], email: str
) -> None:
    response = await client.post("/users", json={"name": "Eve", "email": email})
    assert response.status_code == 422
    assert_error(await response.get_json(), "validation_error")


@pytest.mark.parametrize(
    ("email", "stored"),
    [
        ("\u00e4nn\u00e4@example.com", "\u00e4nn\u00e4@example.com"),
        ("\u7528\u6237@\u4f8b\u5b50.\u5e7f\u544a", "\u7528\u6237@\u4f8b\u5b50.\u5e7f\u544a"),
        ("ann@B\u00dcCHER.de", "ann@b\u00fccher.de"),  # the domain is normalised
        ("ann@xn--bcher-kva.de", "ann@b\u00fccher.de"),  # punycode, read as unicode
    ],
)
async def test_valid_unicode_email_is_stored_normalised(
    client: Client, conn: Connection, email: str, stored: str
) -> None:
    response = await client.post("/users", json={"name": "Ann", "email": email})
    assert response.status_code == 201, await response.get_json()
    assert (await response.get_json())["email"] == stored
    assert await conn.fetchval("SELECT email FROM users") == stored


# -- unknown fields and wrong types ------------------------------------------------------------

WRONG_SHAPES: dict[str, tuple[str, Any]] = {
    "reminder body an array": ("/users/1/reminders", [{"message": "x"}]),
    "reminder body a string": ("/users/1/reminders", "remind me"),
    "reminder body null": ("/users/1/reminders", None),
    "reminder body a number": ("/users/1/reminders", 60),
    "message an object": ("/users/1/reminders", {"message": {"x": 1}, "remind_in_seconds": 5}),
    "message a list": ("/users/1/reminders", {"message": ["x"], "remind_in_seconds": 5}),
    "message null": ("/users/1/reminders", {"message": None, "remind_in_seconds": 5}),
    "remind_at a list": ("/users/1/reminders", {"message": "x", "remind_at": ["2031"]}),
    "remind_at an object": ("/users/1/reminders", {"message": "x", "remind_at": {"y": 2031}}),
    "remind_at a boolean": ("/users/1/reminders", {"message": "x", "remind_at": True}),
    "seconds a list": ("/users/1/reminders", {"message": "x", "remind_in_seconds": [5]}),
    "seconds a string": ("/users/1/reminders", {"message": "x", "remind_in_seconds": "5s"}),
    "an unknown field with a nested value": (
        "/users/1/reminders",
        {"message": "x", "remind_in_seconds": 5, "extra": {"a": [1, {"b": None}]}},
    ),
    "an unknown field only": ("/users/1/reminders", {"id": 1}),
    "a field set to its own id": (
        "/users",
        {"id": 99, "name": "Eve", "email": "eve@example.com"},
    ),
    "created_at set by the client": (
        "/users",
        {"name": "Eve", "email": "eve@example.com", "created_at": "2020-01-01T00:00:00Z"},
    ),
    "a name object": ("/users", {"name": {"first": "Eve"}, "email": "eve@example.com"}),
    "an email number": ("/users", {"name": "Eve", "email": 42}),
    "a webhook object": (
        "/users",
        {"name": "Eve", "email": "eve@example.com", "webhook_url": {"url": "http://h.test"}},
    ),
}


@pytest.mark.parametrize(("path", "body"), WRONG_SHAPES.values(), ids=WRONG_SHAPES)
async def test_unknown_fields_and_wrong_types_are_422(
    client: Client, ann: dict[str, Any], path: str, body: Any
) -> None:
    status, payload = await post_raw(client, path, json.dumps(body).encode())
    assert status == 422, payload
    assert_error(payload, "validation_error")
