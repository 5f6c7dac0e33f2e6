"""Handlers for the real-process tests (`tests/test_processes.py`).

A worker subprocess imports this module through `JOBQ_JOB_MODULES=tests.proc_handlers` (with
`PYTHONPATH` at the project root); the test process never imports it, so the global registry
of the tests holds no `proc_sleep`. Every execution is recorded in `test_execution`, which the
tests create (`EXECUTION_TABLE` in the test module) and empty before each test.
"""

from __future__ import annotations

import asyncio
import os

from pydantic import BaseModel, Field

from jobq import clock
from jobq.db import transaction
from jobq.queue import JobContext, handler


class SleepArgs(BaseModel):
    """Arguments of `proc_sleep`. `tag` only tells otherwise identical jobs apart (dedup)."""

    seconds: float = Field(ge=0)
    tag: str = ""


@handler("proc_sleep", args=SleepArgs, timeout=60)
async def proc_sleep(args: SleepArgs, job: JobContext) -> None:
    """Record a start row, sleep, then set the row's `finished_at`.

    Sleeps `args.seconds` on the first execution of this job id only, and not at all on a later
    one (after a crash or a release), so that a rescued or released job then completes at once.
    Attempt numbers can't decide this: a release charges no attempt. Each step commits in its
    own short transaction: none stays open while the job sleeps.
    """
    async with transaction() as conn:
        earlier: int = await conn.fetchval(
            "SELECT count(*) FROM test_execution WHERE job_id = $1", job.id
        )
        execution_id: int = await conn.fetchval(
            "INSERT INTO test_execution (job_id, attempt, worker_id, pid, started_at)"
            " VALUES ($1, $2, $3, $4, $5) RETURNING id",
            job.id,
            job.attempt,
            job.worker_id,
            os.getpid(),
            clock.now(),
        )
    await asyncio.sleep(args.seconds if earlier == 0 else 0)
    async with transaction() as conn:
        await conn.execute(
            "UPDATE test_execution SET finished_at = $2 WHERE id = $1", execution_id, clock.now()
        )
