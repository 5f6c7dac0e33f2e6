"""The workflow benchmarks' own handler, imported by their worker processes beside
`bench.handlers` (`JOBQ_JOB_MODULES=bench.handlers,bench.flow_handlers`).

- `bench_chain` is `bench_stamp` that also enqueues its successor (`seq + 1`, until `steps`),
  in the transaction that records its stamp: a chain made the way one is made without
  workflows, the reference of `workflow_chain`.
"""

from __future__ import annotations

import time

from pydantic import BaseModel

from jobq.db import transaction
from jobq.queue import Job, JobContext, enqueue, handler

CHAIN = "bench_chain"


class ChainArgs(BaseModel):
    """`seq`: the step's number (from 0); `steps`: the chain's length."""

    seq: int
    steps: int


@handler(CHAIN, args=ChainArgs)
async def bench_chain(args: ChainArgs, job: JobContext) -> None:
    """Record when this handler started (wall clock) in `bench_event`, and enqueue the next
    step."""
    started_s = time.time()
    async with transaction() as conn:
        await conn.execute(
            "INSERT INTO bench_event (job_id, seq, started_s) VALUES ($1, $2, $3)",
            job.id,
            args.seq,
            started_s,
        )
        if args.seq + 1 < args.steps:
            await enqueue(Job(job_type=CHAIN, arguments={"seq": args.seq + 1, "steps": args.steps}))
