"""jobq behind PgBouncer in transaction pooling mode (`tests/pgbouncer.py`; skipped, with the
reason, where `pgbouncer` is not installed), each failure a user met there:

- the start failed on a startup parameter that PgBouncer does not know (`plan_cache_mode` of
  the listener): the listener now connects directly (`JOBQ_DIRECT_DATABASE_URL`), and the pool
  sends nothing PgBouncer refuses;
- writes failed on prepared statements (reminder POSTs answered 500): the pool prepares no
  named statement behind a pooler;
- the worker never claimed: LISTEN, the liveness lock and the claims are on the direct session
  (a NOTIFY sent through PgBouncer wakes it);
- a dead worker's jobs were not rescued, its name kept by pooled server connections: pooled
  connections carry no worker's name, and the liveness is the direct session's.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import pytest
from pydantic import BaseModel

from jobq import clock, db
from jobq.db import Connection, Database, application_name
from jobq.migrate import session
from jobq.pooler import TransactionPooler, own_session
from jobq.queue import JobContext, Worker
from jobq.queue.registry import Registry
from jobq.queue.sql import WORKER_LOCK_CLASS
from tests import test_processes
from tests.conftest import make_settings
from tests.test_processes import WORKER_ENV, enqueue_sleep, execution_rows, places, started_in
from tests.toolkit.database import fresh_database
from tests.toolkit.procs import (
    START_S,
    WEBHOOK_SECRET,
    Procs,
    eventually,
    free_port,
    registered,
    spawn,
)
from tests.toolkit.receiver import WebhookReceiver as Receiver
from tests.toolkit.receiver import signed

pytestmark = pytest.mark.slow

executions = test_processes.executions


class NoArgs(BaseModel):
    pass


@pytest.fixture
async def pooled(pgbouncer_url: str, database: Database) -> AsyncIterator[Database]:
    """A pool through PgBouncer, its sessions straight to the test database."""
    settings = make_settings(pgbouncer_url)
    assert settings.direct_database_url is not None
    pool = await Database.open(settings, pgbouncer_url)
    assert pool.pooled
    yield pool
    await pool.close()


async def test_pgbouncer_refuses_the_listeners_startup_parameter_so_it_connects_directly(
    pgbouncer_url: str, pooled: Database
) -> None:
    # What the start met: the listener's plan_cache_mode, sent to PgBouncer, is refused.
    with pytest.raises(asyncpg.ProtocolViolationError, match="unsupported startup parameter"):
        await db.connect(pgbouncer_url, server_settings={"plan_cache_mode": "auto"})
    # A worker on the pooled Database starts: its listener goes to the direct DSN.
    worker = Worker(pooled, make_settings(pgbouncer_url), handlers=Registry())
    try:
        await worker.start()
        assert worker.alive
    finally:
        await worker.abort()


async def test_a_notify_sent_through_pgbouncer_wakes_a_worker_listening_directly(
    pgbouncer_url: str, pooled: Database
) -> None:
    started = asyncio.Event()
    handlers = Registry()

    @handlers.handler("tick", args=NoArgs)
    async def tick(args: NoArgs, job: JobContext) -> None:
        started.set()

    # The safety-net poll is far away: only the notification can wake the worker in time.
    settings = make_settings(pgbouncer_url, poll_interval=timedelta(seconds=60))
    worker = Worker(pooled, settings, handlers=handlers)
    stop = asyncio.Event()
    await worker.start()
    task = asyncio.create_task(worker.run(stop))
    try:
        await asyncio.sleep(0.2)  # it found nothing and sleeps for its poll interval
        async with pooled.pool.acquire() as conn, conn.transaction():
            # as another program would, in a transaction through PgBouncer: no in-process event
            await conn.execute(
                "INSERT INTO job (job_type, arguments, ripe_at, max_retries, created_at)"
                " VALUES ('tick', '{}', $1, 0, $1)",
                clock.now(),
            )
            await conn.execute("NOTIFY jobq")
        committed = time.monotonic()
        await asyncio.wait_for(started.wait(), timeout=30)
        print(f"NOTIFY through PgBouncer -> job start: {time.monotonic() - committed:.3f} s")
    finally:
        stop.set()
        await task


async def test_pooled_statements_are_right_under_concurrency(pooled: Database) -> None:
    # Many statements with parameters, in and out of transactions, at once, on connections that
    # PgBouncer hands from server connection to server connection: no prepared statement of one
    # client may reach another (asyncpg's named statements would).
    async def one(i: int) -> tuple[int, int]:
        async with pooled.pool.acquire() as conn:
            out = await conn.fetchval(f"SELECT $1::int + {i % 7}", i)
            async with conn.transaction():
                inside = await conn.fetchval(f"SELECT $1::int * {i % 5}", i)
        return out, inside

    for _ in range(3):
        results = await asyncio.gather(*(one(i) for i in range(200)))
        assert results == [(i + i % 7, i * (i % 5)) for i in range(200)]


async def test_a_killed_workers_jobs_are_rescued_behind_pgbouncer(
    procs: Procs, executions: Connection, pgbouncer_url: str, database_url: str
) -> None:
    conn = executions
    # A heartbeat grace (3 heartbeats: 9 s) far longer than the rescue by the lock, and more
    # server connections for A's pool than B's pool uses: some keep whatever name A gave them.
    env = {
        **WORKER_ENV,
        "DATABASE_URL": pgbouncer_url,
        "JOBQ_DIRECT_DATABASE_URL": database_url,
        "JOBQ_HEARTBEAT_INTERVAL_S": "3",
        "JOBQ_LEASE_S": "30",
    }
    a = procs.start("worker", "worker-a", {**env, "JOBQ_MIN_POOL_SIZE": "6"})
    a_id = await registered(conn, a)
    job = await enqueue_sleep(30)
    await eventually(
        lambda: started_in(conn, job.id, a), within=5, what="A to start the job", running=(a,)
    )
    name = await conn.fetchval(
        "SELECT application_name FROM pg_stat_activity WHERE pid = ("
        " SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = $1 AND granted"
        " AND classid = $2"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))",
        a_id,
        WORKER_LOCK_CLASS,
    )
    assert name.startswith(f"jobq/{a.pid}@")  # the listener, a direct session, carries it

    b = procs.start(
        "worker", "worker-b", {**env, "JOBQ_MIN_POOL_SIZE": "1", "JOBQ_MAX_POOL_SIZE": "2"}
    )
    await registered(conn, b)
    killed_at = time.monotonic()
    a.popen.send_signal(signal.SIGKILL)
    assert await a.exit_code(within=5) == -signal.SIGKILL

    async def rerun() -> bool:
        return await started_in(conn, job.id, b) is not None

    await eventually(rerun, within=15, what="B to run the killed worker's job", running=(b,))
    rescue_s = time.monotonic() - killed_at
    print(f"behind PgBouncer: kill -9 -> the job started again {rescue_s:.2f} s later")
    # Rescued on the lock's disappearance, not after the heartbeat grace (9 s) that A's name
    # on a pooled server connection would have granted it.
    assert rescue_s < 5
    # PgBouncer's server connections that served A's pool live on, without A's name.
    assert not await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", name
    )
    first, second = await execution_rows(conn, job.id)
    assert (first["pid"], second["pid"], second["attempt"]) == (a.pid, b.pid, 2)

    async def done() -> bool:
        return await places(conn, job.id) == 0

    await eventually(done, within=5, what="the job's completion")


async def test_serve_behind_pgbouncer_starts_writes_and_delivers_reminders(
    procs: Procs, database: Database, pgbouncer_url: str, database_url: str, receiver: Receiver
) -> None:
    port = free_port()
    server = procs.start(
        "serve",
        "server",
        {
            "DATABASE_URL": pgbouncer_url,
            "JOBQ_DIRECT_DATABASE_URL": database_url,
            "JOBQ_HTTP_HOST": "127.0.0.1",
            "JOBQ_HTTP_PORT": str(port),
            "JOBQ_RUN_WORKERS": "true",
            "JOBQ_LOG_LEVEL": "WARNING",
            "JOBQ_WEBHOOK_ALLOW_PRIVATE": "true",  # the receiver listens on 127.0.0.1
            "JOBQ_RATE_LIMIT_PER_S": "0",  # 60 POSTs at once with one key
        },
    )
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:

        async def healthy() -> bool:
            try:
                return (await http.get("/health")).status_code == 200
            except httpx.TransportError:
                return False

        await eventually(healthy, within=START_S, what="the server", running=(server,))
        response = await http.post(
            "/users",
            json={
                "name": "Bouncer",
                "email": "bouncer@example.com",
                "webhook_url": f"http://127.0.0.1:{receiver.port}/hook",
            },
        )
        assert response.status_code == 201, response.text
        user: dict[str, Any] = response.json()

        async def remind(i: int) -> httpx.Response:
            return await http.post(
                f"/users/{user['id']}/reminders",
                json={"message": f"number {i}", "remind_in_seconds": 1},
                headers={"Authorization": f"Bearer {user['api_key']}"},
            )

        answers = await asyncio.gather(*(remind(i) for i in range(60)))
        assert [a.status_code for a in answers] == [201] * 60, answers[0].text
        await asyncio.wait_for(receiver.wait_for(60), timeout=30)
        bodies = [json.loads(r.body) for r in receiver.requests]
        assert {b["reminder_id"] for b in bodies} == {a.json()["id"] for a in answers}
        for request, body in zip(receiver.requests, bodies, strict=True):
            assert datetime.fromisoformat(body["remind_at"]) <= request.received_at
            assert signed(WEBHOOK_SECRET, request.headers, request.body)
    server.popen.send_signal(signal.SIGTERM)
    assert await server.exit_code(within=15) == 0
    assert "Traceback" not in server.log()


@pytest.mark.parametrize("command", ["run", "serve", "worker", "migrate", "check", "stats"])
async def test_behind_a_transaction_pooler_without_a_direct_url_every_process_stops_at_once(
    command: str, pgbouncer_url: str, admin_dsn: str, tmp_path: Path
) -> None:
    """DATABASE_URL through PgBouncer in transaction mode, JOBQ_DIRECT_DATABASE_URL unset: the
    process says so in one line naming the setting, exits 1 within 5 s of a normal start (10 s
    here: a machine half as fast), restarts nothing, and migrates nothing (a fresh database
    stays empty)."""
    async with fresh_database(admin_dsn, "jobq_nodirect", migrated=False) as dsn:
        url = urlunsplit(urlsplit(pgbouncer_url)._replace(path=urlsplit(dsn).path))
        started = time.monotonic()
        proc = spawn(command, command, database_url=url, log_dir=tmp_path)
        code = await proc.exit_code(within=START_S)
        took_s = time.monotonic() - started
        print(
            f"python -m jobq {command} behind a transaction pooler: exit {code} in {took_s:.2f} s"
        )
        lines = [line for line in proc.log().splitlines() if "XDG_RUNTIME_DIR" not in line]
        lines = [line for line in lines if "user_runtime_dir" not in line]  # platformdirs' warning
        assert code == 1, proc.log()
        assert len(lines) == 1, proc.log()
        assert lines[0].startswith("jobq: DATABASE_URL goes through a pooler in transaction mode")
        assert "set JOBQ_DIRECT_DATABASE_URL" in lines[0]
        assert took_s < 10, proc.log()
        conn = await asyncpg.connect(dsn)
        try:
            assert await conn.fetchval("SELECT to_regclass('schema_migrations')") is None
        finally:
            await conn.close()


async def test_the_probe_tells_a_transaction_pooler_from_the_server(
    pgbouncer_url: str, database_url: str
) -> None:
    assert await own_session(pgbouncer_url) is None
    direct = await own_session(database_url)  # the probe's connection, handed over
    assert direct is not None
    try:
        assert direct.get_server_pid() == await direct.fetchval("SELECT pg_backend_pid()")
    finally:
        await direct.close()
    # JOBQ_DIRECT_DATABASE_URL through the pooler too: refused, naming it
    settings = make_settings(pgbouncer_url, direct_database_url=pgbouncer_url)
    with pytest.raises(TransactionPooler, match="JOBQ_DIRECT_DATABASE_URL goes through a pooler"):
        await session(settings, pgbouncer_url)
    # the direct URL set right: a session of its own
    conn = await session(make_settings(pgbouncer_url), pgbouncer_url)
    try:
        assert conn.get_server_pid() == await conn.fetchval("SELECT pg_backend_pid()")
        # as `jobq.db.connect` makes one: this process's application_name, jsonb decoded
        assert await conn.fetchval("SHOW application_name") == application_name()
        assert await conn.fetchval("SELECT '{\"a\": 1}'::jsonb") == {"a": 1}
    finally:
        await conn.close()
