"""The recording handler: `recorded` writes each of its executions to the `execution` table.

Worker subprocesses import this module through `JOBQ_JOB_MODULES=tests.toolkit.handlers` (with
`PYTHONPATH` at the project root); the test process never imports it, so the global registry of
the tests holds no `recorded`. The process tests and the chaos suite create the table
(`EXECUTION_TABLE`) and empty it before each test.

An execution row is written when the handler starts (job id, attempt, worker, pid, start time)
and completed when it ends (end time, `ok` or `failed`), each in its own short transaction, as
handlers should do their database work: nothing stays open while the job sleeps.
"""

from __future__ import annotations

import asyncio
import os

from pydantic import BaseModel, Field

from jobq import clock
from jobq.db import transaction
from jobq.queue import JobContext, handler

JOB_TYPE = "recorded"

EXECUTION_TABLE = """
CREATE TABLE IF NOT EXISTS execution (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id      bigint      NOT NULL,
    attempt     integer     NOT NULL,
    worker_id   integer     NOT NULL,
    pid         integer     NOT NULL,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz,
    outcome     text CHECK (outcome IN ('ok', 'failed'))
);
CREATE INDEX IF NOT EXISTS execution_job_idx ON execution (job_id);
"""
"""One row per execution of a `recorded` job."""


class RecordedArgs(BaseModel):
    """Arguments of `recorded`.

    `n` tells otherwise identical jobs apart (dedup). The job's first execution sleeps
    `sleep_s`, later ones (after a failure, a rescue or a release) `resleep_s` (default: the
    same); attempt numbers can't tell, as a release charges no attempt. With `fail_first`, the
    first execution raises after its sleep.
    """

    n: int = 0
    sleep_s: float = Field(default=0.0, ge=0)
    resleep_s: float | None = Field(default=None, ge=0)
    fail_first: bool = False


class FailedOnPurpose(Exception):
    """The first attempt of a `fail_first` job fails."""


@handler(JOB_TYPE, args=RecordedArgs, timeout=120)
async def recorded(args: RecordedArgs, job: JobContext) -> None:
    """Record the execution's start, sleep, maybe fail, record its end."""
    async with transaction() as conn:
        earlier: int = await conn.fetchval(
            "SELECT count(*) FROM execution WHERE job_id = $1", job.id
        )
        execution_id: int = await conn.fetchval(
            "INSERT INTO execution (job_id, attempt, worker_id, pid, started_at)"
            " VALUES ($1, $2, $3, $4, $5) RETURNING id",
            job.id,
            job.attempt,
            job.worker_id,
            os.getpid(),
            clock.now(),
        )
    first = earlier == 0
    sleep_s = args.sleep_s if first or args.resleep_s is None else args.resleep_s
    if sleep_s:
        await asyncio.sleep(sleep_s)
    outcome = "failed" if args.fail_first and first else "ok"
    async with transaction() as conn:
        await conn.execute(
            "UPDATE execution SET finished_at = $2, outcome = $3 WHERE id = $1",
            execution_id,
            clock.now(),
            outcome,
        )
    if outcome == "failed":
        raise FailedOnPurpose(f"attempt {job.attempt} of job {job.id} fails on purpose")


SYNC_JOB_TYPE = "recorded_sync"


@handler(SYNC_JOB_TYPE, args=RecordedArgs, timeout=120)
def recorded_sync(args: RecordedArgs, job: JobContext) -> bool:
    """In the thread pool: record the execution's start, wait `sleep_s` unless the job is
    cancelled first (`JobContext.cancelled`), record its end; return whether it was."""
    execution_id = job.run_coroutine(_started(job))
    cancelled = job.cancelled.wait(args.sleep_s)
    job.run_coroutine(_finished(execution_id))
    return cancelled


async def _started(job: JobContext) -> int:
    async with transaction() as conn:
        execution_id: int = await conn.fetchval(
            "INSERT INTO execution (job_id, attempt, worker_id, pid, started_at)"
            " VALUES ($1, $2, $3, $4, $5) RETURNING id",
            job.id,
            job.attempt,
            job.worker_id,
            os.getpid(),
            clock.now(),
        )
    return execution_id


async def _finished(execution_id: int) -> None:
    async with transaction() as conn:
        await conn.execute(
            "UPDATE execution SET finished_at = $2, outcome = 'ok' WHERE id = $1",
            execution_id,
            clock.now(),
        )
