"""Fixtures of the chaos suite: its own PostgreSQL instance and the journal.

Every test under `tests/chaos/` runs on a PostgreSQL server that this suite starts for itself
(`tests.toolkit.postgres.PostgresInstance`, on a free TCP port of 127.0.0.1), never on the
machine's server or the project's `.pgdata`: the scenarios restart and crash it. The session's
fresh database is created on it by the root conftest (`admin_dsn` is overridden here).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest

from jobq import db
from jobq.db import Connection, Database
from tests.chaos import journal
from tests.toolkit.postgres import PostgresInstance


@pytest.fixture(scope="session")
def chaos_server() -> Iterator[PostgresInstance]:
    """The suite's own PostgreSQL server, started; stopped and removed at the end."""
    server = PostgresInstance.create()
    try:
        server.start()
        yield server
    finally:
        server.destroy()


@pytest.fixture(scope="session")
def admin_dsn(chaos_server: PostgresInstance) -> str:
    """The root conftest creates the session's database on the suite's own server."""
    return chaos_server.admin_dsn


@pytest.fixture
async def postgres(chaos_server: PostgresInstance) -> AsyncIterator[PostgresInstance]:
    """The suite's server, running again at the end of the test whatever the test did to it."""
    yield chaos_server
    if not chaos_server.running:
        await asyncio.to_thread(chaos_server.start)


@pytest.fixture
async def chaos_conn(database: Database) -> AsyncIterator[Connection]:
    """A connection of the test's own (autocommit), with the journal and execution tables
    installed on emptied queue tables; they are dropped at the end, so that other tests of
    the session do not pay for the journal's triggers."""
    conn = await db.connect(database.dsn)
    await journal.install(conn)
    yield conn
    if conn.is_closed():  # the scenario restarted the server
        conn = await db.connect(database.dsn)
    await journal.uninstall(conn)
    await conn.close()


@pytest.fixture
async def opened() -> AsyncIterator[list[Connection]]:
    """Connections a test opens along the way (e.g. after a restart); closed at the end."""
    connections: list[Connection] = []
    yield connections
    for conn in connections:
        if not conn.is_closed():
            await conn.close()
