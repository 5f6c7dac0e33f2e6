"""Helpers of the chaos scenarios: subprocesses, waits, the figures line, the check command."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from jobq.config import PROJECT_ROOT
from jobq.db import Connection
from jobq.queue import Job, enqueue_many
from tests.chaos.handlers import JOB_TYPE
from tests.chaos.journal import Analysis
from tests.procs import Proc, eventually, registered

T = TypeVar("T")

RESULTS = PROJECT_ROOT / ".chaos" / "results.jsonl"
"""Where every scenario appends its JSON line of figures (gitignored)."""

WORKER_ENV = {
    "JOBQ_MAX_CONCURRENT_JOBS": "16",
    "JOBQ_POLL_INTERVAL_S": "5",
    "JOBQ_LEASE_S": "10",
    "JOBQ_HEARTBEAT_INTERVAL_S": "1",
    "JOBQ_RESCUE_INTERVAL_S": "0.5",
    "JOBQ_DRAIN_TIMEOUT_S": "5",
    "JOBQ_BACKOFF_BASE_S": "0.5",
    "JOBQ_BACKOFF_MAX_S": "5",
    "JOBQ_MAX_POOL_SIZE": "10",
    "JOBQ_LOG_LEVEL": "INFO",
    "JOBQ_JOB_MODULES": "tests.chaos.handlers",
}
"""The workers' settings in every scenario (a scenario may override some): what a deployment
that wants rescue within seconds would run. Liveness is the advisory lock, so a dead worker's
jobs come back within a rescue interval; the 10 s lease only decides for hung workers, and is
long enough that a database restart of a few seconds does not expire it."""


def settings_of(env: dict[str, str]) -> dict[str, float | int | str]:
    """The `JOBQ_*` settings of `env` for the figures line, lower-case, numbers as numbers."""
    figures: dict[str, float | int | str] = {}
    for name, value in env.items():
        if not name.startswith("JOBQ_") or name in {"JOBQ_JOB_MODULES", "JOBQ_LOG_LEVEL"}:
            continue
        key = name.removeprefix("JOBQ_").lower()
        try:
            number = float(value)
        except ValueError:
            figures[key] = value
        else:
            figures[key] = int(number) if number.is_integer() else number
    return figures


def emit(figures: dict[str, Any]) -> None:
    """Print the scenario's figures as one JSON line and append it to `RESULTS`."""
    line = json.dumps(figures, separators=(", ", ": "), default=str)
    print(f"\n{line}", flush=True)
    RESULTS.parent.mkdir(exist_ok=True)
    with RESULTS.open("a") as out:
        out.write(line + "\n")


def utcnow() -> datetime:
    return datetime.now(UTC)


# -- subprocesses -----------------------------------------------------------------------------


class Procs:
    """Starts `python -m jobq <command>` subprocesses against the scenario's database; at the
    end (`close()`) SIGKILLs those still running (after SIGCONT) and prints the tail of each
    one's output."""

    def __init__(self, database_url: str, folder: Path) -> None:
        self.database_url = database_url
        self.folder = folder
        self.started: list[Proc] = []

    def env(self, overrides: dict[str, str]) -> dict[str, str]:
        env = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith("JOBQ_") and name not in {"DATABASE_URL", "TEST_DATABASE_URL"}
        }
        env.update(PYTHONPATH=str(PROJECT_ROOT), PYTHONUNBUFFERED="1")
        env.update(DATABASE_URL=self.database_url, JOBQ_WEBHOOK_SECRET="chaos-secret")  # noqa: S106 (a test value)
        env.update(overrides)
        return env

    def start(self, command: str, name: str, env: dict[str, str]) -> Proc:
        log_path = self.folder / f"{name}.log"
        with log_path.open("wb") as out:
            popen = subprocess.Popen(  # noqa: S603 (our own interpreter and arguments)
                [sys.executable, "-m", "jobq", command],
                cwd=PROJECT_ROOT,
                env=self.env(env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = Proc(name, popen, log_path)
        self.started.append(proc)
        return proc

    async def worker(self, conn: Connection, name: str, env: dict[str, str]) -> Proc:
        """Start a worker and wait until it has registered (liveness lock held)."""
        proc = self.start("worker", name, env)
        proc.worker_id = await registered(conn, proc)
        return proc

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


# -- jobs -------------------------------------------------------------------------------------


async def enqueue_jobs(
    count: int, *, first: int = 0, priority: int = 0, max_retries: int = 5, **args: Any
) -> set[int]:
    """Enqueue `count` `chaos_run` jobs (arguments `n` = first.., plus `args`) in one
    transaction; return their ids."""
    jobs = [
        Job(
            job_type=JOB_TYPE,
            arguments={"n": n, **args},
            priority=priority,
            max_retries=max_retries,
        )
        for n in range(first, first + count)
    ]
    ids: set[int] = set()
    for start in range(0, count, 5000):
        ids.update(await enqueue_many(jobs[start : start + 5000]))
    assert len(ids) == count
    return ids


async def remaining(conn: Connection) -> int:
    """Jobs of the scenarios still queued or running."""
    value: int = await conn.fetchval(
        "SELECT (SELECT count(*) FROM job WHERE job_type = $1)"
        " + (SELECT count(*) FROM job_running WHERE job_type = $1)",
        JOB_TYPE,
    )
    return value


async def drained(conn: Connection, *, within: float, running: tuple[Proc, ...] = ()) -> None:
    """Wait until no scenario job is queued or running."""

    async def empty() -> bool:
        return await remaining(conn) == 0

    await eventually(empty, within=within, what="the queue to drain", running=running, every=0.2)


async def pickup_latency(conn: Connection, *, n: int, within: float = 10) -> float:
    """Enqueue one job of top priority and return the seconds from just before the enqueue
    until its handler starts."""
    enqueued_at = utcnow()  # so the figure includes the enqueue's own round trip
    (job_id,) = await enqueue_jobs(1, first=n, priority=100)

    async def started() -> datetime | None:
        value: datetime | None = await conn.fetchval(
            "SELECT min(started_at) FROM chaos_execution WHERE job_id = $1", job_id
        )
        return value

    started_at = await eventually(started, within=within, what=f"job {job_id} to start")
    return (started_at - enqueued_at).total_seconds()


# -- the check command ------------------------------------------------------------------------


async def check_command(database_url: str) -> tuple[int, dict[str, Any]]:
    """Run `python -m jobq check` on the scenario's database; return its exit code and JSON."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("JOBQ_") and name != "DATABASE_URL"
    }
    env.update(PYTHONPATH=str(PROJECT_ROOT), DATABASE_URL=database_url)
    # the workers' heartbeat interval: the check judges liveness with the same grace
    env.update(JOBQ_HEARTBEAT_INTERVAL_S=WORKER_ENV["JOBQ_HEARTBEAT_INTERVAL_S"])
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "jobq",
        "check",
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


# -- the end of every scenario ----------------------------------------------------------------


class InvariantBroken(AssertionError):
    """An invariant of the suite does not hold (see `verify`)."""


class SecondRunWhileFirstLived(InvariantBroken):
    """A job was rescued from a worker that was alive, and ran again (guarantee 3)."""


async def verify(
    conn: Connection, database_url: str, job_ids: set[int], died_at: dict[int, datetime]
) -> tuple[Analysis, dict[str, Any], Callable[[], None]]:
    """Read what happened to `job_ids` and run `python -m jobq check`.

    `died_at`: the workers killed or hung on purpose (worker id -> when).
    Return the analysis, the common figures (jobs, lost, run_twice, dead, how claims ended,
    the check's exit code) and a function that asserts every invariant: call it after emitting
    the figures, so that they are printed even when an invariant fails.
    """
    analysis = await Analysis.load(conn, job_ids)
    code, report = await check_command(database_url)
    invariants = analysis.invariants()
    second_runs = analysis.reruns_while_first_runner_lived(died_at)
    figures: dict[str, Any] = {
        "jobs": len(job_ids),
        "lost": len(invariants["lost"]),
        "run_twice": len(analysis.run_twice()),
        "dead": len(analysis.dead),
        "executions": sum(len(e) for e in analysis.executions.values()),
        "claims_ended": analysis.ends(),
        "reruns_while_first_runner_lived": len(second_runs),
        "check_exit": code,
    }

    def assert_invariants() -> None:
        broken = {name: found[:10] for name, found in invariants.items() if found}
        if broken:
            raise InvariantBroken(f"invariants broken (first 10 of each): {broken}")
        if code != 0:
            raise InvariantBroken(f"python -m jobq check failed:\n{json.dumps(report, indent=2)}")
        if second_runs:
            sample = [(c.job_id, c.worker_id, c.ended_at) for c in second_runs[:10]]
            raise SecondRunWhileFirstLived(
                f"{len(second_runs)} jobs were rescued from a live worker and ran again: "
                f"(job, worker, rescued at) {sample}"
            )

    return analysis, figures, assert_invariants
