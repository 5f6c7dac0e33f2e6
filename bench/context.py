"""What a workload's run is given, and what it returns."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import children
from bench.harness import BenchDatabase
from jobq import db
from jobq.config import Settings
from jobq.db import Connection, Database
from tests.toolkit.procs import Proc, spawn

Figures = dict[str, Any]
"""One line's figures of one run: `{"concurrency": 16, "jobs_per_s": 31250.0, ...}`. The keys
named in the workload's `keys` tell its lines apart (e.g. `concurrency`); the others are
figures, each reported as the median over the runs."""


@dataclass(frozen=True)
class Context:
    """One run of one workload: the database (emptied by the workload as it needs), the run's
    number (from 1), and where the subprocesses' logs go."""

    database: BenchDatabase
    run: int
    log_dir: Path

    @property
    def dsn(self) -> str:
        return self.database.dsn

    def name(self, what: str) -> str:
        """A subprocess's name (its log file): `<what>-run<n>`."""
        return f"{what}-run{self.run}"

    def spawn(self, command: str, what: str, *, module: str = "jobq", **env: str) -> Proc:
        """Start `python -m <module> [<command>]` on the benchmark database (see
        `tests.toolkit.procs.spawn`) with a quiet log and the benchmark's handlers, then `env`;
        its log is `log_dir/<what>-run<n>.log`. It is stopped at exit if still running
        (`bench.children`)."""
        proc = spawn(
            command,
            self.name(what),
            database_url=self.dsn,
            log_dir=self.log_dir,
            env={"JOBQ_LOG_LEVEL": "WARNING", "JOBQ_JOB_MODULES": "bench.handlers", **env},
            module=module,
        )
        children.track(proc.popen)
        return proc

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        """A connection of its own (autocommit), for waits and checks."""
        conn = await db.connect(self.dsn)
        try:
            yield conn
        finally:
            await conn.close()

    @contextlib.asynccontextmanager
    async def jobq_database(self, pool_size: int = 2) -> AsyncIterator[Database]:
        """A jobq `Database` (pool of `pool_size`) on the benchmark database, bound in this
        context, so that `enqueue` and `enqueue_many` work as in an application."""
        values: dict[str, Any] = {
            "database_url": self.dsn,
            "min_pool_size": pool_size,
            "max_pool_size": pool_size,
        }
        settings = Settings(_env_file=None, **values)
        database = await Database.open(settings, self.dsn)
        db.bind(database)
        try:
            yield database
        finally:
            await database.close()
