"""The dashboard's second round in a real browser (Debian's Chromium, headless, as
`test_browser`): the history charts drawn with data by the vendored uPlot with no request
leaving the machine, the dead letter's size in the menu, jobs held back with their reason, the
search by arguments, bulk cancel, retry and discard of every dead job a filter matches, and the
Database panel listing every queue table."""

from __future__ import annotations

from urllib.parse import urlsplit

from playwright.async_api import Page, Request, expect

from jobq.db import Connection
from tests.dashboard.conftest import MakeWorker, fill, fill_history
from tests.dashboard.test_browser import Console, page, pytestmark

__all__ = ["page", "pytestmark"]  # the fixture and marks of test_browser


async def test_the_charts_are_drawn_with_data_and_nothing_leaves_the_machine(
    page: tuple[Page, Console], conn: Connection
) -> None:
    tab, console = page
    hosts: set[str] = set()

    def seen(request: Request) -> None:
        hosts.add(urlsplit(request.url).hostname or request.url)

    tab.on("request", seen)
    await fill_history(conn, ("mail",))
    await tab.reload()
    chart = tab.locator('.chart[data-queue="mail"]')
    await expect(chart.locator("canvas")).to_have_count(2)  # throughput, latency
    figures = chart.locator("figure[data-points]")
    await expect(figures).to_have_count(2)
    assert [await f.get_attribute("data-points") for f in await figures.all()] == ["60", "60"]
    await expect(chart).to_contain_text("enqueued/s")
    await expect(chart).to_contain_text("pickup p95")
    # the canvas has been painted: some pixel is not blank
    painted = await chart.locator("canvas").first.evaluate(
        "c => c.getContext('2d').getImageData(0, 0, c.width, c.height).data.some(v => v !== 0)"
    )
    assert painted
    await tab.get_by_role("button", name="24h").click()
    await expect(tab.get_by_role("button", name="24h")).to_have_attribute("aria-pressed", "true")
    await expect(chart.locator("figure[data-points]")).to_have_count(2)
    assert hosts == {"127.0.0.1"}, hosts  # the page, its script, uPlot and the data: all local
    assert console.errors == []


async def test_the_menu_counts_the_dead_letter(
    page: tuple[Page, Console], make_worker: MakeWorker
) -> None:
    tab, console = page
    await expect(tab.locator("#dead-count")).to_have_text("0")
    await fill(make_worker, num_dead=3)
    await tab.goto("/dashboard/jobs")
    await expect(tab.locator("#dead-count")).to_have_text("3")
    assert console.errors == []


async def test_held_back_jobs_say_why(
    page: tuple[Page, Console], make_worker: MakeWorker, conn: Connection
) -> None:
    tab, console = page
    ids = await fill(make_worker, num_dead=0)  # 5 queued in `imports`, which no worker serves
    await conn.execute("UPDATE job_queue SET paused = true WHERE name = 'imports'")
    await tab.reload()
    row = tab.get_by_role("row").filter(
        has=tab.get_by_role("rowheader", name="imports", exact=True)
    )
    await expect(row.locator("td.held")).to_have_text("all: paused")
    await tab.goto("/dashboard/jobs?queue=imports")
    await expect(tab.locator("#results .badge.held")).to_have_count(5)
    await expect(tab.locator("#results .badge.held").first).to_have_text("held: paused")
    await tab.goto(f"/dashboard/jobs/{ids['queued'][0]}")
    await expect(tab.locator(".held-why")).to_contain_text("its queue imports is paused")
    # a concurrency limit reached: held by the limit
    await conn.execute(
        "UPDATE job_queue SET paused = false, max_running = 1 WHERE name = 'imports'"
    )
    await conn.execute(
        "INSERT INTO job_running (id, job_type, arguments, ripe_at, priority, attempts,"
        " max_retries, created_at, worker_id, claimed_at, lease_expires_at, token, queue)"
        " VALUES (424242, 'later', '{}', now(), 0, 0, 0, now(), 1, now(),"
        " now() + interval '1 hour', nextval('job_fencing_token'), 'imports')"
    )
    await tab.goto("/dashboard/jobs?queue=imports&state=queued")
    await expect(tab.locator("#results .badge.held").first).to_have_text("held: limit")
    assert console.errors == []


async def test_search_by_arguments_then_cancel_the_ticked_jobs(
    page: tuple[Page, Console], make_worker: MakeWorker, conn: Connection
) -> None:
    tab, console = page
    ids = await fill(make_worker, num_dead=3)
    await tab.goto("/dashboard/jobs")
    await tab.get_by_label("arguments").fill('{"to": "user1@example.com"}')
    await tab.get_by_role("button", name="Search").click()
    rows = tab.locator("#results tbody tr")
    await expect(rows).to_have_count(1)
    await expect(rows.first).to_contain_text(str(ids["dead"][1]))
    # the queued jobs of `imports`, every one ticked by the script's box, then cancelled
    await tab.goto("/dashboard/jobs?queue=imports")
    await expect(tab.locator("#results tbody tr")).to_have_count(5)
    await tab.get_by_label("tick every job on this page that can be cancelled").check()
    await tab.get_by_role("button", name="Cancel ticked").click()
    await expect(tab.get_by_role("status")).to_have_text("cancel: 5 jobs")
    cancelled = await conn.fetchval(
        "SELECT count(*) FROM job_done WHERE state = 'cancelled' AND id = ANY($1::bigint[])",
        ids["queued"],
    )
    assert cancelled == 5
    assert await conn.fetchval("SELECT count(*) FROM job WHERE queue = 'imports'") == 0
    assert console.errors == []


async def test_retry_and_discard_every_dead_job_a_filter_matches(
    page: tuple[Page, Console], make_worker: MakeWorker, conn: Connection, monkeypatch: object
) -> None:
    tab, console = page
    dead = (await fill(make_worker, num_dead=4))["dead"]
    await tab.goto("/dashboard/dead")
    await tab.get_by_label("error contains").fill("user2@")
    await tab.get_by_role("button", name="Filter").click()
    await expect(tab.locator("tbody tr")).to_have_count(1)
    await tab.get_by_role("button", name="Retry all matching").click()
    await expect(tab.get_by_role("status")).to_have_text("retry: 1 job")
    assert await conn.fetchval("SELECT array_agg(id) FROM job WHERE queue = 'mail'") == [dead[2]]
    # no filter: every dead job, not only the page shown
    await tab.goto("/dashboard/dead")
    await tab.get_by_role("button", name="Discard all dead jobs").click()
    await expect(tab.get_by_role("status")).to_have_text("discard: 3 jobs")
    assert await conn.fetchval("SELECT count(*) FROM job_dead") == 0
    await expect(tab.locator("#dead-count")).to_have_text("0")
    assert console.errors == []


async def test_the_database_panel_lists_every_queue_table(page: tuple[Page, Console]) -> None:
    tab, console = page
    panel = tab.locator("#database tbody th")
    await expect(panel).to_have_text(["job", "job_attempt", "job_dead", "job_done", "job_running"])
    assert console.errors == []
