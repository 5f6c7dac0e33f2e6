"""Fixtures of the queue tests: extra pools, and workers on them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from jobq.config import Settings
from jobq.db import Connection, Database
from jobq.queue import Registry, Worker
from tests import claim_log
from tests.conftest import make_settings

OpenDatabase = Callable[..., Awaitable[Database]]
NewWorker = Callable[..., Worker]


@pytest.fixture
async def open_database(database: Database) -> AsyncIterator[OpenDatabase]:
    """Open extra pools on the test database (`**overrides` of the settings); closed at the end."""
    opened: list[Database] = []

    async def open_(**overrides: Any) -> Database:
        extra = await Database.open(make_settings(database.dsn, **overrides), database.dsn)
        opened.append(extra)
        return extra

    yield open_
    for extra in opened:
        await extra.close()


@pytest.fixture
async def new_worker(database: Database, settings: Settings) -> AsyncIterator[NewWorker]:
    """Build workers that are not started yet (for `run(stop)`, which starts them), on any pool;
    aborted at the end."""
    built: list[Worker] = []

    def new(handlers: Registry, *, on: Database | None = None, **overrides: Any) -> Worker:
        worker_settings = make_settings(database.dsn, **overrides) if overrides else settings
        worker = Worker(on or database, worker_settings, handlers=handlers)
        built.append(worker)
        return worker

    yield new
    for worker in built:
        await worker.abort()


@pytest.fixture
async def claims(conn: Connection) -> AsyncIterator[Connection]:
    """`conn`, with every claim journaled in `test_claim` (see `tests.claim_log`)."""
    await claim_log.install(conn)
    yield conn
    await claim_log.uninstall(conn)
