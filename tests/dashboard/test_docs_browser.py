"""The API's documentation page (`/docs`) in a real browser, Debian's Chromium, headless, with
every request that would leave the machine refused: the page renders the operations, from the
files the service serves itself, under its Content-Security-Policy, without a console error (a
policy violation is one). Skipped, saying why, where no Chromium is installed (`.ci/run`
installs it)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from playwright.async_api import Browser, Request, Route, expect

from tests.dashboard.test_browser import WAIT_MS, Console, pytestmark

__all__ = ["pytestmark"]


async def test_the_docs_render_with_no_request_leaving_the_machine(
    browser: Browser, base_url: str, tmp_path: Path
) -> None:
    context = await browser.new_context(base_url=base_url, viewport={"width": 1280, "height": 800})
    context.set_default_timeout(WAIT_MS)
    requested: list[str] = []
    refused: list[str] = []
    ours = urlsplit(base_url).netloc

    async def only_ours(route: Route, request: Request) -> None:
        requested.append(request.url)
        parts = urlsplit(request.url)
        if parts.scheme in ("data", "blob") or parts.netloc == ours:
            await route.continue_()
        else:
            refused.append(request.url)
            await route.abort()

    await context.route("**/*", only_ours)
    tab = await context.new_page()
    console = Console(tab)
    response = await tab.goto("/docs")
    assert response is not None
    assert response.status == 200
    policy = await response.header_value("content-security-policy")
    assert policy is not None
    assert "script-src 'self'" in policy
    await expect(tab.locator(".swagger-ui .info .title")).to_contain_text("jobq")
    path = tab.locator(".opblock-summary-path", has_text="/users/{user_id}/reminders")
    await expect(path.first).to_be_visible()
    await path.first.click()  # an operation opens, with its parameters and answers
    await expect(tab.locator(".opblock.is-open .responses-table").first).to_be_visible()
    await tab.wait_for_load_state("networkidle")
    await tab.screenshot(path=tmp_path / "docs-1280x800.png")
    assert refused == []
    assert {urlsplit(u).path for u in requested} >= {
        "/docs",
        "/docs/assets/swagger-ui-bundle.js",
        "/docs/assets/swagger-ui.css",
        "/docs/init.js",
        "/openapi.json",
    }
    assert console.errors == []
    await context.close()
