"""The application's job handlers, registered on import, and the state they are given."""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from jobq import tracing
from jobq.config import Settings
from jobq.domain import exports as export_domain
from jobq.domain import reminders as reminder_domain
from jobq.domain import signing
from jobq.domain.webhooks import warn_if_unguarded, webhook_client
from jobq.jobs import exports, reminders
from jobq.queue.registry import Registry, registry

__all__ = ["declare_queues", "exports", "import_job_modules", "job_state", "reminders"]


def declare_queues(settings: Settings, handlers: Registry = registry) -> None:
    """Declare the application's queues and their limits, from `settings`: reminder
    deliveries limited per user (`reminder_user_max_running` at once; the limits per webhook
    address are the delivery's own: `jobq.domain.shares`), and exports rendered one per user
    at a time, with 2 slots by default (they run in threads)."""
    handlers.queue(reminder_domain.QUEUE, max_running_per_key=settings.reminder_user_max_running)
    handlers.queue(export_domain.QUEUE, slots=2, max_running_per_key=1)


def import_job_modules(settings: Settings) -> None:
    """Import `settings.job_modules` so that their `@handler`s register.
    Raises: `ImportError` for a module that cannot be imported."""
    for name in settings.job_modules:
        importlib.import_module(name)


@asynccontextmanager
async def job_state(settings: Settings) -> AsyncIterator[dict[str, Any]]:
    """Import the job modules, then yield the `JobContext.state` of a worker: `settings` (with
    the webhook secret: `jobq.domain.signing.with_secret`) and `http` (the guarded webhook
    client, `jobq.domain.webhooks.webhook_client`, traced with the `otel` extra), closed on
    exit. Logs a WARNING while the SSRF guard is off. Raises: `ValueError`, `OSError` (a kept
    secret that cannot be read)."""
    import_job_modules(settings)
    declare_queues(settings)
    settings = signing.with_secret(settings)
    warn_if_unguarded(settings)
    async with webhook_client(settings, tracing.client_trace_configs()) as http:
        yield {"settings": settings, "http": http}
