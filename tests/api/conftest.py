"""Fixtures of the HTTP API tests: a real webhook receiver, a worker with the app's handlers,
a TCP proxy in front of PostgreSQL (to cut the database off for real), and small helpers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import httpx
import pytest
from freezegun import freeze_time

from jobq import db
from jobq.app import create_app
from jobq.config import Settings
from jobq.db import Database
from jobq.domain import webhooks
from jobq.domain.webhooks import webhook_client
from jobq.queue import Worker, registry
from tests.toolkit.served import served

# -- the admin endpoints ---------------------------------------------------------------------------

ADMIN_TOKEN = "test-admin-token-5f0c2b9e"  # noqa: S105 (a test value)
"""The `admin_token` of tests that call the admin endpoints (they override `settings`)."""
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
"""The headers of an authorised admin request."""

# -- running the app's jobs ------------------------------------------------------------------------

RunJobs = Callable[..., Awaitable[int]]


@pytest.fixture
async def run_jobs(
    settings: Settings, make_worker: Callable[..., Awaitable[Worker]]
) -> AsyncIterator[RunJobs]:
    """`await run_jobs(at=None)`: one worker with the app's handlers and state claims the jobs
    ripe at `at` (the clock frozen there; default: now), runs them to their recorded outcome,
    and returns how many it claimed."""
    async with webhook_client(settings) as http:
        worker = await make_worker(registry, state={"settings": settings, "http": http})

        async def run(at: datetime | None = None) -> int:
            if at is None:
                claimed = await worker.run_once()
                await worker.wait_idle()
                return claimed
            with freeze_time(at, real_asyncio=True):
                claimed = await worker.run_once()
                await worker.wait_idle()
            return claimed

        yield run


# -- the test resolver ---------------------------------------------------------------------------

Answers = dict[str, list[str]]


@pytest.fixture
def dns(monkeypatch: pytest.MonkeyPatch) -> Answers:
    """The test resolver: names in the returned dict resolve to their addresses (change them
    between calls to rebind); any other host goes to the system resolver. It replaces
    `jobq.domain.webhooks.resolve`, the one function that the SSRF guard and the webhook
    client's network backend ask."""
    answers: Answers = {}
    system = webhooks.resolve

    async def resolve(host: str, port: int) -> list[str]:
        if host in answers:
            return list(answers[host])
        return await system(host, port)

    monkeypatch.setattr(webhooks, "resolve", resolve)
    return answers


# -- a TCP proxy in front of PostgreSQL, to cut the database off --------------------------------


class DatabaseProxy:
    """Forwards TCP connections on 127.0.0.1 to the PostgreSQL server of `dsn` (TCP or Unix
    socket). `stop()` closes the listener and every forwarded connection (the database becomes
    unreachable: connections are refused); `start()` listens again on the same port.

    With `hold_next_close` set, the next connection that the server ends keeps its client side
    open until the client sends again (or closes), and `server_closed` is set: a client reads a
    backend's last message (its FATAL error) and, a turn or two of its event loop later, the
    close of the socket; the proxy stretches that moment for as long as a test needs."""

    def __init__(self, dsn: str) -> None:
        self.target = dsn
        parts = urlsplit(dsn)
        query = parse_qs(parts.query)
        socket_dir = query.get("host", [parts.hostname or ""])[0]
        self.upstream_port = parts.port or 5432
        self.unix_path = (
            f"{socket_dir}/.s.PGSQL.{self.upstream_port}" if socket_dir.startswith("/") else None
        )
        self.upstream_host = parts.hostname or "127.0.0.1"
        self.port = 0
        self._server: asyncio.Server | None = None
        self.hold_next_close = False
        self.server_closed = asyncio.Event()
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def dsn(self) -> str:
        """The DSN that reaches the target database through this proxy."""
        parts = urlsplit(self.target)
        query = {k: v for k, v in parse_qs(parts.query).items() if k != "host"}
        user = parts.username or "postgres"
        auth = f"{user}:{parts.password}@" if parts.password else f"{user}@"
        return urlunsplit(
            parts._replace(netloc=f"{auth}127.0.0.1:{self.port}", query=urlencode(query, True))
        )

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.unix_path is not None:
            up_reader, up_writer = await asyncio.open_unix_connection(self.unix_path)
        else:
            up_reader, up_writer = await asyncio.open_connection(
                self.upstream_host, self.upstream_port
            )
        self._writers.update((writer, up_writer))
        gone = asyncio.Event()
        to_server = asyncio.create_task(self._pipe(reader, up_writer, until=gone))
        to_client = asyncio.create_task(self._pipe(up_reader, writer))
        pipes = (to_server, to_client)
        self._tasks.update(pipes)
        try:
            done, _ = await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
            if to_client in done and self.hold_next_close:  # the server ended it: hold on
                self.hold_next_close = False
                gone.set()
                self.server_closed.set()
                await to_server
        finally:
            for task in pipes:
                task.cancel()
                self._tasks.discard(task)
            for w in (writer, up_writer):
                w.close()
                self._writers.discard(w)

    @staticmethod
    async def _pipe(
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        until: asyncio.Event | None = None,
    ) -> None:
        """Copy `source` to `sink` until `source` ends, or until it sends once `until` is set."""
        with contextlib.suppress(ConnectionError, OSError):
            while (data := await source.read(65536)) and not (until and until.is_set()):
                sink.write(data)
                await sink.drain()


@pytest.fixture
async def db_proxy(database_url: str) -> AsyncIterator[DatabaseProxy]:
    """A started `DatabaseProxy` to the test database."""
    proxy = DatabaseProxy(database_url)
    await proxy.start()
    yield proxy
    await proxy.stop()


# -- the app served by hypercorn -------------------------------------------------------------------


@pytest.fixture
async def served_http(settings: Settings, database: Database) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client of the app (the test's `settings`) served by hypercorn on an ephemeral
    port of 127.0.0.1: for what only a real client sends (Content-Length, chunked bodies)."""
    try:
        async with (
            served(create_app(settings)) as url,
            httpx.AsyncClient(base_url=url, timeout=10) as client,
        ):
            yield client
    finally:
        db.bind(database)
