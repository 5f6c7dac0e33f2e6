"""Fixtures of the dashboard tests: the app served by hypercorn with an admin token, an httpx
client of it, and a real worker whose jobs fill the pages (a result, failed attempts, dead
jobs)."""

from __future__ import annotations

import math
import re
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, async_playwright
from pydantic import BaseModel

from jobq import db
from jobq.app import create_app
from jobq.config import Settings
from jobq.db import Connection, Database
from jobq.queue import Job, JobContext, Registry, Worker, enqueue
from jobq.queue.backoff import Backoff
from jobq.queue.metrics import BOUNDS
from tests.api.conftest import ADMIN, ADMIN_TOKEN
from tests.conftest import make_settings
from tests.toolkit.procs import eventually
from tests.toolkit.served import served

__all__ = ["ADMIN", "ADMIN_TOKEN"]

MakeWorker = Callable[..., Awaitable[Worker]]

# -- the browser tests' Chromium -------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or (
    "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None
)
"""Debian's Chromium, or None where it is not installed (the browser tests are skipped)."""


@pytest.fixture(scope="session")
async def browser() -> AsyncIterator[Browser]:
    """Headless Chromium (Debian's, never a downloaded build), with a fresh profile: one for
    every browser test of the session (`xdist_group("browser")` puts them on one xdist
    worker), each test in a context of its own (its cookies, its storage)."""
    assert CHROMIUM is not None
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        yield launched
        await launched.close()


@pytest.fixture
def settings(pool_url: str) -> Settings:
    """The test settings, with an admin token."""
    return make_settings(pool_url, admin_token=ADMIN_TOKEN)


@pytest.fixture
async def base_url(settings: Settings, database: Database) -> AsyncIterator[str]:
    """The app (the test's `settings`) served by hypercorn on 127.0.0.1: its base URL."""
    try:
        async with served(create_app(settings)) as url:
            yield url
    finally:
        db.bind(database)


@pytest.fixture
async def http(base_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client of the served app that follows no redirect."""
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
        yield client


SESSION = re.compile(r"jobq_dashboard=([^;]*)")


async def log_in(http: httpx.AsyncClient) -> tuple[str, str]:
    """Log in through the form; return the session cookie's value and the CSRF token of the
    pages. (httpx keeps no `Secure` cookie over http: the tests send it themselves.)"""
    response = await http.post("/dashboard/login", data={"token": ADMIN_TOKEN})
    assert response.status_code == 303, response.text
    found = SESSION.search(response.headers["set-cookie"])
    assert found is not None
    cookie = found.group(1)
    page = await http.get("/dashboard/", headers={"Cookie": f"jobq_dashboard={cookie}"})
    assert page.status_code == 200
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
    assert csrf is not None
    return cookie, csrf.group(1)


class Mail(BaseModel):
    to: str


class Report(BaseModel):
    month: str


def app_handlers() -> Registry:
    """Queues `mail` (its sends always fail: two attempts, then the dead letter), `reports`
    (a report returns its figures) and `imports` (no handler)."""
    handlers = Registry()
    handlers.queue("mail", max_running=4)
    handlers.queue("imports")  # declared, not served by `fill`'s worker

    @handlers.handler(
        "mail.send",
        args=Mail,
        queue="mail",
        max_retries=1,
        backoff=Backoff(timedelta(0), timedelta(0), 0),
    )
    async def send(args: Mail, job: JobContext) -> None:
        raise RuntimeError(f"SMTP 550: mailbox {args.to} unavailable")

    @handlers.handler("report.build", args=Report, queue="reports")
    async def build(args: Report, job: JobContext) -> dict[str, Any]:
        return {"month": args.month, "rows": 1234, "total_eur": 98765.5}

    return handlers


async def fill(make_worker: MakeWorker, *, num_dead: int = 3) -> dict[str, list[int]]:
    """Start a worker (it stays registered and alive) and run jobs to their outcomes: a
    succeeded report, `num_dead` dead mails (two failed attempts each), and queued reports it
    leaves (a second queue it does not serve). Return the ids by kind."""
    handlers = app_handlers()
    worker = await make_worker(handlers, queues={"mail": 4, "reports": 4})
    report = await enqueue(
        Job(job_type="report.build", arguments={"month": "2026-10"}), handlers=handlers
    )
    dead = [
        (
            await enqueue(
                Job(job_type="mail.send", arguments={"to": f"user{i}@example.com"}),
                handlers=handlers,
            )
        ).id
        for i in range(num_dead)
    ]

    async def all_dead() -> bool:
        await worker.run_once()  # claim, record the failure and claim again, record...
        await worker.wait_idle()
        async with db.current_database().pool.acquire() as conn:
            return bool(await conn.fetchval("SELECT count(*) FROM job_dead") == num_dead)

    # rounds until then, not a fixed number: on a busy machine a round can claim no retry
    await eventually(all_dead, within=30, what=f"{num_dead} dead jobs", every=0.05)
    await worker.run_once()  # records the report's outcome, if still pending
    waiting = [
        (await enqueue(Job(job_type="later", arguments={"n": n}, queue="imports"))).id
        for n in range(5)
    ]
    return {"succeeded": [report.id], "dead": dead, "queued": waiting}


async def fill_history(conn: Connection, queues: tuple[str, ...] = ("mail", "reports")) -> None:
    """Write an hour of `job_history` rows for `queues`, as the leader would have (a row a
    minute, cumulative): a day's shape of traffic, a few failures, pickup lags of milliseconds
    and run times of tenths of seconds."""
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    # in place of what a worker of the test, the leader, wrote already
    await conn.execute("DELETE FROM job_history WHERE queue = ANY($1::text[])", list(queues))
    for q, queue in enumerate(queues):
        enqueued = succeeded = failed = 0
        pickup = [0] * (len(BOUNDS) + 1)
        run = [0] * (len(BOUNDS) + 1)
        rows = []
        for minute in range(61):
            n = int(600 * (1.2 + math.sin(minute / 9 + q)) * (1 + q))
            enqueued += n
            succeeded += n - n // 40
            failed += n // 40
            pickup[2] += n // 2  # (2.5 ms, 5 ms]
            pickup[4] += n // 2 - n // 10  # (10 ms, 25 ms]
            pickup[6] += n // 10  # (50 ms, 100 ms]
            run[7] += n // 2  # (0.1 s, 0.25 s]
            run[8] += n // 2 - n // 20  # (0.25 s, 0.5 s]
            run[9 + minute % 2] += n // 20
            at = now - timedelta(minutes=60 - minute)
            rows.append((queue, at, enqueued, succeeded, failed, list(pickup), list(run)))
        await conn.executemany(
            "INSERT INTO job_history (queue, at, enqueued, succeeded, failed, pickup_buckets,"
            " run_buckets) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
            rows,
        )
