"""The application's job handlers, registered on import, and the state they are given."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from jobq.config import Settings
from jobq.jobs import exports, reminders

__all__ = ["exports", "job_state", "reminders"]


@asynccontextmanager
async def job_state(settings: Settings) -> AsyncIterator[dict[str, Any]]:
    """Yield the `JobContext.state` of a worker: `settings` and `http` (an `httpx.AsyncClient`
    with the webhook timeouts and no redirects), closed on exit."""
    timeout = httpx.Timeout(settings.webhook_timeout.total_seconds())
    async with httpx.AsyncClient(timeout=timeout, follow_redirects=False) as http:
        yield {"settings": settings, "http": http}
