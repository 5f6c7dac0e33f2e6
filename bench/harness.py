"""What every workload needs: a fresh database, subprocesses, waits, the machine's description.

The server is `DATABASE_URL`'s when set (through `jobq.config.Settings`), else the embedded
one (`jobq.embedded`). On it a fresh database `jobq_bench_<pid>_<hex>` is created, migrated
(`jobq.migrate`) and given the benchmark's tables, and dropped at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from bench import loadgen
from bench.handlers import TABLES_SQL
from jobq import db, embedded
from jobq.config import PROJECT_ROOT, Settings
from jobq.migrate import migrate

BENCH_DIR = PROJECT_ROOT / ".bench"
"""Where results (`results.jsonl`) and the subprocesses' logs (`logs/`) go."""

START_S = 30.0
"""How long a subprocess may take to start (import, migrate, connect)."""

JOB_TABLES = "job, job_running, job_dead, worker, bench_event"
DOMAIN_TABLES = "users, reminders, exports, bench_bare"


@dataclass
class BenchDatabase:
    """A fresh database for one benchmark session: `dsn` names it, `admin_dsn` its server."""

    admin_dsn: str
    name: str

    @property
    def dsn(self) -> str:
        return embedded.with_database(self.admin_dsn, self.name)

    async def reset(self) -> None:
        """Empty every table (no worker may be running): each run starts from empty files,
        with no dead rows left by the last one."""
        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.execute(f"TRUNCATE {JOB_TABLES}, {DOMAIN_TABLES} RESTART IDENTITY CASCADE")
        finally:
            await conn.close()


@contextlib.asynccontextmanager
async def bench_database() -> AsyncIterator[BenchDatabase]:
    """Create, migrate and yield a fresh database; drop it at the end."""
    settings = Settings()
    if settings.database_url is not None:
        admin_dsn = settings.database_url.get_secret_value()
    else:
        admin_dsn = await asyncio.to_thread(embedded.start, settings.pgdata_dir)
    bench = BenchDatabase(admin_dsn, f"jobq_bench_{os.getpid()}_{uuid.uuid4().hex[:6]}")
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{bench.name}"')
    finally:
        await admin.close()
    try:
        conn = await db.connect(bench.dsn)
        try:
            await migrate(conn)
            await conn.execute(TABLES_SQL)
        finally:
            await conn.close()
        yield bench
    finally:
        admin = await asyncpg.connect(admin_dsn)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{bench.name}" WITH (FORCE)')
        finally:
            await admin.close()


async def machine(dsn: str) -> dict[str, Any]:
    """The machine's description: cores, CPU model, PostgreSQL's version and its
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


# -- subprocesses ------------------------------------------------------------------------------


@dataclass
class Proc:
    """A subprocess (`python -m ...`), its output in `log_path`."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def check_running(self) -> None:
        """Raise `RuntimeError` with the end of its output when the process has exited."""
        if self.popen.poll() is not None:
            raise RuntimeError(
                f"{self.name} exited with {self.popen.returncode}:\n{self.log()[-3000:]}"
            )

    async def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM (a graceful stop), wait up to `timeout_s`, then SIGKILL; return the exit
        code."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return await asyncio.to_thread(self.popen.wait, timeout_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return self.popen.wait()


def subprocess_env(dsn: str, overrides: dict[str, str]) -> dict[str, str]:
    """Our environment without any jobq setting, then the database, a quiet log, and the
    benchmark's handlers; then `overrides`."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("JOBQ_") and name not in {"DATABASE_URL", "TEST_DATABASE_URL"}
    }
    env.update(
        PYTHONPATH=str(PROJECT_ROOT),
        PYTHONUNBUFFERED="1",
        DATABASE_URL=dsn,
        JOBQ_LOG_LEVEL="WARNING",
        JOBQ_JOB_MODULES="bench.handlers",
    )
    env.update(overrides)
    return env


def spawn(module: str, command: list[str], name: str, dsn: str, log_dir: Path, **env: str) -> Proc:
    """Start `python -m <module> <command...>` in the project root with `subprocess_env`; its
    output goes to `log_dir/<name>.log`."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    with log_path.open("wb") as out:
        popen = subprocess.Popen(  # noqa: S603 (our own interpreter and arguments)
            [sys.executable, "-m", module, *command],
            cwd=PROJECT_ROOT,
            env=subprocess_env(dsn, env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C in the terminal is for us; we stop them
        )
    return Proc(name, popen, log_path)


async def worker_registered(conn: db.Connection, proc: Proc, within_s: float = START_S) -> int:
    """Wait until the worker process `proc` has registered (its listener is LISTENing and
    holds its liveness lock); return its worker id."""
    deadline = time.monotonic() + within_s
    while True:
        worker_id: int | None = await conn.fetchval(
            "SELECT id FROM worker WHERE pid = $1", proc.pid
        )
        if worker_id is not None:
            return worker_id
        proc.check_running()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{proc.name} did not register within {within_s:g} s")
        await asyncio.sleep(0.02)


async def http_ready(
    port: int, proc: Proc, path: str = "/health", within_s: float = START_S
) -> None:
    """Wait until `GET path` on 127.0.0.1:`port` answers 200."""
    deadline = time.monotonic() + within_s
    while True:
        with contextlib.suppress(OSError, TimeoutError):
            status, _ = await loadgen.fetch(
                "127.0.0.1", port, loadgen.Request("GET", path), timeout_s=2
            )
            if status == 200:
                return
        proc.check_running()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{proc.name} did not answer {path} within {within_s:g} s")
        await asyncio.sleep(0.05)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# -- the queue's state -------------------------------------------------------------------------

QUEUE_HEADS = """
SELECT (SELECT id FROM job ORDER BY priority DESC, ripe_at LIMIT 1) AS queued,
       (SELECT token FROM job_running ORDER BY token LIMIT 1) AS running
"""
"""The first queued and the first running job, each read through an index: cheap however many
dead rows a drain has left behind (a seq scan through them would load the server)."""


async def wait_drained(conn: db.Connection, *, within_s: float, proc: Proc | None = None) -> float:
    """Wait until `job` and `job_running` are both empty; return the `time.perf_counter()` at
    which that was seen. Polls every 10 ms while jobs are queued, then every 1 ms while the
    last ones run: the end is seen within about a millisecond.
    Raises `RuntimeError` after `within_s` seconds, or when `proc` exits."""
    deadline = time.perf_counter() + within_s
    while True:
        row = await conn.fetchrow(QUEUE_HEADS)
        seen_at = time.perf_counter()
        assert row is not None
        if row["queued"] is None and row["running"] is None:
            return seen_at
        if seen_at > deadline:
            raise RuntimeError(f"the queue was not drained within {within_s:g} s")
        if proc is not None:
            proc.check_running()
        await asyncio.sleep(0.01 if row["queued"] is not None else 0.001)


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
    import psutil  # type: ignore[import-untyped]

    rss = psutil.Process(pid).memory_info().rss / 2**20
    return rss, rss
