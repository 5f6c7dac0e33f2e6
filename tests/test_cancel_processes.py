"""Cancel across processes: a job running in a real `python -m jobq worker` process, cancelled
from this one, hears of it by the worker's notification: an async handler is cancelled, a
synchronous one sees `JobContext.cancelled` and returns; either way the job ends cancelled and
never runs again."""

from __future__ import annotations

import pytest

from jobq import clock
from jobq.db import Connection
from jobq.queue import Job, enqueue
from jobq.queue.control import JobState, cancel, find
from tests.test_processes import WORKER_ENV, executions
from tests.toolkit.handlers import JOB_TYPE, SYNC_JOB_TYPE
from tests.toolkit.procs import Procs, eventually, registered

__all__ = ["executions"]  # the fixture of the process tests

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.mark.parametrize("job_type", [JOB_TYPE, SYNC_JOB_TYPE], ids=["async", "thread"])
async def test_a_job_running_in_a_worker_process_is_cancelled_within_seconds(
    procs: Procs, executions: Connection, job_type: str
) -> None:
    conn = executions
    worker = procs.start("worker", "worker", WORKER_ENV)
    await registered(conn, worker)
    job = await enqueue(Job(job_type=job_type, arguments={"sleep_s": 60}, max_retries=3))

    async def started() -> bool:
        found: bool = await conn.fetchval(
            "SELECT EXISTS (SELECT FROM execution WHERE job_id = $1)", job.id
        )
        return found

    await eventually(started, within=30, what="the job to start", running=(worker,))
    assert (await cancel(conn, job.id, now=clock.now(), retain=True)).state is JobState.RUNNING

    async def ended() -> JobState | None:
        found = await find(conn, job.id, now=clock.now())
        assert found is not None
        return found.state if found.state.finished else None

    # far sooner than its 60 s: the worker heard the cancel
    assert await eventually(ended, within=10, running=(worker,)) is JobState.CANCELLED
    rows = await conn.fetch("SELECT finished_at FROM execution WHERE job_id = $1", job.id)
    assert len(rows) == 1  # it never ran again
    if job_type == SYNC_JOB_TYPE:
        assert rows[0]["finished_at"] is not None  # it saw the flag and returned
    else:
        assert rows[0]["finished_at"] is None  # cancelled in its sleep
    assert worker.popen.poll() is None  # the worker lives on
