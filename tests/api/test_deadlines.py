"""Request deadlines, with real sockets against the app served as `python -m jobq serve` serves
it (`jobq.__main__.http_config`): a body trickled a byte at a time is cut at
`JOBQ_BODY_TIMEOUT_S` (408, connection closed), headers trickled are cut at `HEADER_TIMEOUT_S`,
and the service answers others meanwhile."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from urllib.parse import urlsplit

import httpx
import pytest

from jobq import db
from jobq.__main__ import HEADER_TIMEOUT_S, http_config
from jobq.app import create_app
from jobq.db import Connection, Database
from tests.conftest import make_settings
from tests.toolkit.served import served

BODY_TIMEOUT_S = 1.5
SLOW_CLIENTS = 6
TRICKLE_EVERY_S = 0.5
"""A byte every half second: a body of 1,000 bytes would take over eight minutes."""
GIVE_UP_S = 30
"""The longest a test trickles before it calls the server's deadline missing (generous: the
deadlines are seconds, on a machine half as fast under load too)."""


@pytest.fixture
async def base_url(pool_url: str, database: Database) -> AsyncIterator[str]:
    settings = make_settings(pool_url, body_timeout=timedelta(seconds=BODY_TIMEOUT_S))
    try:
        async with served(create_app(settings), http_config(settings)) as url:
            yield url
    finally:
        db.bind(database)


async def trickle(base_url: str, head: bytes, body: bytes) -> tuple[bytes, float]:
    """Open a connection, send `head` whole, then `body` a byte every `TRICKLE_EVERY_S` until
    the server answers or closes; return what it sent and how long the connection lasted."""
    address = urlsplit(base_url)
    reader, writer = await asyncio.open_connection(address.hostname, address.port)
    started = time.monotonic()
    writer.write(head)
    answer = b""

    async def send() -> None:
        for i in range(len(body)):
            await asyncio.sleep(TRICKLE_EVERY_S)
            writer.write(body[i : i + 1])
            await writer.drain()

    sender = asyncio.create_task(send())
    try:
        async with asyncio.timeout(GIVE_UP_S):
            while chunk := await reader.read(4096):
                answer += chunk
    finally:
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
        writer.close()
    return answer, time.monotonic() - started


async def test_slow_bodies_are_cut_at_the_deadline(base_url: str, conn: Connection) -> None:
    body = b'{"name": "Slow", "email": "slow@example.com"}' + b" " * 1000
    head = (
        b"POST /users HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    slow = [asyncio.create_task(trickle(base_url, head, body)) for _ in range(SLOW_CLIENTS)]
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as http:
        await asyncio.sleep(TRICKLE_EVERY_S)
        health = await http.get("/health")  # others are served meanwhile
        assert health.status_code == 200
    for answer, lasted in await asyncio.gather(*slow):
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:100]
        assert b'"error":"request_timeout"' in answer
        assert BODY_TIMEOUT_S <= lasted < GIVE_UP_S  # cut by the server, which closed it
    assert await conn.fetchval("SELECT count(*) FROM users") == 0


async def test_slow_headers_are_cut_at_the_deadline(base_url: str) -> None:
    head = b"GET /health HTTP/1.1\r\n"
    headers = b"Host: test\r\nX-Slow: " + b"a" * 200 + b"\r\n\r\n"
    answers = await asyncio.gather(*(trickle(base_url, head, headers) for _ in range(3)))
    for answer, lasted in answers:
        assert not answer.startswith(b"HTTP/1.1 200")  # never read whole
        assert HEADER_TIMEOUT_S <= lasted < GIVE_UP_S
