"""Background services: the one shape every periodic task of the engine takes.

A `Service` has a `name`, an `interval` and `run_once()`, which does one round and returns what
it did (a count); `run(stop)` repeats it every `interval` until `stop` is set, logging (never
raising) a round's failure. Tests call `run_once()` and never sleep. The worker runs its
heartbeat (`jobq.queue.worker`) and the rescuer below; pruning and schedules join them here.
(River's `internal/maintenance/` has the same shape.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta

from jobq import clock
from jobq.config import Settings
from jobq.db import Database
from jobq.queue import store

log = logging.getLogger("jobq.worker")


class Service:
    """A periodic task: `run_once()` every `interval`, until `run`'s `stop` is set."""

    def __init__(self, name: str, interval: timedelta, once: Callable[[], Awaitable[int]]):
        self.name = name
        self.interval = interval
        self.run_once = once

    async def run(self, stop: asyncio.Event) -> None:
        """Call `run_once()` now and every `interval` until `stop` is set; a failed round is
        logged and the next one comes as usual."""
        while not stop.is_set():
            try:
                await self.run_once()
            except Exception as exc:
                log.warning("%s failed (%s: %s)", self.name, type(exc).__name__, exc)
            try:
                async with asyncio.timeout(self.interval.total_seconds()):
                    await stop.wait()
            except TimeoutError:
                pass


def rescuer(database: Database, settings: Settings) -> Service:
    """The rescue, every `settings.rescue_interval`: return the jobs of dead or hung workers
    (any worker's) to the queue, wake the workers when there were some, and forget the rate
    windows that have closed. Its round returns how many jobs were rescued."""

    async def rescue() -> int:
        async with database.pool.acquire() as conn:
            now = clock.now()
            count = await store.rescue(conn, now=now, heartbeat_grace=settings.heartbeat_grace)
            await store.prune_rates(conn, now=now)
        if count:
            log.warning("rescued %d jobs of dead or hung workers", count)
            store.wake_workers(database)
        return count

    return Service("rescue", settings.rescue_interval, rescue)
