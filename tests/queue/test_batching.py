"""Outcomes are recorded in batches: jobs that end together are recorded by one statement, the
next claim carries the outcomes that wait, and a crash before the batch commits re-runs the
job rather than losing it."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel

from jobq.db import Connection
from jobq.errors import DontRetry
from jobq.queue import Job, JobContext, Registry, enqueue_many
from tests.queue.conftest import NewWorker
from tests.queue.helpers import MakeWorker, count, counts, where
from tests.toolkit.procs import eventually


class Args(BaseModel):
    n: int


async def xmins(conn: Connection, table: str) -> set[str]:
    """The transactions (xmin) that wrote the rows of `table`: one statement, one xmin."""
    rows = await conn.fetch(f"SELECT xmin::text AS x FROM {table}")
    return {r["x"] for r in rows}


async def test_jobs_ending_together_are_recorded_by_one_statement(
    conn: Connection, make_worker: MakeWorker
) -> None:
    release = asyncio.Event()
    entered = 0
    handlers = Registry()

    @handlers.handler("ends", args=Args)
    async def ends(args: Args, job: JobContext) -> None:
        nonlocal entered
        entered += 1
        await release.wait()
        if args.n % 3 == 0:
            return
        if args.n % 3 == 1:
            raise RuntimeError("retry me")
        raise DontRetry("bury me")

    await enqueue_many(Job(job_type="ends", arguments={"n": n}) for n in range(12))
    worker = await make_worker(handlers, max_concurrent_jobs=12)
    assert await worker.run_once() == 12
    await eventually(lambda: entered == 12)
    release.set()
    await worker.wait_idle()
    assert await counts(conn) == {"job": 4, "job_running": 0, "job_dead": 4}
    assert worker.counts["completed"] == 4
    retried, buried = await xmins(conn, "job"), await xmins(conn, "job_dead")
    assert len(retried) == 1
    assert retried == buried  # re-queues and burials of the batch: one transaction
    attempts = await conn.fetch("SELECT attempts, last_error FROM job")
    assert {(r["attempts"], r["last_error"]) for r in attempts} == {(1, "RuntimeError: retry me")}


async def test_the_next_claim_carries_the_outcomes(
    claims: Connection, new_worker: NewWorker
) -> None:
    """Failed jobs free their slots: the claim that fills them records their re-queue in the same
    transaction as it moves the next jobs to `job_running`. The claims' transactions are read
    from their journal (`claims`), which nothing rewrites: the heartbeat's lease extensions
    rewrite the rows of `job_running`, and with them their xmin."""
    conn = claims
    hold = asyncio.Event()
    held = 0
    handlers = Registry()

    @handlers.handler("fails", args=Args)
    async def fails(args: Args, job: JobContext) -> None:
        raise RuntimeError("once")

    @handlers.handler("holds", args=Args)
    async def holds(args: Args, job: JobContext) -> None:
        nonlocal held
        held += 1
        await hold.wait()

    await enqueue_many(Job(job_type="fails", arguments={"n": n}, priority=1) for n in range(4))
    await enqueue_many(Job(job_type="holds", arguments={"n": n}) for n in range(4))
    worker = new_worker(handlers, max_concurrent_jobs=4)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        await eventually(lambda: held == 4)
        assert await count(conn, "job") == 4  # the failed ones, back with a backoff
        held_claims = await conn.fetch(
            "SELECT xmin::text AS x FROM test_claim WHERE job_id IN (SELECT id FROM job_running)"
        )
        assert await xmins(conn, "job") == {r["x"] for r in held_claims}
    finally:
        hold.set()
        stop.set()
        await task
    assert worker.counts["retried"] == 4
    assert worker.counts["completed"] == 4


async def test_a_crash_before_the_ack_reruns_the_job(
    conn: Connection, make_worker: MakeWorker
) -> None:
    """The handler returned but its worker died before the batch with its outcome committed: the
    job is still in `job_running`, the rescue returns it, and it runs again. The dead worker's
    late outcome is then rejected by the fencing token."""
    runs: list[int] = []
    handlers = Registry()

    @handlers.handler("once", args=Args)
    async def once(args: Args, job: JobContext) -> None:
        runs.append(job.worker_id)

    (job_id,) = await enqueue_many([Job(job_type="once", arguments={"n": 1})])
    doomed = await make_worker(handlers)
    doomed.completer.defer()  # as under `run()`: the outcome waits for the next claim
    assert await doomed.run_once() == 1
    # its handler has returned, and its outcome waits: the slot is still held
    await eventually(lambda: doomed.running == 0 and len(doomed.slots.tokens) == 1)
    assert await where(conn, job_id) == ["job_running"]
    # The process dies: its listener session (and liveness lock) goes, no heartbeat follows.
    listener = doomed.listener.conn
    assert listener is not None
    await conn.fetchval("SELECT pg_terminate_backend($1, 5000)", listener.get_server_pid())
    await eventually(lambda: not doomed.alive)

    rescuer = await make_worker(handlers)
    await eventually(rescuer.rescue, within=10)  # once the doomed one's heartbeat is stale
    assert await where(conn, job_id) == ["job"]
    assert await rescuer.run_once() == 1
    await rescuer.wait_idle()
    assert runs == [doomed.id, rescuer.id]
    assert await where(conn, job_id) == []

    await doomed.completer.flush()
    assert doomed.counts["rejected"] == 1
    assert doomed.counts["completed"] == 0
