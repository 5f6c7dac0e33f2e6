"""An HTTP/1.1 load generator on asyncio: keep-alive connections, closed or open loop.

Two ways to load a server:

- `closed_loop(...)`: `connections` connections, each sending its next request as soon as the
  answer to the previous one has arrived, for `duration_s`. It measures capacity (requests per
  second at a given concurrency); its latencies are those of a saturated server.
- `open_loop(...)`: requests leave on a fixed schedule, `rate_per_s`, whatever the server does,
  over up to `max_connections` connections (opened as needed). A request that finds every
  connection busy waits in a backlog; past `max_backlog` waiting requests, a request is dropped
  (never sent, counted in `dropped`). Latency is measured from the request's *scheduled* time,
  so a server that falls behind cannot hide its queue (no coordinated omission, as in wrk2).

Both return a `Result`: latencies (seconds), status counts, transport errors by kind, and the
rate achieved. Requests come from a factory, `make_request(i) -> Request` (`i` counts from 0),
and each answer can be handed to `on_response(request, status, body)`, e.g. to collect ids.

The client is a small HTTP/1.1 parser on `asyncio.Protocol` (`bench.http1`), no pipelining.
Against a trivial server on the 2-core machine, 32 connections: about 24,000 requests per
second, where httpx's `AsyncClient` managed 200 to 360. That matters when the load generator
shares two cores with the server it loads. Example::

    result = await closed_loop(
        "127.0.0.1", 8000, lambda i: Request.json("POST", "/users", {"name": f"u{i}"}),
        connections=32, duration_s=20,
    )
    print(result.req_per_s, result.percentile_ms(99), result.statuses)
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.http1 import Connection


@dataclass(frozen=True, slots=True)
class Request:
    """One HTTP request: method, path (with its query), body bytes and extra headers.
    `tag` is not sent: it is handed back to `on_response` with the answer."""

    method: str
    path: str
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    tag: Any = None

    @classmethod
    def json(
        cls, method: str, path: str, value: Any, *, tag: Any = None, key: str | None = None
    ) -> Request:
        """A request whose body is `value` as JSON (`Content-Type: application/json`), with
        `Authorization: Bearer <key>` when a user's API `key` is given."""
        body = json.dumps(value, separators=(",", ":")).encode()
        headers = [("Content-Type", "application/json")]
        if key is not None:
            headers.append(("Authorization", f"Bearer {key}"))
        return cls(method, path, body, tuple(headers), tag)

    def encode(self, host: str) -> bytes:
        """The request's bytes on the wire (HTTP/1.1, keep-alive)."""
        lines = [f"{self.method} {self.path} HTTP/1.1", f"Host: {host}"]
        lines += [f"{name}: {value}" for name, value in self.headers]
        if self.body or self.method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(self.body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + self.body


OnResponse = Callable[[Request, int, bytes], None]
"""Called with each request, its answer's status code and body (not for transport errors)."""


@dataclass
class Result:
    """What a load run measured.

    `latencies_s`: one per answered request (any status), in seconds: from the send (closed
    loop) or from the scheduled time (open loop). `statuses`: answers by status code.
    `errors`: requests that got no answer, by kind (`timeout`, `ConnectionResetError`, ...).
    `elapsed_s`: from the start to the last answer. `dropped`: open loop only, requests never
    sent because the backlog was full.
    """

    mode: str
    connections: int
    duration_s: float
    target_rate_per_s: float | None = None
    scheduled: int = 0
    sent: int = 0
    dropped: int = 0
    elapsed_s: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    connections_opened: int = 0

    @property
    def answered(self) -> int:
        """Requests that got an answer, whatever its status."""
        return len(self.latencies_s)

    @property
    def ok(self) -> int:
        """Answers with a 2xx status."""
        return sum(n for status, n in self.statuses.items() if 200 <= status < 300)

    @property
    def server_errors(self) -> int:
        """Answers with a 5xx status."""
        return sum(n for status, n in self.statuses.items() if status >= 500)

    @property
    def failures(self) -> int:
        """Requests that failed: non-2xx answers, transport errors and timeouts."""
        return self.answered - self.ok + sum(self.errors.values())

    @property
    def req_per_s(self) -> float:
        """Answers per second over `elapsed_s`."""
        return self.answered / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def ok_per_s(self) -> float:
        """2xx answers per second over `elapsed_s`."""
        return self.ok / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def percentile_ms(self, q: float) -> float:
        """The `q`-th percentile (0..100, nearest rank) of the latencies, in milliseconds;
        NaN when nothing was answered."""
        return percentile(self.latencies_s, q) * 1000

    def summary(self) -> dict[str, Any]:
        """The figures as a JSON-ready dict (rates per second, latencies in ms)."""
        return {
            "mode": self.mode,
            "connections": self.connections,
            "target_rate_per_s": self.target_rate_per_s,
            "duration_s": self.duration_s,
            "elapsed_s": round(self.elapsed_s, 3),
            "scheduled": self.scheduled,
            "sent": self.sent,
            "dropped": self.dropped,
            "answered": self.answered,
            "req_per_s": round(self.req_per_s, 1),
            "ok_per_s": round(self.ok_per_s, 1),
            "p50_ms": round(self.percentile_ms(50), 2),
            "p99_ms": round(self.percentile_ms(99), 2),
            "max_ms": round(self.percentile_ms(100), 2),
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "errors": dict(self.errors),
            "connections_opened": self.connections_opened,
        }


def percentile(values: list[float], q: float) -> float:
    """The `q`-th percentile (0..100) of `values` by nearest rank; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


async def _connect(host: str, port: int, result: Result) -> Connection:
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(Connection, host, port)
    result.connections_opened += 1
    return conn


async def _exchange(
    conn: Connection, data: bytes, timeout_s: float
) -> tuple[int, bytes, bool] | str:
    """Send one request on `conn`; return (status, body, keep_alive), or the error's kind."""
    try:
        async with asyncio.timeout(timeout_s):
            return await conn.send(data)
    except TimeoutError:
        conn.close()
        return "timeout"
    except (OSError, ValueError) as exc:
        conn.close()
        return type(exc).__name__
    finally:
        conn.done()


class _Run:
    """State shared by the connections of one run."""

    def __init__(
        self,
        host: str,
        port: int,
        make_request: Callable[[int], Request],
        on_response: OnResponse | None,
        timeout_s: float,
        result: Result,
    ) -> None:
        self.host = host
        self.port = port
        self.host_header = f"{host}:{port}"
        self.make_request = make_request
        self.on_response = on_response
        self.timeout_s = timeout_s
        self.result = result
        self.started = time.perf_counter()
        self.last_answer = self.started

    async def connect(self) -> Connection | None:
        """Open a connection; on failure count the error and return None."""
        try:
            async with asyncio.timeout(self.timeout_s):
                return await _connect(self.host, self.port, self.result)
        except (OSError, TimeoutError) as exc:
            kind = "connect_timeout" if isinstance(exc, TimeoutError) else type(exc).__name__
            self.result.errors[kind] += 1
            return None

    async def one(self, conn: Connection, request: Request, since: float) -> bool:
        """Send `request` on `conn` and record its answer, its latency measured from `since`
        (a `perf_counter` time). Return whether `conn` can carry another request."""
        self.result.sent += 1
        outcome = await _exchange(conn, request.encode(self.host_header), self.timeout_s)
        now = time.perf_counter()
        if isinstance(outcome, str):
            self.result.errors[outcome] += 1
            return False
        status, body, keep_alive = outcome
        self.last_answer = now
        self.result.latencies_s.append(now - since)
        self.result.statuses[status] += 1
        if self.on_response is not None:
            self.on_response(request, status, body)
        if not keep_alive:
            conn.close()
        return keep_alive and not conn.closed

    def finish(self) -> Result:
        self.result.elapsed_s = self.last_answer - self.started
        return self.result


async def closed_loop(
    host: str,
    port: int,
    make_request: Callable[[int], Request],
    *,
    connections: int,
    duration_s: float,
    timeout_s: float = 10.0,
    on_response: OnResponse | None = None,
) -> Result:
    """Load `host:port` from `connections` keep-alive connections, each sending its next
    request as soon as it has the answer to the previous one, for `duration_s` seconds; then
    wait for the requests in flight. A connection that fails is reopened (its error counted).
    `timeout_s` limits one request (and one connect). Returns the `Result`."""
    result = Result(mode="closed", connections=connections, duration_s=duration_s)
    run = _Run(host, port, make_request, on_response, timeout_s, result)
    deadline = run.started + duration_s
    counter = iter(range(2**62))

    async def user() -> None:
        conn: Connection | None = None
        while time.perf_counter() < deadline:
            if conn is None:
                conn = await run.connect()
                if conn is None:
                    await asyncio.sleep(0.05)
                    continue
            request = make_request(next(counter))
            result.scheduled += 1
            if not await run.one(conn, request, time.perf_counter()):
                conn = None
        if conn is not None:
            conn.close()

    await asyncio.gather(*(user() for _ in range(connections)))
    return run.finish()


async def open_loop(
    host: str,
    port: int,
    make_request: Callable[[int], Request],
    *,
    rate_per_s: float,
    duration_s: float,
    max_connections: int = 256,
    max_backlog: int | None = None,
    timeout_s: float = 10.0,
    on_response: OnResponse | None = None,
) -> Result:
    """Send `rate_per_s` requests per second to `host:port` for `duration_s` seconds, on a
    fixed schedule (request i at start + i / rate), whatever the server does.

    A request goes out on an idle connection, or on a new one while fewer than
    `max_connections` are open; otherwise it waits in a backlog, and past `max_backlog`
    waiting requests (default: one second's worth) it is dropped and counted in `dropped`.
    Requests still waiting when the schedule ends are sent. Latencies run from each request's
    scheduled time. Returns the `Result` (its `req_per_s` is the rate achieved)."""
    if rate_per_s <= 0 or duration_s <= 0:
        raise ValueError("rate_per_s and duration_s must be positive")
    limit = max_backlog if max_backlog is not None else max(1, int(rate_per_s))
    result = Result(
        mode="open",
        connections=max_connections,
        duration_s=duration_s,
        target_rate_per_s=rate_per_s,
    )
    run = _Run(host, port, make_request, on_response, timeout_s, result)
    backlog: asyncio.Queue[tuple[Request, float] | None] = asyncio.Queue()
    idle = 0  # connections waiting for a request
    tasks: list[asyncio.Task[None]] = []

    async def connection() -> None:
        nonlocal idle
        conn: Connection | None = None
        try:
            while True:
                idle += 1
                try:
                    item = await backlog.get()
                finally:
                    idle -= 1
                if item is None:
                    return
                request, since = item
                if conn is None or conn.closed:
                    conn = await run.connect()
                    if conn is None:
                        continue
                if not await run.one(conn, request, since):
                    conn = None
        finally:
            if conn is not None:
                conn.close()

    total = max(1, round(rate_per_s * duration_s))
    start = run.started
    for i in range(total):
        due = start + i / rate_per_s
        delay = due - time.perf_counter()
        if delay > 0.0005:
            await asyncio.sleep(delay)
        result.scheduled += 1
        if backlog.qsize() >= limit + idle:
            result.dropped += 1
            continue
        backlog.put_nowait((make_request(i), due))
        if backlog.qsize() > idle and len(tasks) < max_connections:
            tasks.append(asyncio.create_task(connection()))
    for _ in tasks:
        backlog.put_nowait(None)  # after the requests still waiting: those are sent first
    await asyncio.gather(*tasks)
    return run.finish()


async def fetch(
    host: str, port: int, request: Request, *, timeout_s: float = 10.0
) -> tuple[int, bytes]:
    """Send one request on a connection of its own and return (status, body): for set-up and
    checks, not for load. Raises `OSError`, `TimeoutError`, `ValueError` (a bad answer)."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(timeout_s):
        _, conn = await loop.create_connection(Connection, host, port)
        try:
            status, body, _ = await conn.send(request.encode(f"{host}:{port}"))
        finally:
            conn.close()
    return status, body
