"""Helpers shared by the queue tests: table reads and a gate that holds handlers inside a call."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import asyncpg

from jobq.db import Connection
from jobq.queue import Worker
from tests.toolkit.procs import eventually

MakeWorker = Callable[..., Awaitable[Worker]]
"""`make_worker(handlers, *, state=None, **settings_overrides) -> Worker` (started)."""

TABLES = ("job", "job_running", "job_dead")


async def count(conn: Connection, table: str) -> int:
    """Return the number of rows of `table` (one of the queue's tables)."""
    assert table in (*TABLES, "worker")
    value: int = await conn.fetchval(f"SELECT count(*) FROM {table}")
    return value


async def counts(conn: Connection) -> dict[str, int]:
    """Return the row counts of job, job_running and job_dead."""
    return {table: await count(conn, table) for table in TABLES}


async def row(conn: Connection, table: str, job_id: int) -> asyncpg.Record | None:
    """Return the row of job `job_id` in `table`, or None."""
    assert table in TABLES
    record: asyncpg.Record | None = await conn.fetchrow(
        f"SELECT * FROM {table} WHERE id = $1", job_id
    )
    return record


async def where(conn: Connection, job_id: int) -> list[str]:
    """Return the tables that hold job `job_id` (exactly one while the job exists)."""
    return [table for table in TABLES if await row(conn, table, job_id) is not None]


async def wait_for_lock_waiter(conn: Connection) -> None:
    """Wait until some session of this database waits for a lock (a blocked statement)."""

    async def waiting() -> bool:
        found: bool = await conn.fetchval(
            "SELECT EXISTS (SELECT FROM pg_locks JOIN pg_stat_activity USING (pid)"
            " WHERE NOT granted AND datname = current_database())"
        )
        return found

    await eventually(waiting, what="a session to wait for a lock")


class Gate:
    """Holds async handlers inside their call until the test releases them.

    A handler calls `await gate.enter(job_id)`: `entered` records the call and `started`
    is set, then the call waits until `release()`.
    """

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.entered: list[int] = []
        self._open = asyncio.Event()

    async def enter(self, job_id: int) -> None:
        self.entered.append(job_id)
        self.started.set()
        await self._open.wait()

    async def wait_entered(self, n: int = 1) -> None:
        """Wait until `n` calls have entered (at most 5 s)."""
        async with asyncio.timeout(5):
            while True:
                self.started.clear()
                if len(self.entered) >= n:
                    return
                await self.started.wait()

    def release(self) -> None:
        self._open.set()
