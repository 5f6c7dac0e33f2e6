"""Real processes: `python -m jobq run` (what `make run` does), its web and worker children.

- a SIGKILLed worker child and a SIGKILLed web child are restarted, and the service goes on
  (the new worker runs jobs; HTTP keeps answering, the new web child on its predecessor's
  socket);
- SIGTERM stops every child within the drain timeout + 2 s, the running job released
  uncharged, and the supervisor exits 0;
- a child that crashes at every start is reported as a crash loop (an ERROR line, exit 1).
"""

from __future__ import annotations

import asyncio
import signal
import time

import httpx
import psutil  # type: ignore[import-untyped]
import pytest

from jobq.db import Connection
from jobq.queue.sql import WORKER_LOCK_CLASS
from tests import test_processes
from tests.test_processes import WORKER_ENV, enqueue_sleep, execution_rows, places
from tests.toolkit.procs import START_S, Proc, Procs, eventually, free_port, in_log

pytestmark = pytest.mark.slow

executions = test_processes.executions

DRAIN_S = 3


def children(supervisor: Proc, command: str) -> list[psutil.Process]:
    """The supervisor's live children running `python -m jobq <command>`."""
    found = []
    for child in psutil.Process(supervisor.pid).children():
        try:
            if command in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


def start_run(procs: Procs, port: int, **env: str) -> Proc:
    return procs.start(
        "run",
        "supervisor",
        {
            **WORKER_ENV,
            "JOBQ_HTTP_HOST": "127.0.0.1",
            "JOBQ_HTTP_PORT": str(port),
            "JOBQ_WEB_PROCESSES": "2",
            "JOBQ_WORKER_PROCESSES": "1",
            "JOBQ_DRAIN_TIMEOUT_S": str(DRAIN_S),
            **env,
        },
    )


def accepted(supervisor: Proc, client_port: int) -> bool:
    """Whether a child of the supervisor has accepted the connection from `client_port`."""
    for child in psutil.Process(supervisor.pid).children(recursive=True):
        try:
            if any(c.raddr and c.raddr.port == client_port for c in child.net_connections()):
                return True
        except psutil.NoSuchProcess:
            pass
    return False


async def healthy(http: httpx.AsyncClient) -> bool:
    try:
        return (await http.get("/health")).status_code == 200
    except httpx.TransportError:
        return False


async def registered_pid(conn: Connection, pid: int) -> int | None:
    """The id of the worker of process `pid` once it holds its liveness lock."""
    value: int | None = await conn.fetchval(
        "SELECT w.id FROM worker AS w JOIN pg_locks AS l"
        " ON l.locktype = 'advisory' AND l.objid = w.id AND l.granted AND l.classid = $2"
        " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " WHERE w.pid = $1",
        pid,
        WORKER_LOCK_CLASS,
    )
    return value


async def test_run_restarts_a_killed_worker_child_and_a_killed_web_child(
    procs: Procs, executions: Connection
) -> None:
    conn = executions
    port = free_port()
    supervisor = start_run(procs, port)
    running = (supervisor,)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
        await eventually(lambda: healthy(http), within=START_S, what="HTTP", running=running)

        async def one_worker() -> int | None:
            workers = children(supervisor, "worker")
            return workers[0].pid if len(workers) == 1 else None

        old_worker = await eventually(one_worker, within=START_S, what="a worker child")
        await eventually(
            lambda: registered_pid(conn, old_worker), within=START_S, what="it to register"
        )
        assert len(children(supervisor, "serve")) == 2

        # The worker child: SIGKILL, then a new one runs jobs.
        psutil.Process(old_worker).send_signal(signal.SIGKILL)
        await in_log(supervisor, "died (killed by SIGKILL); restarting", within=5)

        async def new_worker() -> int | None:
            pid = await one_worker()
            return pid if pid not in (None, old_worker) else None

        worker_pid = await eventually(
            new_worker, within=START_S, what="a new worker child", running=running
        )
        await eventually(
            lambda: registered_pid(conn, worker_pid), within=START_S, what="it to register"
        )
        job = await enqueue_sleep(0)

        async def ran() -> bool:
            return (
                await conn.fetchval("SELECT pid FROM execution WHERE job_id = $1", job.id)
                == worker_pid
                and await places(conn, job.id) == 0
            )

        await eventually(ran, within=10, what="the new worker to run a job", running=running)

        # A web child: SIGKILL; the other keeps answering meanwhile, and a new one starts.
        web = children(supervisor, "serve")
        killed = web[0].pid
        web[0].send_signal(signal.SIGKILL)
        await eventually(lambda: healthy(http), within=5, what="HTTP after the kill")

        async def two_web() -> bool:
            pids = {p.pid for p in children(supervisor, "serve")}
            return len(pids) == 2 and killed not in pids

        await eventually(two_web, within=START_S, what="a new web child", running=running)
        await in_log(supervisor, f"(pid {killed}) died (killed by SIGKILL)", within=1)

        async def served_by_all() -> bool:
            # The new web child accepts too: many requests, all 200.
            answers = await asyncio.gather(*(http.get("/health") for _ in range(20)))
            return all(a.status_code == 200 for a in answers)

        await eventually(served_by_all, within=START_S, what="HTTP after the restart")

    supervisor.send(signal.SIGTERM)
    assert await supervisor.exit_code(within=DRAIN_S + 2) == 0


async def test_sigterm_stops_every_child_within_the_drain_timeout_and_exits_0(
    procs: Procs, executions: Connection
) -> None:
    conn = executions
    port = free_port()
    supervisor = start_run(procs, port)
    running = (supervisor,)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
        await eventually(lambda: healthy(http), within=START_S, what="HTTP", running=running)

        async def worker_pid() -> int | None:
            workers = children(supervisor, "worker")
            return workers[0].pid if workers else None

        pid = await eventually(worker_pid, within=START_S, what="a worker child")
        job = await enqueue_sleep(30)  # runs past the drain timeout

        async def started() -> bool:
            row = await conn.fetchrow("SELECT pid FROM execution WHERE job_id = $1", job.id)
            return row is not None and row["pid"] == pid

        await eventually(started, within=START_S, what="the job to start", running=running)

        async def webs_serving() -> bool:  # both web children, not only the first to answer
            return supervisor.log().count("Running on http://") == 2

        await eventually(webs_serving, within=START_S, what="both web children", running=running)
        all_children = psutil.Process(supervisor.pid).children()
        assert len(all_children) == 3

    stopping_at = time.monotonic()
    supervisor.send(signal.SIGTERM)
    assert await supervisor.exit_code(within=DRAIN_S + 2) == 0
    took = time.monotonic() - stopping_at
    print(f"supervisor stop with a {DRAIN_S} s drain and a running job: {took:.2f} s")
    assert not any(child.is_running() for child in all_children)
    # The worker drained, then released the unfinished job with no attempt charged.
    assert await conn.fetchval("SELECT attempts FROM job WHERE id = $1", job.id) == 0
    (execution,) = await execution_rows(conn, job.id)
    assert execution["finished_at"] is None
    assert "worker-0 stopped (exit code 0)" in supervisor.log()
    assert "web-0 stopped (exit code 0)" in supervisor.log()
    assert "web-1 stopped (exit code 0)" in supervisor.log()


async def test_a_crash_loop_is_reported_and_the_supervisor_exits_1(procs: Procs) -> None:
    # Every worker child dies at start (its job module does not exist).
    supervisor = start_run(
        procs,
        free_port(),
        JOBQ_WEB_PROCESSES="1",
        JOBQ_JOB_MODULES="tests.no_such_module",
        JOBQ_CRASH_LOOP_RESTARTS="2",
    )
    assert await supervisor.exit_code(within=START_S * 4) == 1
    log = supervisor.log()
    assert "ERROR jobq.supervisor: crash loop:" in log
    assert "died (exit code 1); restarting in 0.5 s" in log
    assert "died (exit code 1); restarting in 1 s" in log
    # The supervisor stopped the children it had started before it exited.
    pids = [
        int(line.rsplit("(pid ", 1)[1].rstrip(")"))
        for line in log.splitlines()
        if "INFO jobq.supervisor: started " in line
    ]
    assert len(pids) >= 4  # web-0, worker-0, and its 2 restarts
    assert not any(
        psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        for pid in pids
    )


async def test_sigterm_lets_a_web_child_finish_a_request_in_progress(procs: Procs) -> None:
    port = free_port()
    supervisor = start_run(procs, port, JOBQ_WEB_PROCESSES="1")
    running = (supervisor,)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
        await eventually(lambda: healthy(http), within=START_S, what="HTTP", running=running)
    body = b'{"name": "Late", "email": "late@example.com"}'
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /users HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body[:10]
    )
    await writer.drain()
    client_port = writer.get_extra_info("sockname")[1]
    await eventually(
        lambda: accepted(supervisor, client_port), what="the web child to accept the request"
    )  # the request is in the web child's hands, its body unfinished

    supervisor.send(signal.SIGTERM)
    await in_log(supervisor, "SIGTERM: stopping the children", within=5)
    await asyncio.sleep(0.5)  # the web child has its SIGTERM: it accepts nothing new
    writer.write(body[10:])
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), timeout=DRAIN_S + 2)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 201"), answer[:200]
    assert await supervisor.exit_code(within=DRAIN_S + 2) == 0
