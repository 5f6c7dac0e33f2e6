"""The shape of the background services (`jobq.queue.service.Service`): a round every
interval, and, for the fleet's upkeep, rounds only while the worker leads, with no timer
running meanwhile."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from jobq.queue.service import Service
from tests.toolkit.procs import eventually


async def test_an_upkeep_service_runs_rounds_only_while_its_worker_leads() -> None:
    rounds = 0

    async def once() -> int:
        nonlocal rounds
        rounds += 1
        return 0

    service = Service("upkeep", timedelta(seconds=0.01), once)
    service.when = leading = asyncio.Event()
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    await asyncio.sleep(0.1)  # ten intervals, not leading
    assert rounds == 0

    leading.set()

    async def ran(count: int = 3) -> bool:
        return rounds >= count

    await eventually(ran, within=10, what="rounds while leading")
    leading.clear()
    await asyncio.sleep(0.05)  # a round in flight ends; none starts after it
    after = rounds
    await asyncio.sleep(0.1)
    assert rounds == after

    stop.set()  # a stop ends the wait for the lead
    await asyncio.wait_for(task, timeout=10)
