"""Helpers of the chaos scenarios: their settings, the figures line, jobs, the end of each."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from jobq.config import PROJECT_ROOT
from jobq.db import Connection
from jobq.queue import Job, enqueue_many
from tests.chaos.journal import Analysis
from tests.toolkit.handlers import JOB_TYPE
from tests.toolkit.procs import Proc, eventually, jobq_check

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
    "JOBQ_JOB_MODULES": "tests.toolkit.handlers",
    "JOBQ_SIGNUP_RATE_PER_HOUR": "0",  # the traffic signs up a user a request, from one address
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


# -- jobs -------------------------------------------------------------------------------------


async def enqueue_jobs(
    count: int, *, first: int = 0, priority: int = 0, max_retries: int = 5, **args: Any
) -> set[int]:
    """Enqueue `count` `recorded` jobs (arguments `n` = first.., plus `args`) in one
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
            "SELECT min(started_at) FROM execution WHERE job_id = $1", job_id
        )
        return value

    started_at = await eventually(started, within=within, what=f"job {job_id} to start")
    return (started_at - enqueued_at).total_seconds()


# -- the check command ------------------------------------------------------------------------


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
    heartbeat_interval_s = float(WORKER_ENV["JOBQ_HEARTBEAT_INTERVAL_S"])
    code, report = await jobq_check(database_url, heartbeat_interval_s=heartbeat_interval_s)
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
