"""Handlers of the metrics tests (`tests/test_metrics.py`), for real processes.

A `python -m jobq serve` or `worker` subprocess imports this module through
`JOBQ_JOB_MODULES=tests.proc_metrics_handlers`; the test process enqueues their jobs by type on
queue `metrics` (at most one of its jobs running at once, across every worker: the others are
held back by that limit) or `metrics.wide` (no limit).
"""

from __future__ import annotations

import asyncio

from pydantic import BaseModel, Field

from jobq.errors import Snooze
from jobq.queue import JobContext, handler, registry

QUEUE = "metrics"
registry.queue(QUEUE, max_running=1)
WIDE = "metrics.wide"
registry.queue(WIDE)
"""No limit: the jobs of the aggregation test go here."""

OK, FAIL, SNOOZE, SLEEP = "metrics.ok", "metrics.fail", "metrics.snooze", "metrics.sleep"


class Args(BaseModel):
    """`n` tells otherwise identical jobs apart; `sleep_s`: how long the handler sleeps."""

    n: int = 0
    sleep_s: float = Field(default=0.0, ge=0)


@handler(OK, args=Args, queue=QUEUE)
async def ok(args: Args, job: JobContext) -> None:
    """Succeeds after `sleep_s`."""
    await asyncio.sleep(args.sleep_s)


class FailedOnPurpose(Exception):
    """Every attempt of a `metrics.fail` job fails."""


@handler(FAIL, args=Args, queue=QUEUE, max_retries=1)
async def fail(args: Args, job: JobContext) -> None:
    """Fails every time: retried once (backoff: `JOBQ_BACKOFF_BASE_S`), then dead."""
    raise FailedOnPurpose(f"attempt {job.attempt} fails on purpose")


_snoozed: set[int] = set()
"""The jobs this process snoozed already."""


@handler(SNOOZE, args=Args, queue=QUEUE)
async def snooze(args: Args, job: JobContext) -> None:
    """Snoozes 0.1 s the first time this process runs the job, then succeeds."""
    if job.id not in _snoozed:
        _snoozed.add(job.id)
        raise Snooze(0.1)


@handler(SLEEP, args=Args, queue=QUEUE)
async def sleep(args: Args, job: JobContext) -> None:
    """Sleeps `sleep_s` (a cancel cuts it short)."""
    await asyncio.sleep(args.sleep_s)
