"""Schedules across real `python -m jobq worker` processes started together: each declares the
same five every-second schedules, and all of them run the scheduler; every occurrence makes
one job, run once, and no second is skipped."""

from __future__ import annotations

import asyncio
import signal

import pytest

from jobq.db import Connection
from tests.test_processes import WORKER_ENV, executions
from tests.toolkit.procs import Procs, eventually, registered

__all__ = ["executions"]  # the fixture of the process tests

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

ENV = {**WORKER_ENV, "JOBQ_JOB_MODULES": "tests.proc_schedule_handlers"}
SCHEDULES = 5
"""As many as `tests/proc_schedule_handlers.py` declares (not imported here: importing it would
register its handler and schedules in this process's registry)."""


async def test_workers_started_together_make_one_job_per_occurrence(
    procs: Procs, executions: Connection
) -> None:
    conn = executions
    workers = [procs.start("worker", f"worker-{n}", ENV) for n in range(3)]
    for worker in workers:
        await registered(conn, worker)

    async def ran_for_a_while() -> bool:
        seconds: int = await conn.fetchval(
            "SELECT count(DISTINCT o.at) FROM execution AS e"
            " JOIN job_occurrence AS o ON o.job_id = e.job_id"
        )
        return seconds >= 4

    await eventually(
        ran_for_a_while, within=60, what="4 seconds of occurrences", running=tuple(workers)
    )
    for worker in workers:
        worker.send(signal.SIGTERM)
    assert [await w.exit_code(within=15) for w in workers] == [0, 0, 0]
    await asyncio.sleep(0)
    # one job per occurrence: job_occurrence's key is (schedule, at); no other job was made
    made = await conn.fetchrow(
        "SELECT (SELECT count(*) FROM job_occurrence) AS occurrences,"
        " (SELECT count(*) FROM job_state WHERE job_type = 'recorded') AS jobs"
    )
    assert made is not None
    assert made["occurrences"] == made["jobs"] > 0
    # every second of each schedule, from its first occurrence to its last, has one
    gaps = await conn.fetch(
        "SELECT schedule, count(*) AS n, extract(epoch FROM max(at) - min(at))::int + 1 AS span"
        " FROM job_occurrence GROUP BY schedule"
    )
    assert len(gaps) == SCHEDULES
    assert all(r["n"] == r["span"] for r in gaps), [dict(r) for r in gaps]
    # each occurrence that ran, ran once (no kill here: no second run)
    twice = await conn.fetchval(
        "SELECT count(*) FROM"
        " (SELECT job_id FROM execution GROUP BY job_id HAVING count(*) > 1) AS t"
    )
    assert twice == 0
