"""Real subprocesses in tests and benchmarks: their environment, a handle on one, a manager that
cleans up, waiting on what they do, and `python -m jobq check`.

Every subprocess is `python -m <module> [command]` run in the project root with this process's
environment minus every jobq setting, plus `PYTHONPATH` (the project root), unbuffered output,
`DATABASE_URL` and the caller's settings, never a `.env`; its output goes to a log file.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar, overload

import httpx

from jobq.config import PROJECT_ROOT
from jobq.db import Connection
from jobq.queue.sql import WORKER_LOCK_CLASS

T = TypeVar("T")

START_S = 30.0
"""How long a process may take to start (import, migrate, connect; a cold venv on a busy
machine)."""

WEBHOOK_SECRET = "whsec_dG9vbGtpdC13ZWJob29rLXNlY3JldC1vZi10ZXN0cyE="  # noqa: S105 (a test value)
"""The webhook secret of the tests (`make_settings`) and of the subprocesses they start
(`JOBQ_WEBHOOK_SECRET`, unless overridden): a Standard Webhooks secret of 32 bytes."""


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def subprocess_env(database_url: str, overrides: Mapping[str, str] = {}) -> dict[str, str]:
    """This process's environment without any jobq setting (`JOBQ_*`, `DATABASE_URL`,
    `TEST_DATABASE_URL`), then `PYTHONPATH` (the project root), unbuffered output,
    `DATABASE_URL` and `JOBQ_WEBHOOK_SECRET` (`WEBHOOK_SECRET`: no test process makes a secret
    file in the project, unless `overrides` name `JOBQ_WEBHOOK_SECRET_FILE`), then
    `overrides`."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("JOBQ_") and name not in {"DATABASE_URL", "TEST_DATABASE_URL"}
    }
    env.update(PYTHONPATH=str(PROJECT_ROOT), PYTHONUNBUFFERED="1", DATABASE_URL=database_url)
    if "JOBQ_WEBHOOK_SECRET_FILE" not in overrides:  # else the test wants the kept secret
        env.update(JOBQ_WEBHOOK_SECRET=WEBHOOK_SECRET)
    env.update(overrides)
    return env


@dataclass
class Proc:
    """A `python -m ...` subprocess; its output is in `log_path`. `worker_id` is for the
    caller's records."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    worker_id: int | None = None

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

    async def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM (a graceful stop), wait up to `timeout_s`, then SIGKILL; return the exit
        code."""
        if self.running:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return await asyncio.to_thread(self.popen.wait, timeout_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return self.popen.wait()

    def final_counts(self) -> dict[str, int]:
        """The counts of the worker's last `worker N stopped: {...}` log line."""
        for line in reversed(self.log().splitlines()):
            if " stopped: {" in line:
                counts: dict[str, int] = ast.literal_eval(line[line.index("{") :])
                return counts
        raise AssertionError(f"{self.name} logged no final counts:\n{self.log()[-4000:]}")


def spawn(
    command: str,
    name: str,
    *,
    database_url: str,
    log_dir: Path,
    env: Mapping[str, str] = {},
    module: str = "jobq",
) -> Proc:
    """Start `python -m <module> [<command>]` in the project root with `subprocess_env`, in a
    session of its own (a Ctrl-C in the terminal is not for it); its output goes to
    `log_dir/<name>.log`."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    with log_path.open("wb") as out:
        popen = subprocess.Popen(  # noqa: S603 (our own interpreter and arguments)
            [sys.executable, "-m", module, *([command] if command else [])],
            cwd=PROJECT_ROOT,
            env=subprocess_env(database_url, env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Proc(name, popen, log_path)


class Procs:
    """Starts `python -m jobq <command>` subprocesses on one database, with
    `JOBQ_WEBHOOK_SECRET=WEBHOOK_SECRET` unless overridden; at the end (`close()`) SIGKILLs those
    still running (after SIGCONT) and prints the tail of the output of each one that failed (or
    of the last three)."""

    def __init__(self, database_url: str, log_dir: Path) -> None:
        self.database_url = database_url
        self.log_dir = log_dir
        self.started: list[Proc] = []

    def start(self, command: str, name: str, env: Mapping[str, str] = {}) -> Proc:
        proc = spawn(
            command,
            name,
            database_url=self.database_url,
            log_dir=self.log_dir,
            env={"JOBQ_WEBHOOK_SECRET": WEBHOOK_SECRET, **env},
        )
        self.started.append(proc)
        return proc

    async def worker(self, conn: Connection, name: str, env: Mapping[str, str]) -> Proc:
        """Start a worker and wait until it has registered (liveness lock held)."""
        proc = self.start("worker", name, env)
        proc.worker_id = await registered(conn, proc)
        return proc

    async def serve(self, name: str, env: Mapping[str, str]) -> tuple[Proc, int]:
        """Start `python -m jobq serve` on a free port of 127.0.0.1 and wait until its /health
        answers 200; return it and its port."""
        port = free_port()
        proc = self.start(
            "serve", name, {**env, "JOBQ_HTTP_HOST": "127.0.0.1", "JOBQ_HTTP_PORT": str(port)}
        )
        await http_ready(port, proc)
        return proc, port

    def close(self) -> None:
        for proc in self.started:
            if proc.running:
                proc.popen.send_signal(signal.SIGCONT)
                proc.popen.kill()
            proc.popen.wait(timeout=10)
        failed = [p for p in self.started if p.popen.returncode not in (0, -signal.SIGKILL)]
        for proc in failed or self.started[-3:]:
            print(f"----- {proc.name} (pid {proc.pid}, exit {proc.popen.returncode}) -----")
            print(proc.log()[-3000:])


# -- waiting ----------------------------------------------------------------------------------


def check_running(procs: tuple[Proc, ...]) -> None:
    """Fail at once, with its output, when a process that should be running has exited."""
    for proc in procs:
        if not proc.running:
            raise AssertionError(
                f"{proc.name} exited with {proc.popen.returncode}:\n{proc.log()[-4000:]}"
            )


@overload
async def eventually(
    check: Callable[[], Awaitable[T | None]],
    *,
    within: float = ...,
    what: str = ...,
    running: tuple[Proc, ...] = ...,
    every: float = ...,
) -> T: ...


@overload
async def eventually(
    check: Callable[[], T | None],
    *,
    within: float = ...,
    what: str = ...,
    running: tuple[Proc, ...] = ...,
    every: float = ...,
) -> T: ...


async def eventually(
    check: Callable[[], Any],
    *,
    within: float = 5.0,
    what: str = "the condition",
    running: tuple[Proc, ...] = (),
    every: float = 0.01,
) -> Any:
    """Return the first truthy result of `check()` (awaited when it is awaitable), polled every
    `every` s for up to `within` s. Raises `AssertionError` on timeout, or when a process of
    `running` exits meanwhile.

    Only for what no event can tell: another process's or session's state (rows, pg_locks, a
    backend's exit)."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        check_running(running)
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:g} s waiting for {what}")
        await asyncio.sleep(every)


async def registered(conn: Connection, proc: Proc) -> int:
    """Wait until the worker process `proc` has registered and holds its liveness lock (its
    signal handlers are installed and its listener LISTENs by then); return its worker id."""

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
        worker_id, within=START_S, what=f"{proc.name} to register", running=(proc,), every=0.02
    )


async def stop_workers(conn: Connection, workers: Sequence[Proc], *, within: float) -> list[int]:
    """SIGTERM every worker of `workers` (a graceful stop: each drains and exits 0) once each has
    registered, and return their exit codes, each waited for up to `within` seconds. A worker
    respawned just before the end may still be starting its interpreter: a SIGTERM then ends it
    by the signal's default action (exit -15) before any code of jobq's runs, so it is first
    waited for (`registered`: its handlers are installed by then)."""
    for proc in workers:
        await registered(conn, proc)
    for proc in workers:
        proc.send(signal.SIGTERM)
    return [await proc.exit_code(within=within) for proc in workers]


async def http_ready(port: int, proc: Proc, path: str = "/health") -> None:
    """Wait until `GET path` on 127.0.0.1:`port` (served by `proc`) answers 200."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=2) as http:

        async def ok() -> bool:
            try:
                return (await http.get(path)).status_code == 200
            except httpx.TransportError:
                return False

        await eventually(
            ok, within=START_S, what=f"{proc.name} to answer {path}", running=(proc,), every=0.05
        )


async def in_log(proc: Proc, text: str, *, within: float) -> None:
    """Wait until `text` appears in the output of `proc`."""
    await eventually(
        lambda: text in proc.log(), within=within, what=f"{text!r} in the output of {proc.name}"
    )


# -- python -m jobq check ---------------------------------------------------------------------


async def jobq_check(
    database_url: str, *args: str, heartbeat_interval_s: float
) -> tuple[int, dict[str, Any]]:
    """Run `python -m jobq check [args]` on `database_url`; return its exit code and its JSON.

    `heartbeat_interval_s`: the workers' heartbeat interval, from which the check takes the
    grace it gives a worker before it calls it dead."""
    env = subprocess_env(database_url, {"JOBQ_HEARTBEAT_INTERVAL_S": str(heartbeat_interval_s)})
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "jobq",
        "check",
        *args,
        cwd=PROJECT_ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    try:
        report: dict[str, Any] = json.loads(out)
    except json.JSONDecodeError as exc:
        raise AssertionError(f"jobq check printed no JSON:\n{out!r}\n{err.decode()}") from exc
    return process.returncode, report
