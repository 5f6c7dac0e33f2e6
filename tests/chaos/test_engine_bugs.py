"""Small, deterministic reproductions of the engine bugs the chaos scenarios found, kept as
regression tests (each failed before its fix). They run in-process, on the suite's own
PostgreSQL (the second one restarts it), in a second or two each.

- repeated_sigkill: the rescue re-queued a job ripe at its own `now`, behind every job that
  ripened since, so under a backlog a killed worker's job waited for the whole backlog
  (kill -> re-claim p50 ~25 s, max ~50 s, while kill -> rescue was <= 0.4 s).
- database_restart: right after a restart of the server, a rescue found every other worker
  without its liveness lock (not reconnected yet), without a session, and with a heartbeat
  older than its grace (none could be written during the outage), judged them dead and handed
  their running jobs out again (~75-95 jobs ran twice per run, an attempt charged each).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta

import pytest
from pydantic import BaseModel

from jobq import clock, db
from jobq.db import Database
from jobq.queue import Job, JobContext, Registry, Worker, enqueue, store
from tests.chaos.server import PostgresInstance

pytestmark = pytest.mark.chaos

MakeWorker = Callable[..., Awaitable[Worker]]


class NoArgs(BaseModel):
    n: int = 0


def blocking(release: asyncio.Event) -> Registry:
    handlers = Registry()

    @handlers.handler("bug.block", args=NoArgs)
    async def block(args: NoArgs, job: JobContext) -> None:
        await release.wait()

    return handlers


async def test_a_rescued_job_keeps_its_place_in_the_queue(
    database: Database, make_worker: MakeWorker
) -> None:
    release = asyncio.Event()
    worker = await make_worker(blocking(release), max_concurrent_jobs=1)
    now = clock.now()
    first = await enqueue(
        Job(job_type="bug.block", arguments={"n": 0}).runs_at(now - timedelta(minutes=10))
    )
    assert await worker.run_once() == 1  # the oldest job: now running
    for n in range(1, 6):  # a backlog that ripened after it
        await enqueue(
            Job(job_type="bug.block", arguments={"n": n}).runs_at(now - timedelta(minutes=1))
        )
    async with database.pool.acquire() as conn:
        # The worker dies: its liveness lock and its process's sessions are gone (a test cannot
        # end its own process, so its row is pointed at a pid with no session).
        await conn.execute("UPDATE worker SET pid = 0 WHERE id = $1", worker.id)
        listener = worker._listener
        assert listener is not None
        await listener.close()
        assert await store.rescue(conn, now=clock.now(), heartbeat_grace=timedelta(0)) == 1
        (next_up,) = await store.claim(
            conn, worker_id=0, max_jobs=1, now=clock.now(), lease_expires_at=clock.now()
        )
    release.set()
    assert next_up.id == first.id, "the rescued job lost its place to jobs that ripened later"


async def test_a_database_restart_does_not_make_live_workers_look_dead(
    database: Database, make_worker: MakeWorker, postgres: PostgresInstance
) -> None:
    release = asyncio.Event()
    a = await make_worker(blocking(release))
    b = await make_worker(Registry())
    await enqueue(Job(job_type="bug.block"))
    assert await a.run_once() == 1
    grace = b.settings.heartbeat_interval * 3
    await asyncio.to_thread(postgres.stop, "fast")
    await asyncio.sleep(grace.total_seconds() + 0.5)  # an outage a little longer than the grace
    await asyncio.to_thread(postgres.start)
    try:
        rescued = await b.rescue()  # the first rescue after the restart
        async with database.pool.acquire() as conn:
            holder = await conn.fetchval("SELECT worker_id FROM job_running")
    finally:
        release.set()
        db.bind(database)
    assert rescued == 0, "a live worker's running job was rescued after a database restart"
    assert holder == a.id
