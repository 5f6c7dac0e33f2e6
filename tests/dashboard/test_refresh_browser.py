"""The dashboard's live refresh never stacks its requests: in Chromium, with every refresh
answered slowly (three times the refresh interval), each starts only after the one before has
finished. Skipped where no Chromium is installed."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest
from playwright.async_api import Page, Request, Route

from jobq.dashboard import views
from tests.dashboard.test_browser import Console, page, pytestmark

__all__ = ["page", "pytestmark"]

REFRESH_S = 0.2
SLOW_S = 0.6


async def test_a_slow_refresh_delays_the_next_instead_of_stacking(
    page: tuple[Page, Console], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(views, "REFRESH_S", REFRESH_S)
    tab, console = page
    spans: list[tuple[float, float]] = []
    four = asyncio.Event()

    async def slowly(route: Route, request: Request) -> None:
        if request.resource_type != "fetch":  # the page itself
            await route.continue_()
            return
        started = time.monotonic()
        await asyncio.sleep(SLOW_S)
        await route.continue_()
        spans.append((started, time.monotonic()))
        if len(spans) == 4:
            four.set()

    await tab.route("**/dashboard/", slowly)
    await tab.goto("/dashboard/")  # its body now says to refresh every 0.2 s
    await asyncio.wait_for(four.wait(), 30)
    for (_, ended), (started, _) in itertools.pairwise(spans):
        assert started >= ended  # the next began once the one before had its answer
    assert console.errors == []
