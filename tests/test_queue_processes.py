"""Limits across real `python -m jobq worker` processes: a per-key limit held by three
processes claiming at once, and a global and per-key limit held through the SIGKILL of one
process and the rescue of its jobs.

The handler (`recorded`, `tests/toolkit/handlers.py`, with the queues of
`tests/proc_queue_handlers.py`) records each execution's start and end in `execution`;
the limits are checked on those intervals: a killed process's executions end at the kill.
"""

from __future__ import annotations

import signal
from collections import defaultdict
from collections.abc import AsyncIterator
from datetime import datetime, timedelta

import pytest

from jobq import clock
from jobq.db import Connection
from jobq.queue import Job, enqueue_many
from tests import claim_log
from tests.claim_log import max_overlap
from tests.test_processes import WORKER_ENV, executions
from tests.toolkit.handlers import JOB_TYPE
from tests.toolkit.procs import Proc, Procs, eventually, registered

__all__ = ["executions"]  # the fixture of the process tests

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

QUEUE_ENV = {
    **WORKER_ENV,
    "JOBQ_JOB_MODULES": "tests.proc_queue_handlers",
    "JOBQ_MAX_CONCURRENT_JOBS": "4",
}
WAIT_S = 120.0


async def start_workers(manager: Procs, conn: Connection, num: int) -> list[Proc]:
    procs = [manager.start("worker", f"worker-{n}", QUEUE_ENV) for n in range(num)]
    for proc in procs:
        await registered(conn, proc)
    return procs


async def enqueue_sleeps(
    queue: str, keys: list[str], per_key: int, seconds: float, batch: int = 0
) -> None:
    """Enqueue `per_key` jobs of each key that sleep `seconds`; each `batch` (0, 1, ...) numbers
    its jobs apart from the others' (no duplicate)."""
    await enqueue_many(
        Job(
            job_type=JOB_TYPE,
            arguments={"n": (batch * len(keys) + k) * per_key + n, "sleep_s": seconds},
            queue=queue,
            concurrency_key=key,
        )
        for k, key in enumerate(keys)
        for n in range(per_key)
    )


async def all_finished(conn: Connection, num_jobs: int, procs: tuple[Proc, ...]) -> None:
    async def done() -> bool:
        count: int = await conn.fetchval(
            "SELECT count(DISTINCT job_id) FROM execution WHERE finished_at IS NOT NULL"
        )
        return count == num_jobs

    await eventually(done, within=WAIT_S, what=f"{num_jobs} jobs to finish", running=procs)


async def intervals(
    conn: Connection, *, killed_pid: int | None = None, killed_at: datetime | None = None
) -> list[tuple[str, datetime, datetime]]:
    """Every execution as (its job's key, start, end); an unfinished one of the killed process
    ends at the kill (none of a live process may be unfinished)."""
    rows = await conn.fetch(
        "SELECT e.*, (SELECT min(c.concurrency_key) FROM test_claim AS c"
        "             WHERE c.job_id = e.job_id) AS key"
        " FROM execution AS e ORDER BY e.id"
    )
    spans = []
    for r in rows:
        end = r["finished_at"]
        if end is None:
            assert r["pid"] == killed_pid, f"an execution of a live worker never finished: {r}"
            assert killed_at is not None
            end = killed_at
        spans.append((r["key"], r["started_at"], end))
    return spans


def peaks(spans: list[tuple[str, datetime, datetime]]) -> tuple[int, dict[str, int]]:
    """The most executions running at once: in all, and per key."""
    by_key: dict[str, list[tuple[datetime, datetime]]] = defaultdict(list)
    for key, start, end in spans:
        by_key[key].append((start, end))
    overall = max_overlap((start, end) for _, start, end in spans)
    return overall, {key: max_overlap(s) for key, s in by_key.items()}


@pytest.fixture
async def journal(executions: Connection) -> AsyncIterator[Connection]:
    """`executions` (the execution table emptied), with every claim journaled too."""
    await claim_log.install(executions)
    yield executions
    await claim_log.uninstall(executions)


async def test_a_per_key_limit_holds_across_three_worker_processes(
    procs: Procs, journal: Connection
) -> None:
    conn = journal
    running = tuple(await start_workers(procs, conn, 3))
    keys = ["a", "b", "c"]
    await enqueue_sleeps("keyed", keys, per_key=8, seconds=0.3)
    await all_finished(conn, 24, running)

    spans = await intervals(conn)
    assert len(spans) == 24  # no job ran twice
    _, per_key = peaks(spans)
    assert set(per_key) == set(keys)
    assert all(n <= 2 for n in per_key.values()), per_key
    assert max(per_key.values()) == 2, per_key  # the limit was reached
    pids = await conn.fetchval("SELECT count(DISTINCT pid) FROM execution")
    assert pids >= 2  # held across processes, not inside one
    assert await conn.fetchval("SELECT count(*) FROM job_dead") == 0


async def test_limits_hold_through_the_sigkill_of_a_worker_and_the_rescue_of_its_jobs(
    procs: Procs, journal: Connection
) -> None:
    """Queue `capped`: at most 3 running at once, 2 per key. One of three worker processes is
    killed while it runs jobs; its jobs are rescued and run elsewhere. At no instant across
    the kill do more than the limits run, and no job is lost. The victim starts alone on a
    first batch; a second one, enqueued once the others are up, leaves work to claim beside
    it and after the kill however long they took to start."""
    conn = journal
    victim = procs.start("worker", "victim", QUEUE_ENV)
    await registered(conn, victim)
    await enqueue_sleeps("capped", ["a", "b"], per_key=7, seconds=1.0)

    async def victim_running() -> bool:
        found: bool = await conn.fetchval(
            "SELECT EXISTS (SELECT FROM execution WHERE pid = $1 AND finished_at IS NULL)",
            victim.pid,
        )
        return found

    await eventually(victim_running, within=WAIT_S, what="the victim to run a job")
    # two more workers, claiming beside the victim (which runs as many as the limit allows)
    others = [procs.start("worker", f"worker-{n}", QUEUE_ENV) for n in range(2)]
    for proc in others:
        await registered(conn, proc)
    await enqueue_sleeps("capped", ["a", "b"], per_key=7, seconds=1.0, batch=1)

    async def victim_midway() -> bool:
        """The victim runs a job that started under half its second ago: the kill, sent at
        once, cuts it short (a job near its end could finish first, and the victim's next
        claim be killed before its handler wrote a start)."""
        found: bool = await conn.fetchval(
            "SELECT EXISTS (SELECT FROM execution WHERE pid = $1 AND finished_at IS NULL"
            " AND started_at > $2)",
            victim.pid,
            clock.now() - timedelta(seconds=0.5),
        )
        return found

    await eventually(victim_midway, within=WAIT_S, what="the victim to start a job")
    killed_at = victim.send(signal.SIGKILL)
    assert await victim.exit_code(within=10) == -signal.SIGKILL
    await all_finished(conn, 28, tuple(others))

    spans = await intervals(conn, killed_pid=victim.pid, killed_at=killed_at)
    overall, per_key = peaks(spans)
    assert overall <= 3, overall
    assert all(n <= 2 for n in per_key.values()), per_key
    assert overall == 3  # the global limit was reached
    cut = await conn.fetch(
        "SELECT job_id FROM execution WHERE pid = $1 AND finished_at IS NULL", victim.pid
    )
    assert cut  # the kill cut executions short; each ran again, to its end, elsewhere
    for r in cut:
        again = await conn.fetch(
            "SELECT pid, attempt FROM execution WHERE job_id = $1 AND finished_at IS NOT NULL",
            r["job_id"],
        )
        assert again
        assert victim.pid not in [x["pid"] for x in again]
    assert await conn.fetchval("SELECT count(*) FROM job WHERE queue = 'capped'") == 0

    async def outcomes_recorded() -> bool:  # a finished job's outcome rides on the next claim
        return bool(await conn.fetchval("SELECT count(*) FROM job_running") == 0)

    await eventually(
        outcomes_recorded, within=WAIT_S, what="the last outcomes", running=tuple(others)
    )
    assert await conn.fetchval("SELECT count(*) FROM job_dead") == 0
