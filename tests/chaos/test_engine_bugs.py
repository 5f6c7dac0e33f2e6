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
from jobq.db import Connection, Database
from jobq.queue import Job, JobContext, Registry, Worker, enqueue, enqueue_many, store
from tests import outcomes
from tests.chaos import journal
from tests.toolkit.postgres import PostgresInstance

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
        listener = worker.listener.conn
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


async def test_a_job_claimed_twice_by_one_worker_at_one_attempt_is_not_lost(
    chaos_conn: Connection,
) -> None:
    """The suite's own bookkeeping: a claim whose answer was lost is released with no attempt
    charged, and the same worker may claim the job again at the same attempt. Its execution
    belongs to that second claim, which completed it: the job was not lost (a full run once
    reported 3 such jobs as lost)."""
    conn = chaos_conn
    (job_id,) = await enqueue_many([Job(job_type="recorded", arguments={"n": 1})])
    now = clock.now()
    lease = now + timedelta(seconds=30)
    await store.claim(conn, worker_id=7, max_jobs=1, now=now, lease_expires_at=lease)
    assert await store.release_orphans(conn, worker_id=7, held=[], now=clock.now()) == 1
    (again,) = await store.claim(
        conn, worker_id=7, max_jobs=1, now=clock.now(), lease_expires_at=lease
    )
    await conn.execute(
        "INSERT INTO execution (job_id, attempt, worker_id, pid, started_at, finished_at,"
        " outcome) VALUES ($1, 1, 7, 0, $2, $2, 'ok')",
        job_id,
        clock.now(),
    )
    assert await outcomes.complete(conn, [again.token]) == 1
    analysis = await journal.Analysis.load(conn, {job_id})
    assert analysis.ends() == {"complete": 1, "release": 1}
    assert analysis.orphan_executions == []
    assert analysis.lost() == []
