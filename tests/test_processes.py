"""Real processes: `python -m jobq worker` and `python -m jobq serve` as subprocesses.

- `kill -9` of a worker loses no job, and another worker re-runs it within seconds
  (guarantees 2, 3 and 4);
- SIGTERM and SIGINT stop a worker gracefully: running jobs drain, or past the drain timeout
  go back to the queue without charging an attempt (guarantee 7);
- `serve` (what `make run` does) delivers a reminder to a real webhook receiver, signed and on
  time, and stops with exit code 0.

The subprocesses get every setting in their environment (`DATABASE_URL` of the session's test
database, fast timers), never from a `.env`. Their output goes to a file that is printed at
teardown (shown when a test fails). Waits poll the database with a deadline.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import httpx
import pytest

from jobq.config import PROJECT_ROOT
from jobq.db import Connection, Database
from jobq.queue import Enqueued, Job, enqueue
from tests.procs import START_S, Proc, check_running, eventually, registered
from tests.webhook_receiver import Receiver, assert_reminder_delivery

pytestmark = pytest.mark.slow

T = TypeVar("T")

EXECUTION_TABLE = """
CREATE TABLE IF NOT EXISTS test_execution (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id      bigint      NOT NULL,
    attempt     integer     NOT NULL,
    worker_id   integer     NOT NULL,
    pid         integer     NOT NULL,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz
)
"""
"""One row per execution of a `proc_sleep` job (see `tests/proc_handlers.py`)."""

WORKER_ENV = {
    "JOBQ_POLL_INTERVAL_S": "0.5",
    "JOBQ_RESCUE_INTERVAL_S": "0.2",
    "JOBQ_HEARTBEAT_INTERVAL_S": "0.5",
    "JOBQ_LEASE_S": "10",
    "JOBQ_DRAIN_TIMEOUT_S": "5",
    "JOBQ_LOG_LEVEL": "INFO",
    "JOBQ_JOB_MODULES": "tests.proc_handlers",
}

WEBHOOK_SECRET = "proc-test-webhook-secret"  # noqa: S105 (a test value)


# -- subprocesses -----------------------------------------------------------------------------


Spawn = Callable[..., Proc]


def subprocess_env(database_url: str, overrides: dict[str, str]) -> dict[str, str]:
    """The environment of a subprocess: ours without any jobq setting, then the test's."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("JOBQ_") and name not in {"DATABASE_URL", "TEST_DATABASE_URL"}
    }
    env.update(
        PYTHONPATH=str(PROJECT_ROOT),
        PYTHONUNBUFFERED="1",
        DATABASE_URL=database_url,
        JOBQ_WEBHOOK_SECRET=WEBHOOK_SECRET,
    )
    env.update(overrides)
    return env


@pytest.fixture
def spawn(database_url: str, tmp_path: Path) -> Iterator[Spawn]:
    """Start `python -m jobq <command>` subprocesses (cwd: the project root); SIGKILL the
    ones still running at teardown, and print every one's output."""
    started: list[Proc] = []

    def start(command: str, name: str, **env: str) -> Proc:
        log_path = tmp_path / f"{name}.log"
        with log_path.open("wb") as out:
            popen = subprocess.Popen(  # noqa: S603 (our own interpreter and arguments)
                [sys.executable, "-m", "jobq", command],
                cwd=PROJECT_ROOT,
                env=subprocess_env(database_url, env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C in the terminal is not for them
            )
        proc = Proc(name, popen, log_path)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.popen.poll() is None:
            proc.popen.kill()
        proc.popen.wait(timeout=10)
        print(f"----- {proc.name} (pid {proc.pid}, exit {proc.popen.returncode}) -----")
        print(proc.log())


async def in_log(proc: Proc, text: str, *, within: float) -> None:
    """Wait until `text` appears in the output of `proc`."""

    async def seen() -> bool:
        return text in proc.log()

    await eventually(seen, within=within, what=f"{text!r} in the output of {proc.name}")


# -- the database -----------------------------------------------------------------------------


@pytest.fixture
async def executions(database: Database, conn: Connection) -> Connection:
    """`conn`, with an empty `test_execution` table."""
    await conn.execute(EXECUTION_TABLE)
    await conn.execute("TRUNCATE test_execution RESTART IDENTITY")
    return conn


async def enqueue_sleep(seconds: float, tag: str = "") -> Enqueued:
    """Enqueue a `proc_sleep` job from the test process (committed on return)."""
    result = await enqueue(
        Job(job_type="proc_sleep", arguments={"seconds": seconds, "tag": tag}, max_retries=3)
    )
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
    return await conn.fetch("SELECT * FROM test_execution WHERE job_id = $1 ORDER BY id", job_id)


async def started_in(conn: Connection, job_id: int, proc: Proc) -> asyncpg.Record | None:
    return await conn.fetchrow(
        "SELECT * FROM test_execution WHERE job_id = $1 AND pid = $2", job_id, proc.pid
    )


async def finished(conn: Connection, job_id: int, proc: Proc) -> asyncpg.Record | None:
    return await conn.fetchrow(
        "SELECT * FROM test_execution WHERE job_id = $1 AND pid = $2 AND finished_at IS NOT NULL",
        job_id,
        proc.pid,
    )


# -- workers ----------------------------------------------------------------------------------


async def test_kill_9_loses_no_job_and_another_worker_reruns_it_within_seconds(
    spawn: Spawn, executions: Connection
) -> None:
    conn = executions
    a = spawn("worker", "worker-a", **WORKER_ENV)
    a_id = await registered(conn, a)
    job = await enqueue_sleep(30)
    first = await eventually(
        lambda: started_in(conn, job.id, a), within=5, what="A to start the job", running=(a,)
    )
    assert (first["attempt"], first["worker_id"]) == (1, a_id)

    b = spawn("worker", "worker-b", **WORKER_ENV)
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


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
async def test_stop_signal_drains_the_running_job_and_exits_0(
    spawn: Spawn, executions: Connection, stop_signal: signal.Signals
) -> None:
    conn = executions
    worker = spawn("worker", "worker", **{**WORKER_ENV, "JOBQ_DRAIN_TIMEOUT_S": "10"})
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
    late = await enqueue_sleep(0, tag="late")
    assert await worker.exit_code(within=10) == 0

    (execution,) = await execution_rows(conn, job.id)
    assert execution["finished_at"] is not None
    assert await places(conn, job.id) == 0  # completed: gone from job and job_running
    assert await conn.fetchval("SELECT attempts FROM job WHERE id = $1", late.id) == 0
    assert await execution_rows(conn, late.id) == []
    assert await conn.fetchval("SELECT count(*) FROM worker WHERE id = $1", worker_id) == 0


async def test_stop_past_the_drain_timeout_requeues_the_job_uncharged(
    spawn: Spawn, executions: Connection
) -> None:
    conn = executions
    a = spawn("worker", "worker-a", **{**WORKER_ENV, "JOBQ_DRAIN_TIMEOUT_S": "1"})
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

    b = spawn("worker", "worker-b", **WORKER_ENV)
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_serve_delivers_a_reminder_to_a_webhook_on_time_and_stops_on_sigterm(
    spawn: Spawn, database: Database, receiver: Receiver
) -> None:
    port = free_port()
    server = spawn(
        "serve",
        "server",
        JOBQ_HTTP_HOST="127.0.0.1",
        JOBQ_HTTP_PORT=str(port),
        JOBQ_RUN_WORKERS="true",
        JOBQ_LOG_LEVEL="INFO",
    )
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:

        async def healthy() -> bool:
            try:
                return (await http.get("/health")).status_code == 200
            except httpx.TransportError:
                return False

        await eventually(healthy, within=START_S, what="the server to answer", running=(server,))

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
        response = await http.post(
            f"/users/{user['id']}/reminders",
            json={"message": "stand up", "remind_in_seconds": 2},
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
            answer = (await http.get(f"/reminders/{reminder['id']}")).json()
            return bool(answer["status"] == "sent")

        await eventually(sent, within=5, what="the reminder to be marked sent", running=(server,))
        assert len(receiver.requests) == 1

    server.popen.send_signal(signal.SIGTERM)
    assert await server.exit_code(within=15) == 0
