"""A real webhook receiver, for the tests and for load: HTTP/1.1 keep-alive on 127.0.0.1, on
`asyncio.Protocol`.

It answers every request `status` (default 200, changeable at any time) with an empty body and
keeps the connection open (jobq's HTTP client reuses it). It records every request (`requests`:
method, path, headers, body, arrival), and each delivery of a reminder (`deliveries`): the
reminder id, the attempt number from the JSON body, the arrival time (wall clock), and whether
its Standard Webhooks signature (`webhook-signature` over `webhook-id`, `webhook-timestamp` and
the body) matches under `secret` (checked here by hand, independently of jobq's code and of the
`standardwebhooks` package).
Start it with `await receiver.start()`, stop it with `await receiver.close()`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import math
import re
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus

_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)", re.IGNORECASE)
_HEADER = re.compile(rb"\r\n(webhook-id|webhook-timestamp|webhook-signature):[ \t]*([^\r]*)", re.I)


@dataclass(frozen=True)
class Received:
    """One request the receiver got: header names are lower-case; `body` is the raw bytes;
    `received_at` is when it arrived."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    received_at: datetime


def signature(secret: str, msg_id: str, timestamp: str, body: bytes) -> str:
    """The `webhook-signature` a delivery of `body` with that id and timestamp must carry under
    Standard Webhooks `secret` (`whsec_<base64 key>`): `v1,` and the base64 HMAC-SHA256 of
    `<id>.<timestamp>.<body>`, computed here, independently of jobq's own signing code."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    digest = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signed(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """Whether `headers` (names lower-case) carry a valid Standard Webhooks signature of
    `body` under `secret` (one of the space-separated `webhook-signature` values)."""
    if not all(h in headers for h in ("webhook-id", "webhook-timestamp", "webhook-signature")):
        return False
    expected = signature(secret, headers["webhook-id"], headers["webhook-timestamp"], body)
    given = headers["webhook-signature"].split()
    return any(hmac.compare_digest(value, expected) for value in given)


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
    assert signed(secret, request.headers, request.body)
    assert request.headers["webhook-id"] == f"msg_reminder_{reminder_id}"
    payload = json.loads(request.body)
    assert payload["reminder_id"] == reminder_id
    assert payload["user_id"] == user_id
    assert payload["message"] == message
    assert payload["remind_at"].endswith("Z")  # the API's one time format
    assert datetime.fromisoformat(payload["remind_at"]) == remind_at
    assert payload["attempt"] == attempt


@dataclass(frozen=True, slots=True)
class Delivery:
    """One delivery of a reminder: its `attempt` (from the body), when it arrived (epoch
    seconds), whether its signature was right, and its `remind_at` (from the body, epoch
    seconds; NaN when the body has none)."""

    attempt: int
    received_s: float
    signed: bool
    remind_at_s: float = math.nan

    @property
    def lateness_s(self) -> float:
        """How late it arrived: `received_s - remind_at_s`, in seconds."""
        return self.received_s - self.remind_at_s


@dataclass
class WebhookReceiver:
    """Records every request, and the reminder deliveries by reminder id (`deliveries`).

    `malformed` counts the requests whose body is not a reminder's JSON; `bad_signatures` those
    whose signature is missing or wrong (only when `secret` is set).
    """

    secret: str | None = None
    status: int = 200
    malformed: int = 0
    bad_signatures: int = 0
    deliveries: dict[int, list[Delivery]] = field(default_factory=lambda: defaultdict(list))
    port: int = 0
    _server: asyncio.Server | None = None
    _transports: set[asyncio.Transport] = field(default_factory=set)
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)
    _raw: list[tuple[bytes, bytes, datetime]] = field(default_factory=list)
    _answers: dict[int, bytes] = field(default_factory=dict)

    @property
    def requests(self) -> list[Received]:
        """Every request so far, in order of arrival."""
        return [_parse(head, body, at) for head, body, at in self._raw]

    @property
    def url(self) -> str:
        """The URL to give users as their `webhook_url`."""
        return f"http://127.0.0.1:{self.port}/hook"

    @property
    def delivered(self) -> int:
        """How many distinct reminders were delivered at least once."""
        return len(self.deliveries)

    async def start(self) -> None:
        """Listen on an ephemeral port of 127.0.0.1 (then `port` and `url` name it)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _HookProtocol(self), "127.0.0.1", 0, backlog=1024
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for transport in list(self._transports):
                transport.close()
            await self._server.wait_closed()

    async def wait_for(self, count: int) -> list[Received]:
        """Wait until `count` requests have arrived; return them."""
        while len(self._raw) < count:
            self._arrived.clear()
            await self._arrived.wait()
        return self.requests[:count]

    async def wait_delivered(self, count: int, *, timeout_s: float) -> bool:
        """Wait until `count` distinct reminders were delivered; False after `timeout_s`."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while self.delivered < count:
                    self._arrived.clear()
                    await self._arrived.wait()
        return self.delivered >= count

    def _answer(self) -> bytes:
        """The answer to a request: `status`, an empty body."""
        answer = self._answers.get(self.status)
        if answer is None:
            reason = HTTPStatus(self.status).phrase
            answer = f"HTTP/1.1 {self.status} {reason}\r\nContent-Length: 0\r\n\r\n".encode()
            self._answers[self.status] = answer
        return answer

    def _record(self, head: bytes, body: bytes) -> None:
        self._raw.append((head, body, datetime.now(UTC)))
        self._arrived.set()
        ok = True
        if self.secret is not None:
            headers = {
                m.group(1).decode().lower(): m.group(2).strip().decode("latin-1")
                for m in _HEADER.finditer(head)
            }
            ok = signed(self.secret, headers, body)
            if not ok:
                self.bad_signatures += 1
        try:
            payload = json.loads(body)
            reminder_id = int(payload["reminder_id"])
            attempt = int(payload["attempt"])
            due = payload.get("remind_at")
            remind_at_s = math.nan if due is None else datetime.fromisoformat(due).timestamp()
        except (ValueError, KeyError, TypeError):
            self.malformed += 1
            return
        self.deliveries[reminder_id].append(Delivery(attempt, time.time(), ok, remind_at_s))


class _HookProtocol(asyncio.Protocol):
    def __init__(self, receiver: WebhookReceiver) -> None:
        self.receiver = receiver
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.receiver._transports.add(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.receiver._transports.discard(self.transport)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buffer[:end])
            length = _CONTENT_LENGTH.search(head)
            stop = end + 4 + (int(length.group(1)) if length else 0)
            if len(self.buffer) < stop:
                return
            body = bytes(self.buffer[end + 4 : stop])
            del self.buffer[:stop]
            self.receiver._record(head, body)
            assert self.transport is not None
            self.transport.write(self.receiver._answer())


def _parse(head: bytes, body: bytes, received_at: datetime) -> Received:
    request_line, *lines = head.decode("latin-1").split("\r\n")
    method, path, _ = request_line.split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return Received(method, path, headers, body, received_at)
