"""Test fixtures: a fresh database per session on a real PostgreSQL, a cheap reset per test.

The server is `TEST_DATABASE_URL` (any database on it; a new one is created beside it) when set,
else the embedded server in `.pgdata/`. Settings never read the developer's `.env`.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from quart import Quart
from quart.typing import TestAppProtocol, TestClientProtocol

from jobq import db, embedded
from jobq.app import create_app
from jobq.config import PROJECT_ROOT, Settings
from jobq.db import Connection, Database
from jobq.migrate import migrate
from jobq.queue import Registry, Worker
from tests.webhook_receiver import Receiver

TABLES = "job, job_running, job_dead, worker, users, reminders, exports"


@pytest.fixture(scope="session")
def admin_dsn() -> str:
    """A DSN to an existing database on the test server."""
    url = os.environ.get("TEST_DATABASE_URL")
    if url:
        return url
    return embedded.start(PROJECT_ROOT / ".pgdata")


@pytest.fixture(scope="session")
async def database_url(admin_dsn: str) -> AsyncIterator[str]:
    """A fresh, migrated database for this test session, dropped at the end."""
    name = f"jobq_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    dsn = embedded.with_database(admin_dsn, name)
    conn = await db.connect(dsn)
    try:
        await migrate(conn)
    finally:
        await conn.close()
    yield dsn
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


def make_settings(database_url: str, **overrides: Any) -> Settings:
    """Settings for tests: the test database, no in-process worker, fast timers."""
    values: dict[str, Any] = {
        "database_url": database_url,
        "run_workers": False,
        "max_pool_size": 20,
        "poll_interval": timedelta(seconds=0.5),
        "heartbeat_interval": timedelta(seconds=0.2),
        "rescue_interval": timedelta(seconds=0.2),
        "lease": timedelta(seconds=5),
        "drain_timeout": timedelta(seconds=2),
        "backoff_base": timedelta(seconds=1),
        "webhook_secret": "test-secret",
        "webhook_timeout": timedelta(seconds=2),
    }
    values.update(overrides)
    return Settings(_env_file=None, **values)


@pytest.fixture
def settings(database_url: str) -> Settings:
    return make_settings(database_url)


@pytest.fixture(scope="session")
async def session_database(database_url: str) -> AsyncIterator[Database]:
    database = await Database.open(make_settings(database_url), database_url)
    yield database
    await database.close()


@pytest.fixture
async def database(session_database: Database) -> Database:
    """The session's pool, bound in this test's context, over emptied tables."""
    async with session_database.pool.acquire() as conn:
        await conn.execute(f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE")
    db.bind(session_database)
    return session_database


@pytest.fixture
async def conn(database: Database) -> AsyncIterator[Connection]:
    """A connection of its own (autocommit) for checks and set-up."""
    c = await db.connect(database.dsn)
    yield c
    await c.close()


@pytest.fixture
async def make_worker(
    database: Database, settings: Settings
) -> AsyncIterator[Callable[..., Awaitable[Worker]]]:
    """Start workers (each with its own listener and liveness lock); aborted at teardown."""
    started: list[Worker] = []

    async def make(
        handlers: Registry, *, state: dict[str, Any] | None = None, **overrides: Any
    ) -> Worker:
        worker_settings = make_settings(database.dsn, **overrides) if overrides else settings
        worker = Worker(
            database,
            worker_settings,
            handlers=handlers,
            state=state if state is not None else {"settings": worker_settings},
        )
        await worker.start()
        started.append(worker)
        return worker

    yield make
    for worker in started:
        await worker.abort()


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    """A started webhook receiver on 127.0.0.1 (see `tests.webhook_receiver`)."""
    rec = Receiver()
    server = await asyncio.start_server(rec.handle, "127.0.0.1", 0)
    rec.port = server.sockets[0].getsockname()[1]
    yield rec
    server.close()
    await server.wait_closed()


@pytest.fixture
async def app(database: Database, settings: Settings) -> AsyncIterator[TestAppProtocol]:
    """The app, started (pool, HTTP client; no in-process worker unless asked) and stopped."""
    quart_app: Quart = create_app(settings)
    async with quart_app.test_app() as test_app:
        yield test_app
    db.bind(database)


@pytest.fixture
def client(app: TestAppProtocol) -> TestClientProtocol:
    return app.test_client()
