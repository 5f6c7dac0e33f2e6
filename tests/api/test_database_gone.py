"""A database that goes away under a request answers 503 `database_unavailable`, never 500: here,
the server ends the session of an idle pooled connection (`pg_terminate_backend`, which is what
a fast shutdown does to every backend) just before a request takes that connection."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta

import asyncpg
import pytest
from quart import Quart

from jobq import db
from jobq.app import create_app, database_down
from jobq.db import Connection, Database
from tests.api.conftest import DatabaseProxy
from tests.api.helpers import assert_error, create_user
from tests.conftest import make_settings


class LateCloseProxy(DatabaseProxy):
    """A `DatabaseProxy` that passes on at once what the server sends but, once `hold_next_close`
    is set, holds back the close of the next connection that the server ends until its client
    sends again (or closes). A client reads a backend's last message (its FATAL error) and, a
    turn or two of its event loop later, the close of the socket; the proxy stretches that
    moment for as long as the test needs."""

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.hold_next_close = False
        self.server_closed = asyncio.Event()
        """Set once the server has closed a connection whose end the proxy holds back."""

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.unix_path is not None:
            up_reader, up_writer = await asyncio.open_unix_connection(self.unix_path)
        else:
            up_reader, up_writer = await asyncio.open_connection(
                self.upstream_host, self.upstream_port
            )
        gone = asyncio.Event()
        to_server = asyncio.create_task(self._forward(reader, up_writer, until=gone))
        to_client = asyncio.create_task(self._forward(up_reader, writer))
        pipes = (to_server, to_client)
        self._writers.update((writer, up_writer))
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
    async def _forward(
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
async def late_close_proxy(database_url: str) -> AsyncIterator[LateCloseProxy]:
    proxy = LateCloseProxy(database_url)
    await proxy.start()
    yield proxy
    await proxy.stop()


@pytest.fixture
async def one_connection_app(
    late_close_proxy: LateCloseProxy, database: Database
) -> AsyncIterator[Quart]:
    """The app, started, with a pool of one connection through `late_close_proxy` (and no
    periodic metrics flush to take that connection)."""
    settings = make_settings(
        late_close_proxy.dsn,
        min_pool_size=1,
        max_pool_size=1,
        metrics_flush_interval=timedelta(hours=1),
    )
    app = create_app(settings)
    async with app.test_app():
        yield app
    db.bind(database)


async def test_a_session_ended_by_the_server_under_an_idle_pooled_connection_is_503(
    one_connection_app: Quart, late_close_proxy: LateCloseProxy, conn: Connection
) -> None:
    app = one_connection_app
    client = app.test_client()
    await create_user(client, email="ann@example.com")
    pool = app.extensions["jobq.db"].pool
    backend: int = await pool.fetchval("SELECT pg_backend_pid()")  # the pool's one connection

    late_close_proxy.hold_next_close = True
    assert await conn.fetchval("SELECT pg_terminate_backend($1)", backend)
    await late_close_proxy.server_closed.wait()  # its FATAL error is read; its close held back
    response = await client.post("/users", json={"name": "Bob", "email": "bob@example.com"})
    assert response.status_code == 503
    assert_error(await response.get_json(), "database_unavailable")

    await create_user(client, email="bob@example.com")  # a new connection: served again
    assert await conn.fetchval("SELECT count(*) FROM users") == 2


@pytest.mark.parametrize(
    ("exc", "down"),
    [
        (asyncpg.InternalClientError("cannot switch to state 15; another operation (2)"), True),
        (asyncpg.ConnectionDoesNotExistError("connection was closed"), True),
        (asyncpg.OutdatedSchemaCacheError("cache lookup failed for type"), False),
        (asyncpg.ProtocolError("unexpected trailing bytes"), False),
        (asyncpg.UndefinedColumnError("column does not exist"), False),
        (TypeError("a bug"), False),
    ],
)
def test_database_down_is_a_lost_connection_not_a_bug(exc: Exception, down: bool) -> None:
    assert database_down(exc) is down
