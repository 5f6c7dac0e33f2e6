"""Real processes: `python -m jobq worker` and `python -m jobq serve` as subprocesses.

- `kill -9` of a worker loses no job, and another worker re-runs it within seconds
  (guarantees 2, 3 and 4);
- SIGTERM and SIGINT stop a worker gracefully: running jobs drain, or past the drain timeout
  go back to the queue without charging an attempt (guarantee 7);
- `serve` (what `make run` does) delivers a reminder to a real webhook receiver, signed and on
  time, and stops with exit code 0;
- at `serve`'s SIGTERM a long poll (`?wait=`) answers at once with the job as it is.

The subprocesses (`tests.toolkit.procs.Procs`) get every setting in their environment
(`DATABASE_URL` of the session's test database, fast timers), never from a `.env`; their jobs are
the toolkit's recording handler's (`tests.toolkit.handlers`). Their output goes to a file that is
printed at teardown (shown when a test fails). Waits poll the database with a deadline.
"""

from __future__ import annotations

import asyncio
import signal
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from jobq.db import Connection, Database
from jobq.queue import Enqueued, Job, enqueue
from jobq.queue.sql import WORKER_LOCK_CLASS
from tests.api.conftest import ADMIN, ADMIN_TOKEN
from tests.toolkit.handlers import EXECUTION_TABLE, JOB_TYPE
from tests.toolkit.procs import (
    WEBHOOK_SECRET,
    Proc,
    Procs,
    check_running,
    eventually,
    in_log,
    registered,
)
from tests.toolkit.receiver import WebhookReceiver, assert_reminder_delivery

pytestmark = pytest.mark.slow

WORKER_ENV = {
    "JOBQ_POLL_INTERVAL_S": "0.5",
    "JOBQ_RESCUE_INTERVAL_S": "0.2",
    "JOBQ_HEARTBEAT_INTERVAL_S": "0.5",
    "JOBQ_LEASE_S": "10",
    "JOBQ_DRAIN_TIMEOUT_S": "5",
    "JOBQ_LOG_LEVEL": "INFO",
    "JOBQ_JOB_MODULES": "tests.toolkit.handlers",
}

# -- the database -----------------------------------------------------------------------------


@pytest.fixture
async def executions(database: Database, conn: Connection) -> Connection:
    """`conn`, with an empty `execution` table."""
    await conn.execute(EXECUTION_TABLE)
    await conn.execute("TRUNCATE execution RESTART IDENTITY")
    return conn


async def enqueue_sleep(seconds: float, n: int = 0) -> Enqueued:
    """Enqueue a `recorded` job from the test process (committed on return) that sleeps
    `seconds` on its first execution only."""
    arguments = {"n": n, "sleep_s": seconds, "resleep_s": 0}
    result = await enqueue(Job(job_type=JOB_TYPE, arguments=arguments, max_retries=3))
    assert not result.duplicate
    return result


async def places(conn: Connection, job_id: int) -> int:
    """In how many of `job`, `job_running`, `job_dead` the job is (one snapshot)."""
    count: int = await conn.fetchval(
        "SELECT (SELECT count(*) FROM job WHERE id = $1)"
        " + (SELECT count(*) FROM job_running WHERE id = $1)"
        " + (SELECT count(*) FROM job_dead WHERE id = $1)",
        job_id,
    )
    return count


async def execution_rows(conn: Connection, job_id: int) -> list[asyncpg.Record]:
    return await conn.fetch("SELECT * FROM execution WHERE job_id = $1 ORDER BY id", job_id)


async def started_in(conn: Connection, job_id: int, proc: Proc) -> asyncpg.Record | None:
    return await conn.fetchrow(
        "SELECT * FROM execution WHERE job_id = $1 AND pid = $2", job_id, proc.pid
    )


async def finished(conn: Connection, job_id: int, proc: Proc) -> asyncpg.Record | None:
    return await conn.fetchrow(
        "SELECT * FROM execution WHERE job_id = $1 AND pid = $2 AND finished_at IS NOT NULL",
        job_id,
        proc.pid,
    )


# -- workers ----------------------------------------------------------------------------------


async def test_kill_9_loses_no_job_and_another_worker_reruns_it_within_seconds(
    procs: Procs, executions: Connection
) -> None:
    conn = executions
    a = procs.start("worker", "worker-a", WORKER_ENV)
    a_id = await registered(conn, a)
    job = await enqueue_sleep(30)
    first = await eventually(
        lambda: started_in(conn, job.id, a), within=5, what="A to start the job", running=(a,)
    )
    assert (first["attempt"], first["worker_id"]) == (1, a_id)

    b = procs.start("worker", "worker-b", WORKER_ENV)
    b_id = await registered(conn, b)
    # Guarantee 3: while A lives, B's rescue rounds (every 0.2 s) leave A's job alone.
    await asyncio.sleep(1.0)
    assert await conn.fetchval("SELECT worker_id FROM job_running WHERE id = $1", job.id) == a_id
    assert len(await execution_rows(conn, job.id)) == 1

    killed_at = datetime.now(UTC)
    a.popen.send_signal(signal.SIGKILL)
    assert await a.exit_code(within=5) == -signal.SIGKILL

    # Guarantee 2: at every instant the job is in exactly one place, until B completes it.
    deadline = time.monotonic() + 8
    while (where := await places(conn, job.id)) == 1:
        check_running((b,))
        assert time.monotonic() < deadline, "the job of the killed worker was not re-run"
        await asyncio.sleep(0.01)
    assert where == 0, f"the job is in {where} places at once"

    rows = await execution_rows(conn, job.id)
    assert len(rows) == 2, f"the job left the queue after {len(rows)} execution(s): lost"
    first, second = rows
    assert (first["pid"], first["attempt"], first["finished_at"]) == (a.pid, 1, None)
    # Rescued with attempts 1, then claimed by B: its second attempt, run to completion.
    assert (second["pid"], second["worker_id"], second["attempt"]) == (b.pid, b_id, 2)
    assert second["finished_at"] is not None
    assert await conn.fetchval("SELECT count(*) FROM worker WHERE id = $1", a_id) == 0

    rescue_s = (second["started_at"] - killed_at).total_seconds()
    print(f"rescue time (kill -9 of A -> B starts the job): {rescue_s:.3f} s (lease: 10 s)")
    # Guarantee 4: far below the 10 s lease. Liveness is A's advisory lock, dropped with its
    # session, not the lease.
    assert 0 < rescue_s < 5


async def test_an_idle_worker_that_does_not_lead_holds_two_connections(
    procs: Procs, executions: Connection
) -> None:
    # its listener, and its pool's floor of one (the heartbeats', and the session that keeps its
    # jobs while the listener alone reconnects); more only when its handlers need them (the
    # leader's upkeep uses its pool too)
    conn = executions
    workers = [procs.start("worker", f"worker{k}", WORKER_ENV) for k in range(2)]
    ids = [await registered(conn, worker) for worker in workers]
    beat = await conn.fetchval("SELECT max(heartbeat_at) FROM worker")

    async def led_and_beaten_twice() -> bool:
        row = await conn.fetchrow(
            "SELECT min(heartbeat_at) AS beat, (SELECT worker_id FROM job_leader) AS leader"
            " FROM worker"
        )
        assert row is not None
        return row["leader"] in ids and (row["beat"] - beat).total_seconds() >= 2 * 0.5

    await eventually(led_and_beaten_twice, within=10, what="a leader", running=tuple(workers))
    leader = await conn.fetchval("SELECT worker_id FROM job_leader")
    follower = workers[1 - ids.index(leader)]
    sessions = await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE $1",
        f"jobq/{follower.pid}@%",
    )
    assert sessions == 2
    check_running(tuple(workers))


async def test_a_worker_whose_listener_alone_drops_keeps_the_job_it_runs(
    procs: Procs, executions: Connection
) -> None:
    # Guarantee 3. While its listener reconnects, a worker counts as alive through another
    # session of its process (`sql._ALIVE`); its pool's floor is that session, even when its
    # handler uses no connection (`bench_sleep`). The leader, another worker, rescues meanwhile.
    conn = executions
    leader = procs.start(
        "worker",
        "leader",
        {
            **WORKER_ENV,
            "JOBQ_JOB_MODULES": "tests.proc_metrics_handlers",
            "JOBQ_QUEUES": "metrics:1",
        },
    )
    leader_id = await registered(conn, leader)

    async def leads() -> bool:
        return bool(await conn.fetchval("SELECT worker_id FROM job_leader") == leader_id)

    await eventually(leads, within=10, what="the leader", running=(leader,))
    runner = procs.start("worker", "runner", {**WORKER_ENV, "JOBQ_JOB_MODULES": "bench.handlers"})
    runner_id = await registered(conn, runner)
    job = await enqueue(Job(job_type="bench_sleep", arguments={"seconds": 4}))

    async def claimed() -> int | None:
        token: int | None = await conn.fetchval(
            "SELECT token FROM job_running WHERE id = $1 AND worker_id = $2", job.id, runner_id
        )
        return token

    token = await eventually(claimed, within=10, what="the claim", running=(leader, runner))
    kills = 0
    deadline = time.monotonic() + 2  # ten of the leader's rescue rounds (0.2 s)
    while time.monotonic() < deadline:  # its listener killed again as soon as it is back
        kills += await conn.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = 'advisory'"
            " AND granted AND classid = $1 AND objsubid = 2 AND objid = $2"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            WORKER_LOCK_CLASS,
            runner_id,
        )
        assert await claimed() == token
        await asyncio.sleep(0.01)
    assert kills >= 2

    async def ended() -> bool:
        return await places(conn, job.id) == 0

    await eventually(ended, within=10, what="the job's end", running=(runner,))
    assert await conn.fetchval("SELECT attempts FROM job_done WHERE id = $1", job.id) == 1


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
async def test_stop_signal_drains_the_running_job_and_exits_0(
    procs: Procs, executions: Connection, stop_signal: signal.Signals
) -> None:
    conn = executions
    worker = procs.start("worker", "worker", {**WORKER_ENV, "JOBQ_DRAIN_TIMEOUT_S": "10"})
    worker_id = await registered(conn, worker)
    job = await enqueue_sleep(1)
    await eventually(
        lambda: started_in(conn, job.id, worker),
        within=5,
        what="the worker to start the job",
        running=(worker,),
    )

    worker.popen.send_signal(stop_signal)
    await in_log(worker, "draining", within=5)  # the stop has begun
    # Claiming has stopped: a job enqueued during the drain stays queued.
    late = await enqueue_sleep(0, n=1)
    assert await worker.exit_code(within=10) == 0

    (execution,) = await execution_rows(conn, job.id)
    assert execution["finished_at"] is not None
    assert await places(conn, job.id) == 0  # completed: gone from job and job_running
    assert await conn.fetchval("SELECT attempts FROM job WHERE id = $1", late.id) == 0
    assert await execution_rows(conn, late.id) == []
    assert await conn.fetchval("SELECT count(*) FROM worker WHERE id = $1", worker_id) == 0


async def test_stop_past_the_drain_timeout_requeues_the_job_uncharged(
    procs: Procs, executions: Connection
) -> None:
    conn = executions
    a = procs.start("worker", "worker-a", {**WORKER_ENV, "JOBQ_DRAIN_TIMEOUT_S": "1"})
    a_id = await registered(conn, a)
    job = await enqueue_sleep(30)
    await eventually(
        lambda: started_in(conn, job.id, a), within=5, what="A to start the job", running=(a,)
    )

    stopping_at = time.monotonic()
    a.popen.send_signal(signal.SIGTERM)
    assert await a.exit_code(within=1 + 3) == 0
    print(f"stop with a 1 s drain timeout took {time.monotonic() - stopping_at:.2f} s")

    queued = await conn.fetchrow("SELECT attempts, ripe_at FROM job WHERE id = $1", job.id)
    assert queued is not None, "the cancelled job is not back in the queue"
    assert queued["attempts"] == 0  # a release charges no attempt
    assert await places(conn, job.id) == 1
    (execution,) = await execution_rows(conn, job.id)
    assert execution["finished_at"] is None  # cancelled, not finished
    assert await conn.fetchval("SELECT count(*) FROM worker WHERE id = $1", a_id) == 0

    b = procs.start("worker", "worker-b", WORKER_ENV)
    await registered(conn, b)
    await eventually(
        lambda: finished(conn, job.id, b), within=5, what="B to run the job", running=(b,)
    )

    async def completed() -> bool:
        return await places(conn, job.id) == 0

    await eventually(completed, within=5, what="the job's completion to be recorded")
    first, second = await execution_rows(conn, job.id)
    assert (first["pid"], second["pid"]) == (a.pid, b.pid)
    assert (first["attempt"], second["attempt"]) == (1, 1)


# -- the server -------------------------------------------------------------------------------


async def test_serve_delivers_a_reminder_to_a_webhook_on_time_and_stops_on_sigterm(
    procs: Procs, database: Database, receiver: WebhookReceiver
) -> None:
    server, port = await procs.serve(
        "server",
        {
            "JOBQ_RUN_WORKERS": "true",
            "JOBQ_LOG_LEVEL": "INFO",
            "JOBQ_WEBHOOK_ALLOW_PRIVATE": "true",  # the receiver listens on 127.0.0.1
        },
    )
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
        response = await http.post(
            "/users",
            json={
                "name": "Proc",
                "email": "proc@example.com",
                "webhook_url": f"http://127.0.0.1:{receiver.port}/hook",
            },
        )
        assert response.status_code == 201, response.text
        user: dict[str, Any] = response.json()
        auth = {"Authorization": f"Bearer {user['api_key']}"}
        response = await http.post(
            f"/users/{user['id']}/reminders",
            json={"message": "stand up", "remind_in_seconds": 2},
            headers=auth,
        )
        assert response.status_code == 201, response.text
        reminder: dict[str, Any] = response.json()
        remind_at = datetime.fromisoformat(reminder["remind_at"])

        (delivery,) = await asyncio.wait_for(receiver.wait_for(1), timeout=2 + 5)
        lateness_s = (delivery.received_at - remind_at).total_seconds()
        print(f"webhook lateness (receipt - remind_at): {lateness_s * 1000:.1f} ms")
        assert_reminder_delivery(
            delivery,
            secret=WEBHOOK_SECRET,
            reminder_id=reminder["id"],
            user_id=user["id"],
            message="stand up",
            remind_at=remind_at,
        )
        assert 0 <= lateness_s < 2.5

        async def sent() -> bool:
            answer = (await http.get(f"/reminders/{reminder['id']}", headers=auth)).json()
            return bool(answer["status"] == "sent")

        await eventually(sent, within=5, what="the reminder to be marked sent", running=(server,))
        assert len(receiver.requests) == 1

    server.popen.send_signal(signal.SIGTERM)
    assert await server.exit_code(within=15) == 0


async def test_a_long_poll_answers_with_the_job_as_it_is_when_serve_stops(
    procs: Procs, database: Database
) -> None:
    """SIGTERM while `GET /jobs/<id>?wait=60` waits on a job that will not end: the wait ends
    at once with the job as it is (200, `scheduled`), not at the drain timeout's cut."""
    server, port = await procs.serve(
        "server",
        {
            "JOBQ_RUN_WORKERS": "false",
            "JOBQ_ADMIN_TOKEN": ADMIN_TOKEN,
            "JOBQ_DRAIN_TIMEOUT_S": "30",
            "JOBQ_LOG_LEVEL": "INFO",
        },
    )
    later = datetime.now(UTC) + timedelta(hours=1)
    job = await enqueue(Job(job_type=JOB_TYPE, arguments={"n": 1}, ripe_at=later))
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
        waiting = asyncio.create_task(http.get(f"/jobs/{job.id}?wait=60", headers=ADMIN))

        async def awaited() -> bool:
            marked = await database.pool.fetchval("SELECT awaited FROM job WHERE id = $1", job.id)
            return bool(marked)

        await eventually(awaited, within=10, what="the long poll to wait", running=(server,))
        stopping = time.monotonic()
        server.popen.send_signal(signal.SIGTERM)
        response = await waiting
        answered_s = time.monotonic() - stopping
    assert response.status_code == 200, response.text
    assert response.json()["state"] == "scheduled"
    assert answered_s < 20  # the drain timeout (30 s) would have cut it, with a 500
    assert await server.exit_code(within=15) == 0
