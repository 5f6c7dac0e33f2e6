"""A database that goes away under a request answers 503 `database_unavailable`, never 500: here,
the server ends the session of an idle pooled connection (`pg_terminate_backend`, which is what
a fast shutdown does to every backend) just before a request takes that connection."""

from __future__ import annotations

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


@pytest.fixture
async def one_connection_app(db_proxy: DatabaseProxy, database: Database) -> AsyncIterator[Quart]:
    """The app, started, with a pool of one connection through `db_proxy` (and no
    periodic metrics flush to take that connection)."""
    settings = make_settings(
        db_proxy.dsn,
        min_pool_size=1,
        max_pool_size=1,
        metrics_flush_interval=timedelta(hours=1),
    )
    app = create_app(settings)
    async with app.test_app():
        yield app
    db.bind(database)


async def test_a_session_ended_by_the_server_under_an_idle_pooled_connection_is_503(
    one_connection_app: Quart, db_proxy: DatabaseProxy, conn: Connection
) -> None:
    app = one_connection_app
    client = app.test_client()
    await create_user(client, email="ann@example.com")
    pool = app.extensions["jobq.db"].pool
    backend: int = await pool.fetchval("SELECT pg_backend_pid()")  # the pool's one connection

    db_proxy.hold_next_close = True
    assert await conn.fetchval("SELECT pg_terminate_backend($1)", backend)
    await db_proxy.server_closed.wait()  # its FATAL error is read; its close held back
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
