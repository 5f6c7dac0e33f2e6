"""The dashboard in a real browser: Debian's Chromium, headless, driven by Playwright. A person's
path through it: log in through the form, read every page (no console error), pause and resume
a queue, retry and discard dead jobs (one, and in bulk), find a job by id and read its attempts,
errors and result, watch a page refresh itself. The screenshots of the README are taken here,
at 1280x800 and at a phone's 390x844: into `docs/screenshots/` with `JOBQ_SCREENSHOTS=1`
(`JOBQ_SCREENSHOTS=1 .venv/bin/pytest tests/dashboard/test_browser.py`), else into the test's
temporary folder, so that a test run leaves the work tree as it was.

Skipped, saying why, where no Chromium is installed (`.ci/run` installs it)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from playwright.async_api import Browser, ConsoleMessage, Page, expect

from jobq.config import PROJECT_ROOT
from jobq.db import Connection
from jobq.queue import schedule
from jobq.queue.recurrence import ScheduleSpec
from tests.dashboard.conftest import ADMIN_TOKEN, CHROMIUM, MakeWorker, fill, fill_history

pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="Chromium is not installed (apt-get install chromium; .ci/run does)",
    ),
    pytest.mark.xdist_group("browser"),  # one Chromium (`browser`) for them all under xdist
]

README_SCREENSHOTS = PROJECT_ROOT / "docs" / "screenshots"
WAIT_MS = 30_000
"""How long an expectation waits for the page (Playwright polls; never a speed assertion)."""
expect.set_options(timeout=WAIT_MS)


class Console:
    """The console errors and uncaught exceptions of a page."""

    def __init__(self, page: Page) -> None:
        self.errors: list[str] = []
        page.on("console", self._message)
        page.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc}"))

    def _message(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.errors.append(message.text)


@pytest.fixture
async def page(browser: Browser, base_url: str) -> AsyncIterator[tuple[Page, Console]]:
    """A page of a new browser context (its own cookies) at 1280x800, logged in through the
    form; with its console's errors."""
    context = await browser.new_context(base_url=base_url, viewport={"width": 1280, "height": 800})
    context.set_default_timeout(WAIT_MS)
    tab = await context.new_page()
    console = Console(tab)
    await tab.goto("/dashboard/")
    await expect(tab).to_have_url(f"{base_url}/dashboard/login?next=/dashboard/?")
    await tab.get_by_label("Admin token").fill(ADMIN_TOKEN)
    await tab.get_by_role("button", name="Log in").click()
    await expect(tab.get_by_role("heading", name="Queues")).to_be_visible()
    yield tab, console
    await context.close()


async def paused(conn: Connection, name: str) -> bool:
    value: bool = await conn.fetchval("SELECT paused FROM job_queue WHERE name = $1", name)
    return value


async def test_every_page_loads_without_console_errors_and_screenshots_are_taken(
    page: tuple[Page, Console], make_worker: MakeWorker, conn: Connection, tmp_path: Path
) -> None:
    tab, console = page
    shots = README_SCREENSHOTS if os.environ.get("JOBQ_SCREENSHOTS") == "1" else tmp_path
    ids = await fill(make_worker)
    specs = [
        ScheduleSpec(name="nightly-report", job_type="report.build", cron="0 3 * * *"),
        ScheduleSpec(name="digest", job_type="mail.send", every_s=900, tz="Europe/Paris"),
    ]
    await schedule.declare(conn, specs, now=datetime.now(UTC))
    await fill_history(conn)
    for path in (
        "/dashboard/",
        "/dashboard/jobs",
        "/dashboard/jobs?state=failed",
        f"/dashboard/jobs/{ids['dead'][0]}",
        f"/dashboard/jobs/{ids['succeeded'][0]}",
        "/dashboard/dead",
    ):
        response = await tab.goto(path)
        assert response is not None
        assert response.status == 200, path
        await tab.wait_for_load_state("networkidle")
    await tab.goto("/dashboard/")
    await expect(tab.get_by_role("rowheader", name="mail", exact=True)).to_be_visible()
    await expect(tab.locator("#chart-list canvas")).to_have_count(4)  # 2 queues, 2 charts each
    shots.mkdir(parents=True, exist_ok=True)
    await tab.screenshot(path=shots / "dashboard-1280x800.png")
    await tab.set_viewport_size({"width": 390, "height": 844})
    await tab.screenshot(path=shots / "dashboard-390x844.png")
    # at a phone's width the page never scrolls sideways: the tables scroll inside it
    width = await tab.evaluate("document.documentElement.scrollWidth")
    assert width <= 390
    await tab.goto(f"/dashboard/jobs/{ids['dead'][0]}")
    await tab.screenshot(path=shots / "dashboard-job-390x844.png", full_page=True)
    await tab.goto("/dashboard/dead")
    await tab.screenshot(path=shots / "dashboard-dead-390x844.png")
    assert console.errors == []
    assert sorted(p.name for p in shots.glob("dashboard-*.png")) == [
        "dashboard-1280x800.png",
        "dashboard-390x844.png",
        "dashboard-dead-390x844.png",
        "dashboard-job-390x844.png",
    ]


async def test_the_pause_button_pauses_and_the_resume_button_resumes(
    page: tuple[Page, Console], make_worker: MakeWorker, conn: Connection
) -> None:
    tab, console = page
    await fill(make_worker, num_dead=0)
    await tab.reload()
    await tab.get_by_role("button", name="Pause queue mail").click()
    await expect(tab.get_by_role("status")).to_have_text("mail: paused")
    assert await paused(conn, "mail")
    assert not await paused(conn, "reports")
    await tab.get_by_role("button", name="Resume queue mail").click()
    await expect(tab.get_by_role("status")).to_have_text("mail: resumed")
    assert not await paused(conn, "mail")
    assert console.errors == []


async def test_retry_moves_a_dead_job_back_and_discard_deletes_one(
    page: tuple[Page, Console], make_worker: MakeWorker, conn: Connection
) -> None:
    tab, console = page
    first, second, third = (await fill(make_worker, num_dead=3))["dead"]
    await tab.goto("/dashboard/dead")
    await tab.get_by_role("button", name=f"Retry job {first}").click()
    await expect(tab.get_by_role("status")).to_have_text("retry: 1 job")
    assert await conn.fetchval("SELECT attempts FROM job WHERE id = $1", first) == 0
    assert await conn.fetchval("SELECT count(*) FROM job_dead WHERE id = $1", first) == 0
    await tab.get_by_role("button", name=f"Discard job {second}").click()
    await expect(tab.get_by_role("status")).to_have_text("discard: 1 job")
    assert await conn.fetchval("SELECT count(*) FROM job_dead") == 1
    assert await conn.fetchval("SELECT count(*) FROM job WHERE id = $1", second) == 0
    await expect(tab.get_by_role("button", name=f"Retry job {third}")).to_be_visible()
    assert console.errors == []


async def test_bulk_retry_moves_the_ticked_dead_jobs_back(
    page: tuple[Page, Console], make_worker: MakeWorker, conn: Connection
) -> None:
    tab, console = page
    dead = (await fill(make_worker, num_dead=4))["dead"]
    await tab.goto("/dashboard/dead")
    for job_id in dead[:3]:
        await tab.get_by_label(f"tick job {job_id}").check()
    await tab.get_by_role("button", name="Retry ticked").click()
    await expect(tab.get_by_role("status")).to_have_text("retry: 3 jobs")
    assert (
        sorted(await conn.fetchval("SELECT array_agg(id) FROM job WHERE queue = 'mail'"))
        == (dead[:3])
    )
    assert await conn.fetchval("SELECT array_agg(id) FROM job_dead") == [dead[3]]
    # "tick all" (the script's) then discard ticked empties the page
    await tab.get_by_label("tick every job on this page").check()
    await tab.get_by_role("button", name="Discard ticked").click()
    await expect(tab.get_by_text("No dead jobs.")).to_be_visible()
    assert await conn.fetchval("SELECT count(*) FROM job_dead") == 0
    assert console.errors == []


async def test_the_search_finds_a_job_by_id_with_its_attempts_errors_and_result(
    page: tuple[Page, Console], make_worker: MakeWorker
) -> None:
    tab, console = page
    ids = await fill(make_worker, num_dead=1)
    await tab.get_by_role("link", name="Jobs", exact=True).click()
    await tab.get_by_label("id").fill(str(ids["dead"][0]))
    await tab.get_by_role("button", name="Search").click()
    await expect(tab.get_by_role("heading", name=f"Job {ids['dead'][0]}")).to_be_visible()
    attempts = tab.locator("ol.attempts > li")
    await expect(attempts).to_have_count(2)
    await expect(attempts.first).to_contain_text("Attempt 1 failed")
    await expect(attempts.first).to_contain_text("SMTP 550: mailbox user0@example.com unavailable")
    await expect(tab.get_by_role("button", name="Retry")).to_be_visible()

    await tab.goto("/dashboard/jobs")
    await tab.get_by_label("id").fill(str(ids["succeeded"][0]))
    await tab.get_by_role("button", name="Search").click()
    await expect(tab.locator("pre.result")).to_contain_text('"total_eur": 98765.5')
    await expect(tab.get_by_text("No failed attempts.")).to_be_visible()
    assert console.errors == []


async def test_a_page_refreshes_itself(
    page: tuple[Page, Console], make_worker: MakeWorker, conn: Connection
) -> None:
    tab, console = page
    await fill(make_worker, num_dead=0)
    await tab.reload()
    row = tab.get_by_role("row").filter(
        has=tab.get_by_role("rowheader", name="imports", exact=True)
    )
    await expect(row).to_contain_text("running")
    await conn.execute("UPDATE job_queue SET paused = true WHERE name = 'imports'")
    await expect(row).to_contain_text("paused")  # within a refresh or two, without a reload
    assert console.errors == []


async def test_logging_out_ends_the_session(page: tuple[Page, Console], base_url: str) -> None:
    tab, console = page
    await tab.get_by_role("button", name="Log out").click()
    await expect(tab.get_by_role("heading", name="Log in")).to_be_visible()
    await tab.goto("/dashboard/dead")
    await expect(tab.get_by_role("heading", name="Log in")).to_be_visible()
    assert console.errors == []
