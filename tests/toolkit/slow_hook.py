"""Slow webhook servers, for the tests and scenarios of fair delivery: a real HTTP server on a
loopback address of its own (127.0.0.2, 127.0.0.3, ...: Linux answers on all of 127.0.0.0/8)
that reads each request, then answers at a trickle or not at all."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class SlowHook:
    """A webhook server on `address` that reads each request, then trickles its answer (the
    status line, then one header byte every `every_s`, never ending it) or, with
    `trickle=False`, answers nothing. It counts the requests in flight (until the client
    drops the connection), their peak, their peak before the first ended (`first_peak`: a
    closing connection may still count for a moment while the next request comes in), and
    those that ended."""

    def __init__(self, address: str, *, trickle: bool = True, every_s: float = 0.3) -> None:
        self.address = address
        self.trickle = trickle
        self.every_s = every_s
        self.in_flight = 0
        self.peak = 0
        self.first_peak = 0
        self.ended = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.address, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in self._writers:
                writer.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            await reader.readexactly(length)
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            if self.ended == 0:
                self.first_peak = self.peak
            try:
                if self.trickle:
                    writer.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                while not reader.at_eof():
                    if self.trickle:
                        writer.write(b"a")
                        await writer.drain()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(reader.read(1), self.every_s)
            finally:
                self.in_flight -= 1
                self.ended += 1
        writer.close()


@contextlib.asynccontextmanager
async def slow_hooks(*hooks: SlowHook) -> AsyncIterator[None]:
    """Start `hooks` for the block; close them (and their connections) at its end."""
    for hook in hooks:
        await hook.start()
    try:
        yield
    finally:
        for hook in hooks:
            await hook.close()
