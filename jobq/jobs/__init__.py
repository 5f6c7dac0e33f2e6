"""The application's job handlers, registered on import, and the state they are given."""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from jobq.config import Settings
from jobq.jobs import exports, reminders

__all__ = ["exports", "import_job_modules", "job_state", "reminders"]


def import_job_modules(settings: Settings) -> None:
    """Import `settings.job_modules` so that their `@handler`s register.
    Raises: `ImportError` for a module that cannot be imported."""
    for name in settings.job_modules:
        importlib.import_module(name)


@asynccontextmanager
async def job_state(settings: Settings) -> AsyncIterator[dict[str, Any]]:
    """Import the job modules, then yield the `JobContext.state` of a worker: `settings` and
    `http` (an `httpx.AsyncClient` with the webhook timeouts and no redirects), closed on exit."""
    import_job_modules(settings)
    timeout = httpx.Timeout(settings.webhook_timeout.total_seconds())
    async with httpx.AsyncClient(timeout=timeout, follow_redirects=False) as http:
        yield {"settings": settings, "http": http}
