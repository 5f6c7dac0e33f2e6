"""A minimal HTTP/1.1 client connection on `asyncio.Protocol`, for `bench.loadgen`.

One request in flight at a time (no pipelining); answers delimited by Content-Length, by
chunked transfer coding, or by the connection's end; interim (1xx) answers skipped; `Connection:
close` honoured. It parses only what a load generator needs (status, body, keep-alive), which
is what makes it cheap.
"""

from __future__ import annotations

import asyncio
import re

_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)", re.IGNORECASE)
_CHUNKED = re.compile(rb"\r\ntransfer-encoding:[^\r]*chunked", re.IGNORECASE)
_CLOSE = re.compile(rb"\r\nconnection:[ \t]*close", re.IGNORECASE)


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection with at most one request in flight."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._buffer = bytearray()
        self._waiter: asyncio.Future[tuple[int, bytes, bool]] | None = None
        self._head_end = -1

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self._waiter is not None and not self._waiter.done():
            try:
                self._parse()
            except Exception as exc:  # a malformed answer fails its request
                self._fail(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is not None and not self._waiter.done():
            if exc is None and self._head_end >= 0 and self._read_to_close():
                return
            self._fail(exc or ConnectionResetError("connection closed by the server"))

    # -- requests ---------------------------------------------------------------------------

    def send(self, data: bytes) -> asyncio.Future[tuple[int, bytes, bool]]:
        """Send a request's bytes; the future gives (status, body, keep_alive)."""
        assert self.transport is not None
        assert self._waiter is None
        self._waiter = asyncio.get_running_loop().create_future()
        self._head_end = -1
        self.transport.write(data)
        return self._waiter

    def done(self) -> None:
        """Forget the finished request (before the next `send`)."""
        self._waiter = None

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _fail(self, exc: BaseException) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)
        self.close()

    def _finish(self, status: int, body: bytes, keep_alive: bool, consumed: int) -> None:
        del self._buffer[:consumed]
        assert self._waiter is not None
        self._waiter.set_result((status, body, keep_alive))

    def _read_to_close(self) -> bool:
        """An answer delimited by the connection's end (no length, not chunked)."""
        head = bytes(self._buffer[: self._head_end])
        if _CONTENT_LENGTH.search(head) or _CHUNKED.search(head):
            return False
        body = bytes(self._buffer[self._head_end + 4 :])
        self._finish(int(head[9:12]), body, False, len(self._buffer))
        return True

    def _parse(self) -> None:
        buffer = self._buffer
        if self._head_end < 0:
            self._head_end = buffer.find(b"\r\n\r\n")
            if self._head_end < 0:
                return
        end = self._head_end
        head = bytes(buffer[:end])
        if not head.startswith(b"HTTP/1."):
            raise ValueError(f"not an HTTP/1.x answer: {head[:40]!r}")
        status = int(head[9:12])
        keep_alive = not _CLOSE.search(head) and head.startswith(b"HTTP/1.1")
        start = end + 4
        if status < 200 or status in (204, 304):
            if status < 200:  # an interim answer (100 Continue): wait for the final one
                del buffer[:start]
                self._head_end = -1
                self._parse()
                return
            self._finish(status, b"", keep_alive, start)
            return
        length = _CONTENT_LENGTH.search(head)
        if length is not None:
            stop = start + int(length.group(1))
            if len(buffer) >= stop:
                self._finish(status, bytes(buffer[start:stop]), keep_alive, stop)
            return
        if _CHUNKED.search(head):
            parsed = _dechunk(buffer, start)
            if parsed is not None:
                body, stop = parsed
                self._finish(status, body, keep_alive, stop)
            return
        # no length and not chunked: the body ends with the connection (connection_lost)


def _dechunk(buffer: bytearray, start: int) -> tuple[bytes, int] | None:
    """Decode a complete chunked body from `start`; None while incomplete."""
    body = bytearray()
    pos = start
    while True:
        line_end = buffer.find(b"\r\n", pos)
        if line_end < 0:
            return None
        size = int(bytes(buffer[pos:line_end]).split(b";")[0], 16)
        pos = line_end + 2
        if size == 0:
            trailer_end = buffer.find(b"\r\n\r\n", pos - 2)
            if trailer_end < 0:
                return None
            return bytes(body), trailer_end + 4
        if len(buffer) < pos + size + 2:
            return None
        body += buffer[pos : pos + size]
        pos += size + 2
