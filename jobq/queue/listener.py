"""A worker's listener: its own session with PostgreSQL, which holds the worker's liveness lock,
runs its claims, and LISTENs when the worker hears the notifications (`jobq.queue.wakeup`).

The session advisory lock (`sql.WORKER_LOCK_CLASS`, worker id) tells every other worker this one
is alive: when the process dies, PostgreSQL drops the session and the lock, and the leader's next
rescue returns its jobs to the queue. The claims run on this session, so a worker claims only
while it holds its lock. Their statement is planned once (a generic plan): planning it anew each
time costs more than running it; tests read both plans (tests/queue/test_explain.py). A session
of its own: straight to the server when the pool goes through a pooler.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import asyncpg

from jobq import clock, db
from jobq.config import Settings
from jobq.db import Connection, Database
from jobq.queue import sql, store, wakeup
from jobq.queue.wakeup import Wakeups

log = logging.getLogger("jobq.worker")

CLAIM_SESSION = {
    "plan_cache_mode": "force_generic_plan",
    "jit": "off",
    "enable_seqscan": "off",
}
"""The settings of the session that claims (the listener's). JIT compiling the claim (its
estimates can look big) costs far more than running it. Index scans only: the generic plan is
made at the first claim, often on an empty queue, and there a scan of `job` looks cheapest; kept,
it read every queued job at each claim (1.2 ms of the claim's 1.4 at 20,000 queued) until an
analyze replanned."""


class Listener:
    """One worker's listener: `connect` it, and `reconnect` it when it is lost (not `alive`);
    claim on `claim_connection()`, `drop` it when a statement on it was cut short, `close` it
    last.

    `wakeups` LISTENs on it and hears when it is lost (`Wakeups.attach`, `Wakeups.detach`);
    `lock` is the worker's claim lock (nothing else runs on the session meanwhile); `stopping`
    is set when the worker stops (a lost session is no surprise then).
    """

    def __init__(
        self,
        database: Database,
        settings: Settings,
        wakeups: Wakeups,
        lock: asyncio.Lock,
        stopping: asyncio.Event,
    ) -> None:
        self.database = database
        self.settings = settings
        self.conn: asyncpg.Connection[asyncpg.Record] | None = None
        self.worker_id: int | None = None
        self._wakeups = wakeups
        self._lock = lock
        self._stopping = stopping

    async def connect(self, worker_id: int | None) -> int:
        """Open the session, take a new worker id when `worker_id` is None, take the id's
        liveness lock, register the worker, and LISTEN if it hears the notifications
        (`Wakeups.attach`); return the worker id.

        Raises: `RuntimeError` when another session holds the id's lock; `OSError` /
        `asyncpg.PostgresError` when the database cannot be reached.
        """
        conn = await db.connect(
            self.database.direct_dsn,
            server_settings=CLAIM_SESSION,
            command_timeout=self.settings.db_command_timeout.total_seconds(),
        )
        try:
            if worker_id is None:
                worker_id = int(await sql.worker_next_id.fetchval(conn))
            if not await sql.worker_lock.fetchval(conn, worker_id=worker_id):
                raise RuntimeError(f"worker id {worker_id} is locked by another session")
            await sql.worker_register.execute(
                conn,
                worker_id=worker_id,
                host=socket.gethostname(),
                pid=os.getpid(),
                now=clock.now(),
            )
            await self._wakeups.attach(conn)
            conn.add_termination_listener(self._lost)
        except BaseException:
            await conn.close()
            raise
        self.conn = conn
        self.worker_id = worker_id
        return worker_id

    async def reconnect(self, held: Callable[[], list[int]]) -> None:
        """Connect again after the session was lost; then put back in the queue the jobs of
        claims that committed without their answer reaching the worker (those whose tokens are
        not `held()`): they never started, and go back now rather than after their lease."""
        worker_id = await self.connect(self.worker_id)
        log.info("worker %s reconnected its listener", worker_id)
        async with self._lock, self.database.pool.acquire() as conn:
            count = await store.release_orphans(
                conn, worker_id=worker_id, held=held(), now=clock.now(), retain=self.settings.retain
            )
        if count:
            log.warning("worker %s: %d claimed jobs never reached it; released", worker_id, count)
            wakeup.wake_workers(self.database)

    @property
    def alive(self) -> bool:
        """True while the session (and so the liveness lock) is connected."""
        return self.conn is not None and not self.conn.is_closed()

    @asynccontextmanager
    async def claim_connection(self) -> AsyncIterator[Connection]:
        """The session while it is connected (so claims need the liveness lock), else a pooled
        connection (to record outcomes while the listener reconnects)."""
        if self.conn is not None and not self.conn.is_closed():
            yield self.conn
        else:
            async with self.database.pool.acquire() as conn:
                yield conn

    def drop(self) -> None:
        """A statement cut short (a killed backend, a cancellation) can leave the session in a
        state where every later one fails; its liveness lock is in doubt too. Drop it: the next
        heartbeat connects a fresh one, and the heartbeat grace keeps the worker's jobs
        meanwhile."""
        if self.conn is not None and not self.conn.is_closed():
            self.conn.terminate()

    async def close(self) -> None:
        """Close the session (which releases the liveness lock)."""
        async with self._lock:  # no LISTEN in flight on it
            if self.conn is not None:
                conn, self.conn = self.conn, None
                await conn.close()

    def _lost(self, *_: object) -> None:
        if not self._stopping.is_set():
            log.warning("worker %s lost its listener connection; reconnecting", self.worker_id)
        self.conn = None
        self._wakeups.detach()
