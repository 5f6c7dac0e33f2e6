"""A real webhook receiver for tests: a minimal HTTP/1.1 server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus


@dataclass(frozen=True)
class Received:
    """One request the receiver got: header names are lower-case; `body` is the raw bytes;
    `received_at` is when it arrived."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    received_at: datetime


def signature(secret: str, body: bytes) -> str:
    """The `X-Jobq-Signature` a delivery of `body` must carry: computed here, independently of
    jobq's own signing code."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def assert_reminder_delivery(
    request: Received,
    *,
    secret: str,
    reminder_id: int,
    user_id: int,
    message: str,
    remind_at: datetime,
    attempt: int = 1,
) -> None:
    """Assert that `request` is a signed JSON POST of that reminder to `/hook`."""
    assert (request.method, request.path) == ("POST", "/hook")
    assert request.headers["content-type"] == "application/json"
    assert hmac.compare_digest(request.headers["x-jobq-signature"], signature(secret, request.body))
    payload = json.loads(request.body)
    assert payload["reminder_id"] == reminder_id
    assert payload["user_id"] == user_id
    assert payload["message"] == message
    assert datetime.fromisoformat(payload["remind_at"]) == remind_at
    assert payload["attempt"] == attempt


@dataclass
class Receiver:
    """Records every request and answers `status` with an empty body, closing the connection
    after each answer. Serve it with `asyncio.start_server(receiver.handle, "127.0.0.1", 0)`."""

    status: int = 200
    requests: list[Received] = field(default_factory=list)
    port: int = 0
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def wait_for(self, count: int) -> list[Received]:
        """Wait until `count` requests have arrived; return them."""
        while len(self.requests) < count:
            self._arrived.clear()
            await self._arrived.wait()
        return self.requests[:count]

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            request_line, *lines = head.decode("latin-1").split("\r\n")
            method, path, _ = request_line.split(" ", 2)
            headers: dict[str, str] = {}
            for line in lines:
                if line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            self.requests.append(Received(method, path, headers, body, datetime.now(UTC)))
            self._arrived.set()
            reason = HTTPStatus(self.status).phrase
            writer.write(
                f"HTTP/1.1 {self.status} {reason}\r\n"
                "Content-Length: 0\r\nConnection: close\r\n\r\n".encode()
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
