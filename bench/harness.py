"""What every workload needs: a fresh database, waits on the queue, the machine's description.

The server is `DATABASE_URL`'s when set (through `jobq.config.Settings`), else the embedded
one (`jobq.embedded`). On it a fresh database `jobq_bench_<pid>_<hex>` is created and migrated
(`tests.toolkit.database`), given the benchmark's tables, and dropped at the end. Subprocesses
and waits are the toolkit's (`tests.toolkit.procs`), as in the tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import psutil  # type: ignore[import-untyped]

from bench.handlers import TABLES_SQL
from jobq import db, embedded
from jobq.config import PROJECT_ROOT, Settings
from tests.toolkit.database import fresh_database
from tests.toolkit.procs import Proc, check_running

BENCH_DIR = PROJECT_ROOT / ".bench"
"""Where results (`results.jsonl`) and the subprocesses' logs (`logs/`) go."""

JOB_TABLES = (
    "job, job_running, job_dead, job_done, job_attempt, job_unique, job_rate, worker, bench_event,"
    " job_workflow, job_flow, job_dependency, job_waiting, job_sequence"
)
DOMAIN_TABLES = "users, reminders, reminder_quotas, reminder_holds, exports, bench_bare"


@dataclass
class BenchDatabase:
    """A fresh database for one benchmark session, named by `dsn`."""

    dsn: str

    @property
    def name(self) -> str:
        return urlsplit(self.dsn).path.lstrip("/")

    async def reset(self) -> None:
        """Empty every table (no worker may be running): each run starts from empty files,
        with no dead rows left by the last one."""
        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.execute(f"TRUNCATE {JOB_TABLES}, {DOMAIN_TABLES} RESTART IDENTITY CASCADE")
        finally:
            await conn.close()


async def server_dsn() -> str:
    """A DSN to the benchmarks' server: `DATABASE_URL`'s, else the embedded server's (started
    if it is not running)."""
    settings = Settings()
    if settings.database_url is not None:
        return settings.database_url.get_secret_value()
    return await asyncio.to_thread(embedded.start, settings.pgdata_dir)


@contextlib.asynccontextmanager
async def bench_database() -> AsyncIterator[BenchDatabase]:
    """Create, migrate and yield a fresh database with the benchmark's tables; drop it at the
    end."""
    async with fresh_database(await server_dsn(), "jobq_bench") as dsn:
        conn = await db.connect(dsn)
        try:
            await conn.execute(TABLES_SQL)
        finally:
            await conn.close()
        yield BenchDatabase(dsn)


async def machine(dsn: str) -> dict[str, Any]:
    """The machine's description: cores, CPU model, memory, PostgreSQL's version and its
    `synchronous_commit`, Python's version."""
    conn = await asyncpg.connect(dsn)
    try:
        version = await conn.fetchval("SHOW server_version")
        sync = await conn.fetchval("SHOW synchronous_commit")
    finally:
        await conn.close()
    return {
        "cores": os.cpu_count(),
        "cpu": cpu_model(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "postgresql": version,
        "synchronous_commit": sync,
        "python": platform.python_version(),
    }


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()


# -- the queue's state -------------------------------------------------------------------------

QUEUE_HEADS = """
SELECT (SELECT id FROM job ORDER BY id LIMIT 1) AS queued,
       (SELECT token FROM job_running ORDER BY token LIMIT 1) AS running
"""
"""The first queued and the first running job, each read through an index: cheap however many
dead rows a drain has left behind (a seq scan through them would load the server)."""


async def wait_drained(
    conn: db.Connection,
    *,
    within_s: float,
    proc: Proc | None = None,
    polls: Counter[str] | None = None,
) -> float:
    """Wait until `job` and `job_running` are both empty; return the `time.perf_counter()` at
    which that was seen. Polls every 10 ms while jobs are queued, then every 1 ms while the
    last ones run: the end is seen within about a millisecond. Each poll (one statement, one
    commit) is counted in `polls["statements"]`.
    Raises `RuntimeError` after `within_s` seconds, or when `proc` exits."""
    deadline = time.perf_counter() + within_s
    while True:
        row = await conn.fetchrow(QUEUE_HEADS)
        if polls is not None:
            polls["statements"] += 1
        seen_at = time.perf_counter()
        assert row is not None
        if row["queued"] is None and row["running"] is None:
            return seen_at
        if seen_at > deadline:
            raise RuntimeError(f"the queue was not drained within {within_s:g} s")
        if proc is not None:
            check_running((proc,))
        await asyncio.sleep(0.01 if row["queued"] is not None else 0.001)


def cpu_s(processes: list[psutil.Process]) -> float:
    """CPU seconds (user + system) of `processes`, those still alive."""
    total = 0.0
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = process.cpu_times()
            total += times.user + times.system
    return total


def server_cpu_s(postmaster: psutil.Process) -> float:
    """CPU seconds (user + system) of the server: the postmaster, its reaped children, and its
    children alive now."""
    reaped = postmaster.cpu_times()
    return float(reaped.children_user + reaped.children_system) + cpu_s(
        [postmaster, *postmaster.children()]
    )


async def postmaster(conn: db.Connection) -> psutil.Process | None:
    """The server's postmaster (the parent of `conn`'s backend), or None when the server is
    not a process of this machine that this one may read."""
    pid: int = await conn.fetchval("SELECT pg_backend_pid()")
    try:
        backend = psutil.Process(pid)
        parent: psutil.Process | None = backend.parent()
        if backend.name() != "postgres" or parent is None:
            return None  # a process of this machine that has the remote backend's pid
        parent.cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return parent


def rss_mb(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS) of process `pid` in MiB: VmRSS and VmHWM from /proc on Linux;
    elsewhere psutil's RSS for both (the caller samples it to find the peak)."""
    status = Path(f"/proc/{pid}/status")
    if status.exists():
        fields = {}
        for line in status.read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                fields[name] = int(value.split()[0]) / 1024  # kB
        return fields["VmRSS"], fields["VmHWM"]
    rss = psutil.Process(pid).memory_info().rss / 2**20
    return rss, rss
