"""Handlers of the workflow tests' worker processes (`JOBQ_JOB_MODULES=tests.toolkit.handlers,
tests.flow.handlers`): `progressing` reports its progress as it goes, from the event loop or
from the thread pool."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel, Field

from jobq.queue import JobContext, handler, report_progress, report_progress_from_thread

PROGRESSING = "progressing"
PROGRESSING_SYNC = "progressing_sync"


class ProgressArgs(BaseModel):
    """`steps` reports, `pause_s` apart."""

    steps: int = Field(default=4, ge=1)
    pause_s: float = Field(default=0.3, ge=0)


@handler(PROGRESSING, args=ProgressArgs)
async def progressing(args: ProgressArgs, job: JobContext) -> int:
    """Report step i of `steps` as `i / steps`, with a message, after each pause."""
    for i in range(1, args.steps + 1):
        await asyncio.sleep(args.pause_s)
        await report_progress(job, i / args.steps, f"step {i} of {args.steps}")
    return args.steps


@handler(PROGRESSING_SYNC, args=ProgressArgs)
def progressing_sync(args: ProgressArgs, job: JobContext) -> int:
    """`progressing`, in the thread pool."""
    for i in range(1, args.steps + 1):
        job.cancelled.wait(args.pause_s)
        report_progress_from_thread(job, i / args.steps, f"step {i} of {args.steps}")
    return args.steps
