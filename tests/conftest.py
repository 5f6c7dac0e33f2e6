"""Test fixtures: a fresh database per session on a real PostgreSQL, a cheap reset per test.

The server is `TEST_DATABASE_URL` (any database on it; a new one is created beside it) when set,
else the embedded server in `.pgdata/`. Settings never read the developer's `.env`.

Under pytest-xdist (`make test`) each worker process is a session of its own: its own database,
its own PgBouncer. Every test whose fixtures reach the server is marked `db`; the others are
the unit tests (`make test-unit`, `-m 'not db'`), which never start the embedded server.

With `TEST_PGBOUNCER=1` the pools of the tests (`database`, `settings`, `make_settings`) go
through a PgBouncer in transaction mode that the session starts (`tests/pgbouncer.py`), and their
sessions (listeners, `conn`) straight to the server, as `JOBQ_DIRECT_DATABASE_URL` does.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from quart import Quart
from quart.typing import TestAppProtocol, TestClientProtocol

from jobq import db, embedded
from jobq.app import create_app
from jobq.config import PROJECT_ROOT, Settings
from jobq.db import Connection, Database
from jobq.queue import Registry, Worker, metrics
from tests import pgbouncer
from tests.keyed_client import use_keyed_client
from tests.toolkit.database import (
    close_reset_connections,
    empty_tables,
    fresh_database,
    reset_incidents,
    reset_tables,
)
from tests.toolkit.procs import WEBHOOK_SECRET, Procs
from tests.toolkit.receiver import WebhookReceiver

TABLES = [
    "job",
    "job_running",
    "job_dead",
    "job_done",
    "job_attempt",
    "job_unique",
    "job_schedule",
    "job_occurrence",
    "worker",
    "users",
    "reminders",
    "reminder_quotas",
    "reminder_holds",
    "exports",
    "api_keys",
    "job_queue",
    "job_rate",
    "job_counter",
    "job_histogram",
    "job_depth",
    "job_trace",
    "job_type_depth",
    "job_history",
    "job_leader",
    "webhook_hold",
    "webhook_start",
    "job_workflow",
    "job_flow",
    "job_dependency",
    "job_waiting",
    "job_sequence",
    "dashboard_session",
]


RESET = [
    empty_tables(TABLES),
    "INSERT INTO job_queue (name) VALUES ('default')",  # as migrated
]
"""The statements of the reset before each test (`tests.toolkit.database.reset_tables`)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `db` every test that reaches the test server through its fixtures."""
    for item in items:
        if "admin_dsn" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.db)


@pytest.fixture(scope="session")
def admin_dsn() -> str:
    """A DSN to an existing database on the test server."""
    url = os.environ.get("TEST_DATABASE_URL")
    if url:
        return url
    return embedded.start(PROJECT_ROOT / ".pgdata")


@pytest.fixture(scope="session")
async def database_url(admin_dsn: str) -> AsyncIterator[str]:
    """A fresh, migrated database for this test session (this xdist worker's), dropped at the
    end."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    async with fresh_database(admin_dsn, f"jobq_test_{worker}") as dsn:
        yield dsn
        await close_reset_connections()


DIRECT_OF: dict[str, str] = {}
"""The direct DSN of each DSN through a test PgBouncer (filled by `pgbouncer_url`)."""


@pytest.fixture(scope="session")
async def pgbouncer_url(admin_dsn: str, database_url: str) -> AsyncIterator[str]:
    """The session's test database through a PgBouncer in transaction mode, started here on a
    free port; skipped, with the reason, where the `pgbouncer` program is not installed."""
    program = pgbouncer.binary()
    if program is None:
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer; .ci/run does)")
    admin = await asyncpg.connect(admin_dsn)
    try:
        port = int(await admin.fetchval("SHOW port"))
    finally:
        await admin.close()
    bouncer = pgbouncer.PgBouncer(admin_dsn, port)
    await asyncio.to_thread(bouncer.start, program)
    url = bouncer.pooled(database_url)
    DIRECT_OF[url] = database_url
    yield url
    bouncer.stop()


@pytest.fixture(scope="session")
def pool_url(request: pytest.FixtureRequest, database_url: str) -> str:
    """The DSN of the tests' pools: the test database, or with `TEST_PGBOUNCER=1` the same
    through PgBouncer."""
    if os.environ.get("TEST_PGBOUNCER") == "1":
        url: str = request.getfixturevalue("pgbouncer_url")
        return url
    return database_url


def make_settings(database_url: str, **overrides: Any) -> Settings:
    """Settings for tests: the test database, no in-process worker, fast timers, pools that open
    one connection at their start (a test's app opens its own pool; it grows as the test needs).
    A DSN through the test PgBouncer gets its direct DSN as `direct_database_url`."""
    values: dict[str, Any] = {
        "database_url": database_url,
        "direct_database_url": DIRECT_OF.get(database_url),
        "run_workers": False,
        "min_pool_size": 1,
        "max_pool_size": 20,
        "poll_interval": timedelta(seconds=0.5),
        "heartbeat_interval": timedelta(seconds=0.2),
        "rescue_interval": timedelta(seconds=0.2),
        "lease": timedelta(seconds=5),
        "drain_timeout": timedelta(seconds=2),
        "backoff_base": timedelta(seconds=1),
        "webhook_secret": WEBHOOK_SECRET,
        "webhook_timeout": timedelta(seconds=2),
        "webhook_allow_private": True,  # the test receivers listen on 127.0.0.1
        "rate_limit_per_s": 0,  # tests of the rate limit set their own
        "signup_rate_per_hour": 0,  # ... and of the throttles of client addresses
        "auth_failures_per_min": 0,
    }
    values.update(overrides)
    return Settings(_env_file=None, **values)


@pytest.fixture
def settings(pool_url: str) -> Settings:
    return make_settings(pool_url)


@pytest.fixture(scope="session")
async def session_database(pool_url: str) -> AsyncIterator[Database]:
    database = await Database.open(make_settings(pool_url), pool_url)
    yield database
    await database.close()


@pytest.fixture
async def database(session_database: Database, request: pytest.FixtureRequest) -> Database:
    """The session's pool, bound in this test's context, over emptied tables (reset on a
    direct connection: `tests.toolkit.database.reset_tables`)."""
    await reset_tables(session_database.direct_dsn, RESET, test=request.node.nodeid)
    metrics.tally.take()  # the counts of earlier tests are not this one's
    db.bind(session_database)
    return session_database


@pytest.fixture
async def conn(database: Database) -> AsyncIterator[Connection]:
    """A connection of its own (autocommit, straight to the server) for checks and set-up."""
    c = await db.connect(database.direct_dsn)
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
async def receiver() -> AsyncIterator[WebhookReceiver]:
    """A started webhook receiver on 127.0.0.1 (see `tests.toolkit.receiver`)."""
    rec = WebhookReceiver()
    await rec.start()
    yield rec
    await rec.close()


@pytest.fixture
async def app(database: Database, settings: Settings) -> AsyncIterator[TestAppProtocol]:
    """The app of `settings` (`app_of`), started (pool, HTTP client, a serving's fresh state;
    no in-process worker unless asked) and stopped."""
    async with app_of(settings).test_app() as test_app:
        yield test_app
    db.bind(database)


_APPS: list[tuple[Settings, Quart]] = []
"""The apps this test process built, each with its settings (`app_of`)."""


def app_of(settings: Settings) -> Quart:
    """The app of `settings`, acting as the users it creates (`use_keyed_client`): built once per
    test process for settings of equal values (building one compiles the URL builder of every
    route, werkzeug's), and started afresh by each test: `create_app` keeps nothing of one
    serving for the next."""
    for made, quart_app in _APPS:
        if made == settings:
            return quart_app
    quart_app = create_app(settings)
    use_keyed_client(quart_app)
    _APPS.append((settings, quart_app))
    return quart_app


@pytest.fixture
def client(app: TestAppProtocol) -> TestClientProtocol:
    return app.test_client()


@pytest.fixture
def procs(database_url: str, tmp_path: Path) -> Iterator[Procs]:
    """Starts `python -m jobq` subprocesses on the session's database; kills the survivors at
    the end and prints their output."""
    manager = Procs(database_url, tmp_path)
    yield manager
    manager.close()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say which resets had to end a session left over by an earlier test (a leaked
    transaction holding the tables' locks), with what that session was doing."""
    if reset_incidents:
        terminalreporter.section("sessions left over by tests, ended by the reset")
        for line in reset_incidents:
            terminalreporter.write_line(line)
