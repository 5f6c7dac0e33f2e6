"""The rescue: the jobs of dead or hung workers back to the queue."""

from __future__ import annotations

import logging

from jobq import clock
from jobq.config import Settings
from jobq.db import Database
from jobq.queue import store, wakeup
from jobq.queue.service import Service

log = logging.getLogger("jobq.worker")


def rescuer(database: Database, settings: Settings) -> Service:
    """The rescue, every `settings.rescue_interval`: return the jobs of dead or hung workers
    (any worker's) to the queue, wake the workers when there were some, and forget the rate
    windows that have closed. Its round returns how many jobs were rescued."""

    async def rescue() -> int:
        async with database.pool.acquire() as conn:
            now = clock.now()
            count = await store.rescue(
                conn, now=now, heartbeat_grace=settings.heartbeat_grace, retain=settings.retain
            )
            await store.prune_rates(conn, now=now)
        if count:
            log.warning("rescued %d jobs of dead or hung workers", count)
            wakeup.wake_workers(database)
        return count

    return Service("rescue", settings.rescue_interval, rescue)
