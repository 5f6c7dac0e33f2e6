"""Workflows, batches, sequences and progress across real `python -m jobq worker` processes,
checked against the executions journal the recording handler writes (`execution`): no job
starts before every job it waits for has succeeded, a failed job's dependents never run, a
batch's callback runs exactly once after all its jobs, a sequence's jobs start in enqueue order
and never two at once, and a waiter sees a running job's progress."""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from typing import Any

import pytest

from jobq import clock
from jobq.db import Connection
from jobq.queue import (
    Job,
    Workflow,
    enqueue,
    enqueue_batch,
    enqueue_in_sequence,
    enqueue_workflow,
)
from jobq.queue.control import JobState, watch
from jobq.queue.workflows import WorkflowState, find_workflow
from tests.flow.handlers import PROGRESSING, PROGRESSING_SYNC
from tests.test_processes import WORKER_ENV, executions
from tests.toolkit.handlers import JOB_TYPE
from tests.toolkit.procs import Proc, Procs, eventually, registered

__all__ = ["executions"]  # the fixture of the process tests

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

ENV = WORKER_ENV | {
    "JOBQ_JOB_MODULES": "tests.toolkit.handlers,tests.flow.handlers",
    "JOBQ_PROGRESS_INTERVAL_S": "0.1",
}


def recorded(n: int, sleep_s: float = 0.0, *, fail: bool = False) -> Job:
    """A job of the recording handler; `fail`: its first (and only) attempt fails."""
    return Job(
        job_type=JOB_TYPE,
        arguments={"n": n, "sleep_s": sleep_s, "fail_first": fail},
        max_retries=0 if fail else 3,
    )


async def start_workers(procs: Procs, conn: Connection, count: int, **env: str) -> list[Proc]:
    workers = [procs.start("worker", f"worker-{i}", ENV | env) for i in range(count)]
    for w in workers:
        await registered(conn, w)
    return workers


async def journal(conn: Connection) -> dict[int, list[Any]]:
    """Each job's executions, in order."""
    runs: dict[int, list[Any]] = defaultdict(list)
    for r in await conn.fetch("SELECT * FROM execution ORDER BY id"):
        runs[r["job_id"]].append(r)
    return runs


async def all_ended(conn: Connection, workflow_ids: list[int], workers: list[Proc]) -> None:
    async def ended() -> bool:
        for wf in workflow_ids:
            view = await find_workflow(conn, wf, now=clock.now(), max_steps=0)
            if view.state is WorkflowState.RUNNING:
                return False
        return True

    await eventually(ended, within=90, what="every workflow to end", running=tuple(workers))


async def test_no_job_starts_before_every_job_it_waits_for_succeeded_and_failures_cancel(
    procs: Procs, executions: Connection
) -> None:
    conn = executions
    workers = await start_workers(procs, conn, 3)
    rng = random.Random(30)
    made = []
    for w in range(6):
        flow = Workflow(f"layers-{w}")
        roots = [flow.add(recorded(w * 100 + i, rng.uniform(0, 0.15))) for i in range(4)]
        fan = [
            flow.add(recorded(w * 100 + 10 + i, rng.uniform(0, 0.15)), after=roots[: i + 1])
            for i in range(6)
        ]
        join = flow.add(recorded(w * 100 + 20, 0.05), name="join", after=fan)
        broken = flow.add(
            recorded(w * 100 + 30, 0.05, fail=w % 2 == 0), name="broken", after=[join]
        )
        flow.add(recorded(w * 100 + 40), name="after_broken", after=[broken])
        flow.add(recorded(w * 100 + 50), name="anyway", after=[broken], on_dependency_failure="run")
        made.append(await enqueue_workflow(flow))
    await all_ended(conn, [m.id for m in made if m.id is not None], workers)

    runs = await journal(conn)
    edges = await conn.fetch("SELECT depends_on, job_id, cancels FROM job_dependency")
    outcomes = {r["job_id"]: r["outcome"] for r in await conn.fetch("SELECT * FROM job_flow")}
    started_before = 0
    for e in edges:
        if not runs[e["job_id"]]:
            continue
        first_start = runs[e["job_id"]][0]["started_at"]
        dep_end = max(r["finished_at"] for r in runs[e["depends_on"]])
        if e["cancels"] and (outcomes[e["depends_on"]] != "succeeded" or first_start <= dep_end):
            started_before += 1
        if not e["cancels"] and first_start <= dep_end:
            started_before += 1
    assert started_before == 0
    for i, m in enumerate(made):
        is_broken = i % 2 == 0
        assert outcomes[m["after_broken"]] == ("cancelled" if is_broken else "succeeded")
        assert bool(runs[m["after_broken"]]) is not is_broken  # a cancelled job never ran
        assert outcomes[m["anyway"]] == "succeeded"
    assert all(len(r) <= 1 for r in runs.values())  # nothing ran twice


async def test_a_batch_callback_runs_once_after_its_jobs_that_end_together_on_two_workers(
    procs: Procs, executions: Connection
) -> None:
    conn = executions
    # one slot each: the two jobs of a batch (next to each other in the queue) go to the two
    # workers, and end together
    workers = await start_workers(procs, conn, 2, JOBQ_MAX_CONCURRENT_JOBS="1")
    batches = [
        await enqueue_batch(
            [recorded(b * 10 + i, 0.15) for i in range(2)], callback=recorded(b * 10 + 9)
        )
        for b in range(20)
    ]
    await all_ended(conn, [b.id for b in batches], workers)
    runs = await journal(conn)
    for b in batches:
        assert b.callback_id is not None
        assert len(runs[b.callback_id]) == 1
        last_end = max(runs[j][0]["finished_at"] for j in b.job_ids)
        assert runs[b.callback_id][0]["started_at"] > last_end
    # the pairs did end at once on two workers
    both = sum(len({runs[j][0]["worker_id"] for j in b.job_ids}) == 2 for b in batches)
    assert both > 0


async def test_a_sequence_runs_its_jobs_in_enqueue_order_one_at_a_time_across_workers(
    procs: Procs, executions: Connection
) -> None:
    conn = executions
    workers = await start_workers(procs, conn, 3)

    async def fill(key: str, base: int) -> list[int]:
        return [await enqueue_in_sequence(key, recorded(base + i, 0.02)) for i in range(15)]

    orders = await asyncio.gather(fill("seq:a", 0), fill("seq:b", 100), fill("seq:c", 200))

    async def done() -> bool:
        ended = await conn.fetchval("SELECT count(*) FROM execution WHERE finished_at IS NOT NULL")
        return bool(ended == 45)

    await eventually(done, within=90, what="45 jobs to run", running=tuple(workers))
    runs = await journal(conn)
    for order in orders:
        starts = [runs[job_id][0]["started_at"] for job_id in order]
        ends = [runs[job_id][0]["finished_at"] for job_id in order]
        assert starts == sorted(starts)  # in enqueue order
        assert all(ends[i] < starts[i + 1] for i in range(len(order) - 1))  # one at a time
    # other keys were not held back: the sequences overlapped in time
    first_ends = [runs[o[0]][0]["finished_at"] for o in orders]
    last_starts = [runs[o[-1]][0]["started_at"] for o in orders]
    assert max(first_ends) < min(last_starts)


@pytest.mark.parametrize("job_type", [PROGRESSING, PROGRESSING_SYNC], ids=["async", "thread"])
async def test_a_waiter_sees_the_progress_a_running_job_reports(
    procs: Procs, executions: Connection, job_type: str
) -> None:
    conn = executions
    await start_workers(procs, conn, 1)
    made = await enqueue(Job(job_type=job_type, arguments={"steps": 4}))
    seen: list[tuple[float | None, str | None]] = []
    last = None
    async for view in watch(made.id, 30):
        if view.state is JobState.RUNNING and view.progress is not None:
            seen.append((view.progress, view.progress_message))
        last = view
    assert last is not None
    assert last.state is JobState.SUCCEEDED
    assert last.result == 4
    assert any(0 < fraction < 1 for fraction, _ in seen if fraction is not None), seen
    assert all(message is not None and message.startswith("step ") for _, message in seen)
