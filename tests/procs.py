"""Real `python -m jobq` subprocesses in tests: a handle on one, and waiting on what they do.

Shared by the process tests (`tests/test_processes.py`) and the fault suite (`tests/chaos/`).
"""

from __future__ import annotations

import ast
import asyncio
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from jobq.db import Connection
from jobq.queue.sql import WORKER_LOCK_CLASS

T = TypeVar("T")

START_S = 20.0
"""How long a process may take to start (a cold venv on a busy machine)."""


@dataclass
class Proc:
    """A `python -m jobq` subprocess; its output is in `log_path`."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    worker_id: int | None = None
    signals: list[tuple[str, datetime]] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def running(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def send(self, sig: signal.Signals) -> datetime:
        """Send `sig`; return when (aware UTC, taken just before sending)."""
        at = datetime.now(UTC)
        self.popen.send_signal(sig)
        self.signals.append((sig.name, at))
        return at

    async def exit_code(self, *, within: float) -> int:
        """Wait up to `within` s for the process to exit and return its exit code."""
        deadline = time.monotonic() + within
        while (code := self.popen.poll()) is None:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.name} still running {within:g} s later:\n{self.log()[-4000:]}"
                )
            await asyncio.sleep(0.01)
        return code

    def final_counts(self) -> dict[str, int]:
        """The counts of the worker's last `worker N stopped: {...}` log line."""
        for line in reversed(self.log().splitlines()):
            if " stopped: {" in line:
                counts: dict[str, int] = ast.literal_eval(line[line.index("{") :])
                return counts
        raise AssertionError(f"{self.name} logged no final counts:\n{self.log()[-4000:]}")


def check_running(procs: tuple[Proc, ...]) -> None:
    """Fail at once, with its output, when a process that should be running has exited."""
    for proc in procs:
        if not proc.running:
            raise AssertionError(
                f"{proc.name} exited with {proc.popen.returncode}:\n{proc.log()[-4000:]}"
            )


async def eventually(
    check: Callable[[], Awaitable[T | None]],
    *,
    within: float,
    what: str,
    running: tuple[Proc, ...] = (),
    every: float = 0.02,
) -> T:
    """Return the first truthy result of `check()`, polled every `every` s for up to `within` s.
    Raises `AssertionError` on timeout, or when a process of `running` exits meanwhile."""
    deadline = time.monotonic() + within
    while True:
        value = await check()
        if value:
            return value
        check_running(running)
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:g} s waiting for {what}")
        await asyncio.sleep(every)


async def registered(conn: Connection, proc: Proc) -> int:
    """Wait until the worker process `proc` has registered and holds its liveness lock (its
    signal handlers are installed by then); return its worker id."""

    async def worker_id() -> int | None:
        value: int | None = await conn.fetchval(
            "SELECT w.id FROM worker AS w JOIN pg_locks AS l"
            " ON l.locktype = 'advisory' AND l.objid = w.id AND l.granted"
            " AND l.classid = $2"
            " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " WHERE w.pid = $1",
            proc.pid,
            WORKER_LOCK_CLASS,
        )
        return value

    return await eventually(
        worker_id, within=START_S, what=f"{proc.name} to register", running=(proc,)
    )
