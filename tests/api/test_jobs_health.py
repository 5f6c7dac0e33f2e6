"""GET /jobs/stats, GET /health (also with the database really cut off), the OpenAPI document."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

import pytest
from freezegun import freeze_time
from pydantic import BaseModel
from quart.typing import TestClientProtocol as Client

from jobq import clock, db
from jobq.app import create_app
from jobq.config import Settings
from jobq.db import Connection, Database
from jobq.errors import DontRetry
from jobq.queue import Job, JobContext, Registry, Worker, enqueue, metrics
from jobq.queue.leader.depth import take_depth_snapshot
from tests.api.conftest import ADMIN, ADMIN_TOKEN, DatabaseProxy
from tests.api.helpers import assert_error, create_reminder, create_user
from tests.conftest import make_settings
from tests.keyed_client import use_keyed_client
from tests.toolkit.procs import eventually

T = TypeVar("T")


class NoArgs(BaseModel):
    pass


@pytest.fixture
def settings(pool_url: str) -> Settings:
    """The test settings, with an admin token (`/jobs/stats` needs it)."""
    return make_settings(pool_url, admin_token=ADMIN_TOKEN)


async def test_job_stats_need_the_admin_token(client: Client) -> None:
    for headers in ({}, {"Authorization": "Bearer not-the-admin-token"}):
        response = await client.get("/jobs/stats", headers=headers)
        assert response.status_code == 401
        assert_error(await response.get_json(), "unauthorized")
    assert (await client.get("/jobs/stats", headers=ADMIN)).status_code == 200


async def test_job_stats_counts_per_job_type(
    client: Client, conn: Connection, make_worker: Callable[..., Awaitable[Worker]]
) -> None:
    release = asyncio.Event()
    handlers = Registry()

    @handlers.handler("beta.block", args=NoArgs)
    async def block(args: NoArgs, job: JobContext) -> None:
        await release.wait()

    @handlers.handler("beta.bad", args=NoArgs)
    async def bad(args: NoArgs, job: JobContext) -> None:
        raise DontRetry("bad input")

    worker = await make_worker(handlers)
    # beta: one dead, one running
    await enqueue(Job(job_type="beta.bad"))
    assert await worker.run_once() == 1
    await worker.wait_idle()
    await enqueue(Job(job_type="beta.block"))
    assert await worker.run_once() == 1
    # alpha: two ripe, one scheduled; send_reminder: two scheduled; render_export: one ripe
    await enqueue(Job(job_type="alpha", arguments={"n": 1}))
    await enqueue(Job(job_type="alpha", arguments={"n": 2}))
    await enqueue(Job(job_type="alpha", arguments={"n": 3}).runs_in(hours=1))
    user = await create_user(client)
    await create_reminder(client, user["id"], message="one", remind_in_seconds=600)
    await create_reminder(client, user["id"], message="two", remind_in_seconds=900)
    assert (await client.post(f"/users/{user['id']}/exports")).status_code == 202
    assert await conn.fetchval("SELECT count(*) FROM job_running") == 1
    assert await conn.fetchval("SELECT count(*) FROM job_dead") == 1

    try:
        response = await client.get("/jobs/stats", headers=ADMIN)
    finally:
        release.set()
        await worker.wait_idle()
    assert response.status_code == 200
    body = await response.get_json()
    row = {"ripe": 0, "scheduled": 0, "running": 0, "dead": 0}
    assert body["job_types"] == [
        {**row, "job_type": "alpha", "ripe": 2, "scheduled": 1},
        {**row, "job_type": "beta.bad", "dead": 1},
        {**row, "job_type": "beta.block", "running": 1},
        {**row, "job_type": "render_export", "ripe": 1},
        {**row, "job_type": "send_reminder", "scheduled": 2},
    ]
    assert body["totals"] == {"job_type": "*", "ripe": 3, "scheduled": 3, "running": 1, "dead": 1}

    # the blocked job finished: it is no longer counted
    after = await (await client.get("/jobs/stats", headers=ADMIN)).get_json()
    assert "beta.block" not in [r["job_type"] for r in after["job_types"]]
    assert after["totals"]["running"] == 0


async def test_past_the_live_count_job_stats_reads_the_depth_snapshot(
    client: Client, database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counting ten million queued jobs takes seconds: past `LIVE_COUNT_MAX` of them, the
    queued counts are the last depth snapshot's, and the answer says when it was taken;
    running and dead jobs are counted now. With no snapshot yet, everything is counted now."""
    monkeypatch.setattr(metrics, "LIVE_COUNT_MAX", 2)
    for n in range(3):
        await enqueue(Job(job_type="alpha", arguments={"n": n}))
    body = await (await client.get("/jobs/stats", headers=ADMIN)).get_json()
    assert (body["totals"]["ripe"], body["queued_counted_at"]) == (3, None)  # no snapshot yet
    at = clock.now()
    await take_depth_snapshot(database, now=at, interval=timedelta(0), retention=timedelta(days=7))
    await enqueue(Job(job_type="alpha", arguments={"n": 9}).runs_in(hours=1))
    await enqueue(Job(job_type="beta", arguments={"n": 1}))
    body = await (await client.get("/jobs/stats", headers=ADMIN)).get_json()
    row = {"ripe": 0, "scheduled": 0, "running": 0, "dead": 0}
    assert body["job_types"] == [{**row, "job_type": "alpha", "ripe": 3}]  # as counted at `at`
    assert body["queued_counted_at"] == at.isoformat().replace("+00:00", "Z")
    monkeypatch.setattr(metrics, "LIVE_COUNT_MAX", 100)
    body = await (await client.get("/jobs/stats", headers=ADMIN)).get_json()
    assert body["queued_counted_at"] is None
    assert body["totals"] == {"job_type": "*", "ripe": 4, "scheduled": 1, "running": 0, "dead": 0}


async def test_job_stats_of_an_empty_queue(client: Client) -> None:
    response = await client.get("/jobs/stats", headers=ADMIN)
    assert response.status_code == 200
    body = await response.get_json()
    body.pop("vacuum")  # the database's figures: see the vacuum tests at the end
    assert body == {
        "job_types": [],
        "totals": {"job_type": "*", "ripe": 0, "scheduled": 0, "running": 0, "dead": 0},
        "queued_counted_at": None,
    }


async def test_health_ok(client: Client) -> None:
    response = await client.get("/health")
    assert response.status_code == 200
    assert await response.get_json() == {"status": "ok", "database": "ok"}


@pytest.fixture
async def proxied_client(db_proxy: DatabaseProxy, database: Database) -> AsyncIterator[Client]:
    """A client of an app whose database connections all go through `db_proxy`."""
    app = create_app(
        make_settings(db_proxy.dsn, min_pool_size=1, max_pool_size=4, admin_token=ADMIN_TOKEN)
    )
    use_keyed_client(app)  # acts as the users it creates
    async with app.test_app() as test_app:
        yield test_app.test_client()
    db.bind(database)


async def test_health_is_503_while_the_database_is_unreachable(
    proxied_client: Client, db_proxy: DatabaseProxy
) -> None:
    client = proxied_client
    assert (await client.get("/health")).status_code == 200

    await db_proxy.stop()  # every connection cut, new ones refused
    response = await client.get("/health")
    assert response.status_code == 503
    assert response.content_type == "application/json"
    assert_error(await response.get_json(), "database_unavailable")

    await db_proxy.start()  # the database is back: so is the service, without a restart
    response = await client.get("/health")
    assert response.status_code == 200
    assert await response.get_json() == {"status": "ok", "database": "ok"}


async def test_requests_are_503_while_the_database_is_unreachable(
    proxied_client: Client, db_proxy: DatabaseProxy, conn: Connection
) -> None:
    client = proxied_client
    user = await create_user(client)
    await db_proxy.stop()
    for response in [
        await client.get(f"/users/{user['id']}"),
        await client.post("/users", json={"name": "Bob", "email": "bob@example.com"}),
        await client.get("/jobs/stats", headers=ADMIN),
    ]:
        assert response.status_code == 503
        assert_error(await response.get_json(), "database_unavailable")
    assert await conn.fetchval("SELECT count(*) FROM users") == 1
    await db_proxy.start()
    assert (await client.get(f"/users/{user['id']}")).status_code == 200


async def test_openapi_lists_the_endpoints(client: Client) -> None:
    response = await client.get("/openapi.json")
    assert response.status_code == 200
    spec = await response.get_json()
    assert spec["info"]["title"] == "jobq"
    paths = {path: set(item) for path, item in spec["paths"].items()}
    expected = {
        "/users": {"post"},
        "/users/{user_id}": {"get"},
        "/users/{user_id}/reminders": {"get", "post"},
        "/users/{user_id}/exports": {"post"},
        "/reminders/{reminder_id}": {"get", "delete"},
        "/exports/{export_id}": {"get"},
        "/exports/{export_id}.ics": {"get"},
        "/jobs/stats": {"get"},
        "/health": {"get"},
    }
    for path, methods in expected.items():
        assert path in paths, sorted(paths)
        assert methods <= paths[path], (path, paths[path])
    post_users = spec["paths"]["/users"]["post"]
    assert "requestBody" in post_users
    assert "201" in post_users["responses"]
    assert "201" in spec["paths"]["/users/{user_id}/reminders"]["post"]["responses"]
    assert "202" in spec["paths"]["/users/{user_id}/exports"]["post"]["responses"]


async def test_docs_page(client: Client) -> None:
    """The page and its files come from the service (`jobq.api.docs`), under a policy that
    allows scripts from it alone; quart-schema's CDN pages are gone."""
    response = await client.get("/docs")
    assert response.status_code == 200
    assert response.mimetype == "text/html"
    page = await response.get_data(as_text=True)
    assert "openapi.json" in page
    assert "://" not in page  # nothing from elsewhere
    assert "<script>" not in page  # no inline script
    assert "script-src 'self'" in response.headers["Content-Security-Policy"]
    for asset in re.findall(r'(?:src|href)="(/docs/[^"]+)"', page):
        loaded = await client.get(asset)
        assert loaded.status_code == 200, asset
    for gone in ("/redocs", "/scalar"):
        assert (await client.get(gone)).status_code == 404


@pytest.mark.parametrize("path", ["/docs", "/dashboard/login"])
async def test_every_html_page_has_a_content_security_policy(client: Client, path: str) -> None:
    response = await client.get(path)
    assert response.mimetype == "text/html"
    assert "Content-Security-Policy" in response.headers
    assert response.headers["X-Content-Type-Options"] == "nosniff"


# -- /jobs/stats: what pins the vacuum horizon --------------------------------------------------


async def vacuum_of(client: Client) -> dict[str, Any]:
    response = await client.get("/jobs/stats", headers=ADMIN)
    assert response.status_code == 200
    vacuum: dict[str, Any] = (await response.get_json())["vacuum"]
    return vacuum


async def test_job_stats_report_the_age_of_the_oldest_open_transaction(
    client: Client, database: Database
) -> None:
    before = (await vacuum_of(client))["oldest_transaction_s"]
    assert before is None or before < 5  # nothing long-running in the test database

    other = await db.connect(database.dsn)  # an idle-in-transaction session elsewhere
    try:
        tx = other.transaction()
        await tx.start()
        await other.fetchval("SELECT pg_current_xact_id()")
        started_at = await other.fetchval(
            "SELECT xact_start FROM pg_stat_activity WHERE pid = pg_backend_pid()"
        )
        with freeze_time(started_at + timedelta(seconds=42), real_asyncio=True):
            age = (await vacuum_of(client))["oldest_transaction_s"]
        assert age == pytest.approx(42, abs=0.5)
        await tx.rollback()
    finally:
        await other.close()
    after = (await vacuum_of(client))["oldest_transaction_s"]
    assert after is None or after < 5


async def test_job_stats_report_live_and_dead_tuples_of_the_queue_tables(
    client: Client, conn: Connection
) -> None:
    def by_table(vacuum: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {t.pop("table"): t for t in vacuum["tables"]}

    # no dead tuples to start from, so that autovacuum (at 50) cannot run in the middle
    await conn.execute("VACUUM job")
    before = by_table(await vacuum_of(client))
    assert set(before) == {"job", "job_running", "job_dead"}
    # 30 jobs queued then deleted: 30 dead tuples in job; 2 rows in job_dead.
    await conn.execute(
        "INSERT INTO job (job_type, arguments, ripe_at, max_retries, created_at)"
        " SELECT 'vacuum.test', jsonb_build_object('n', n), now(), 0, now()"
        " FROM generate_series(1, 30) AS n"
    )
    await conn.execute("DELETE FROM job WHERE job_type = 'vacuum.test'")
    await conn.execute(
        "INSERT INTO job_dead (id, job_type, arguments, priority, attempts, max_retries,"
        " created_at, died_at) SELECT n, 'vacuum.test', '{}', 0, 1, 0, now(), now()"
        " FROM generate_series(1, 2) AS n"
    )
    await conn.execute("SELECT pg_stat_force_next_flush()")
    await conn.execute("SELECT 1")  # the flush happens as this session goes idle

    async def flushed() -> dict[str, dict[str, Any]] | None:
        after = by_table(await vacuum_of(client))
        grew = after["job"]["n_dead_tup"] - before["job"]["n_dead_tup"] >= 30
        return after if grew else None

    after = await eventually(flushed, what="the statistics to show the dead tuples", every=0.02)
    assert after["job"]["n_dead_tup"] >= 30
    assert after["job_dead"]["n_live_tup"] - before["job_dead"]["n_live_tup"] >= 2
    for table in after.values():
        assert table["n_live_tup"] >= 0
        assert table["n_dead_tup"] >= 0
        autovacuum = table["last_autovacuum_at"]
        assert autovacuum is None or datetime.fromisoformat(autovacuum).tzinfo is not None
