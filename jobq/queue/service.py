"""Background services: the one shape every periodic task of the engine takes.

A `Service` has a `name`, an `interval` and `run_once()`, which does one round and returns what
it did (a count); `run(stop)` repeats it every `interval` until `stop` is set, logging (never
raising) a round's failure. Tests call `run_once()` and never sleep. Every worker runs its
heartbeat (`jobq.queue.worker`) and the metrics' flush (`jobq.queue.metrics`) as services; the
elected leader alone runs the fleet's upkeep (`jobq.queue.leader`). River's
`internal/maintenance/` has the same shape.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta

log = logging.getLogger("jobq.worker")


class Service:
    """A periodic task: `run_once()` every `interval`, until `run`'s `stop` is set."""

    def __init__(self, name: str, interval: timedelta, once: Callable[[], Awaitable[int]]):
        self.name = name
        self.interval = interval
        self.run_once = once
        self.when: asyncio.Event | None = None
        """When given, `run` runs rounds only while this event is set (its worker leads the
        upkeep), and sleeps until it is: the rest of a fleet's workers run no timer for it."""

    async def run(self, stop: asyncio.Event) -> None:
        """Call `run_once()` now and every `interval` until `stop` is set (while `when` is not
        set, waiting for it); a failed round is logged and the next one comes as usual."""
        while not stop.is_set():
            if self.when is not None and not self.when.is_set():
                await _either(stop, self.when)
                continue
            try:
                await self.run_once()
            except Exception as exc:
                log.warning("%s failed (%s: %s)", self.name, type(exc).__name__, exc)
            try:
                async with asyncio.timeout(self.interval.total_seconds()):
                    await stop.wait()
            except TimeoutError:
                pass


async def _either(*events: asyncio.Event) -> None:
    """Wait until one of `events` is set."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
