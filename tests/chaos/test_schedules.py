"""Chaos scenario for recurring schedules: 50 schedules firing every second make one job per
occurrence, run on time, through repeated SIGKILLs of workers and a database restart.

4 real `python -m jobq worker` processes import `tests/chaos/schedule_handlers.py` (50
schedules, `every=1`, of the recording handler `recorded`); each runs the scheduler, which
enqueues the occurrences due within 10 s as jobs ripe at their times (`jobq.queue.schedule`).
For 60 s one worker is SIGKILLed (and replaced) every ~2 s, and the suite's PostgreSQL is
restarted once (`pg_ctl stop -m fast`, 3 s down, start) in place of a kill. The window measured
is 60 whole seconds from 2 s after the 4 workers registered; for each schedule and second of
it (`occurrences_expected`), read from `job_occurrence` and the `execution` table:

- `missed`: no job ran for it (no `job_occurrence` row, or its job never started);
- `duplicated`: more than one job for it (rows of `job_occurrence` of the schedule within the
  same second: its primary key forbids two at one instant); besides, `jobs_without_occurrence`
  counts the `recorded` jobs that no occurrence made;
- lateness: its first execution's start (the handler's clock) minus its time.

`missed` must be 0 outside the restart's downtime (from `pg_ctl stop` until the server is up
again, ± `GRACE_S`), where the misfire policy (`one`) would decide, and is reported there;
`duplicated` must be 0 everywhere (no policy makes a second job of an occurrence). A job whose
worker was killed mid-run runs again (at least once): `rerun_after_kill`, apart from the other
re-runs (a handler whose own query failed in the outage, retried). Then the suite's invariants
and `python -m jobq check`; one JSON line.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import signal
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

import pytest

from jobq import db
from jobq.db import Connection
from tests.chaos import journal
from tests.chaos.helpers import WORKER_ENV, emit, settings_of, utcnow, verify
from tests.chaos.journal import Analysis, seconds
from tests.toolkit.postgres import PostgresInstance
from tests.toolkit.procs import Procs, check_running, eventually, registered, stop_workers

pytestmark = pytest.mark.chaos

SCHEDULES = 50
PREFIX = "chaos-tick-"
"""As `tests/chaos/schedule_handlers.py` declares them (not imported here: it would declare
them in this process's registry); the test checks `job_schedule` against them."""
WORKERS = 4
WINDOW_S = 60
LEAD_S = 2
"""The window's first second is at least this long after the 4 workers registered."""
KILL_EVERY_S = (1.5, 2.5)
RESTART_AFTER_S = 25.0
"""The database restart comes in place of the first kill due this long into the window."""
DOWN_S = 3.0
GRACE_S = 2.0
"""The downtime's occurrences: from `GRACE_S` before `pg_ctl stop` began to `GRACE_S` after
the server was up again."""
SETTLE_S = 30.0
"""After the window, every job of its occurrences must have run within this."""

Key = tuple[str, int]
"""An occurrence: (schedule, whole second in epoch seconds)."""


async def restart(server: PostgresInstance) -> dict[str, Any]:
    """`pg_ctl stop -m fast`, `DOWN_S` down, `pg_ctl start`; return when the stop began and
    when the server was up again (aware UTC), and how long each part took."""
    stopping_at = utcnow()
    await asyncio.to_thread(server.stop, "fast")
    down_at = utcnow()
    await asyncio.sleep(DOWN_S)
    starting_at = utcnow()
    await asyncio.to_thread(server.start)
    up_at = utcnow()
    return {
        "stopping_at": stopping_at,
        "up_at": up_at,
        "stop_s": round((down_at - stopping_at).total_seconds(), 3),
        "down_s": round((starting_at - down_at).total_seconds(), 3),
        "start_s": round((up_at - starting_at).total_seconds(), 3),
    }


async def occurrences(conn: Connection) -> dict[Key, list[tuple[datetime, int]]]:
    """Every occurrence of the scenario's schedules by (schedule, nearest whole second): its
    rows of `job_occurrence` as (time, job id)."""
    found: dict[Key, list[tuple[datetime, int]]] = defaultdict(list)
    for r in await conn.fetch(
        "SELECT schedule, at, job_id FROM job_occurrence WHERE starts_with(schedule, $1)", PREFIX
    ):
        found[(r["schedule"], round(r["at"].timestamp()))].append((r["at"], r["job_id"]))
    return found


def occurrence_figures(
    made: dict[Key, list[tuple[datetime, int]]],
    analysis: Analysis,
    expected: list[Key],
    in_downtime: set[int],
) -> dict[str, Any]:
    """The figures of the window's occurrences `expected` (see the module's docstring):
    `in_downtime`, the seconds of the restart's downtime."""
    missed: list[Key] = []
    duplicated: list[Key] = []
    lateness: dict[Key, float] = {}
    for key in expected:
        rows = made.get(key, [])
        if len(rows) > 1:
            duplicated.append(key)
        starts = [
            (e.started_at - at).total_seconds()
            for at, job_id in rows
            for e in analysis.executions[job_id]
        ]
        if starts:
            lateness[key] = min(starts)
        else:
            missed.append(key)
    outside = [v for k, v in lateness.items() if k[1] not in in_downtime]
    inside = [v for k, v in lateness.items() if k[1] in in_downtime]
    every = list(lateness.values())
    return {
        "occurrences_expected": len(expected),
        "occurrences_in_downtime": sum(k[1] in in_downtime for k in expected),
        "missed": sum(k[1] not in in_downtime for k in missed),
        "missed_in_downtime": sum(k[1] in in_downtime for k in missed),
        "duplicated": sum(k[1] not in in_downtime for k in duplicated),
        "duplicated_in_downtime": sum(k[1] in in_downtime for k in duplicated),
        "off_the_second": sum(
            at.timestamp() != key[1] for key, rows in made.items() for at, _ in rows
        ),
        "lateness_p50_s": seconds(every, 0.5),
        "lateness_p99_s": seconds(every, 0.99),
        "lateness_max_s": seconds(every, 1.0),
        "lateness_outside_downtime_p99_s": seconds(outside, 0.99),
        "lateness_outside_downtime_max_s": seconds(outside, 1.0),
        "lateness_in_downtime_max_s": seconds(inside, 1.0),
        "first_missed": [f"{s} {datetime.fromtimestamp(t, UTC)}" for s, t in missed[:5]],
        "first_duplicated": [f"{s} {datetime.fromtimestamp(t, UTC)}" for s, t in duplicated[:5]],
    }


@pytest.mark.timeout(240)
async def test_schedules_make_each_occurrence_once_on_time_through_sigkills_and_a_restart(
    procs: Procs,
    chaos_conn: Connection,
    database_url: str,
    postgres: PostgresInstance,
    opened: list[Connection],
) -> None:
    conn = chaos_conn
    env = {
        **WORKER_ENV,
        "JOBQ_JOB_MODULES": "tests.chaos.schedule_handlers",
        "JOBQ_SCHEDULE_INTERVAL_S": "1",
    }
    live = [await procs.worker(conn, f"worker-{i}", env) for i in range(WORKERS)]
    declared: int = await conn.fetchval(
        "SELECT count(*) FROM job_schedule WHERE starts_with(name, $1) AND every_s = 1", PREFIX
    )
    first_s = math.ceil(utcnow().timestamp()) + LEAD_S
    last_s = first_s + WINDOW_S - 1
    window_end = datetime.fromtimestamp(last_s, UTC)

    kills: list[tuple[int, datetime]] = []  # (worker id, when)
    restarted: dict[str, Any] = {}
    spawned = WORKERS
    rng = random.Random(10)
    while utcnow() <= window_end:
        await asyncio.sleep(rng.uniform(*KILL_EVERY_S))
        check_running(tuple(p for p in live if p.worker_id is not None))
        into_s = utcnow().timestamp() - first_s
        if not restarted and into_s >= RESTART_AFTER_S:
            for proc in live:  # a worker that starts while the server is down would exit
                if proc.worker_id is None:
                    proc.worker_id = await registered(conn, proc)
            restarted = await restart(postgres)
            with contextlib.suppress(Exception):
                await conn.close()
            conn = await db.connect(database_url)
            opened.append(conn)
            continue
        for proc in live:
            if proc.worker_id is None:  # a replacement: registered yet?
                proc.worker_id = await conn.fetchval(
                    "SELECT id FROM worker WHERE pid = $1", proc.pid
                )
        victims = [p for p in live if p.worker_id is not None]
        if not victims or utcnow() > window_end:
            continue
        victim = rng.choice(victims)
        assert victim.worker_id is not None
        kills.append((victim.worker_id, victim.send(signal.SIGKILL)))
        assert await victim.exit_code(within=5) == -signal.SIGKILL
        live.remove(victim)
        live.append(procs.start("worker", f"worker-{spawned}", env))
        spawned += 1

    window_start = datetime.fromtimestamp(first_s, UTC)

    async def settled() -> bool:
        pending: int = await conn.fetchval(
            "SELECT count(*) FROM job_occurrence AS o"
            " WHERE starts_with(o.schedule, $1) AND o.at BETWEEN $2 AND $3"
            " AND (EXISTS (SELECT FROM job WHERE id = o.job_id)"
            "      OR EXISTS (SELECT FROM job_running WHERE id = o.job_id))",
            PREFIX,
            window_start,
            window_end,
        )
        return pending == 0

    await eventually(
        settled, within=SETTLE_S, what="the window's jobs to run", running=tuple(live), every=0.2
    )
    exit_codes = await stop_workers(conn, live, within=15)

    made = await occurrences(conn)
    expected = [(f"{PREFIX}{n}", s) for n in range(SCHEDULES) for s in range(first_s, last_s + 1)]
    window_ids = {job_id for key in expected for _, job_id in made.get(key, [])}
    every_job = {job_id for rows in made.values() for _, job_id in rows}
    without_occurrence = await journal.enqueued(conn) - every_job
    died_at = dict(kills)
    analysis, figures, assert_invariants = await verify(conn, database_url, window_ids, died_at)
    in_downtime: set[int] = set()
    if restarted:
        down_from = math.floor(restarted["stopping_at"].timestamp() - GRACE_S)
        down_to = math.ceil(restarted["up_at"].timestamp() + GRACE_S)
        in_downtime = set(range(down_from, down_to + 1))
    schedule = occurrence_figures(made, analysis, expected, in_downtime)
    # a job run again after a kill: each earlier claim that ran it was a killed worker's
    after_kill = [
        job_id
        for job_id in analysis.run_twice()
        if all(c.worker_id in died_at for c in analysis.claims[job_id][:-1] if c.executions)
    ]
    emit(
        {
            "scenario": "schedules_under_sigkill_and_restart",
            **figures,
            "schedules": declared,
            "window_s": WINDOW_S,
            **schedule,
            "jobs_without_occurrence": len(without_occurrence),
            "rerun_after_kill": len(after_kill),
            "rerun_other": figures["run_twice"] - len(after_kill),
            "workers": WORKERS,
            "kills": len(kills),
            "restart": {k: v for k, v in restarted.items() if not k.endswith("_at")},
            "restart_into_window_s": (
                round(restarted["stopping_at"].timestamp() - first_s, 1) if restarted else None
            ),
            **settings_of(env),
        }
    )
    assert_invariants()
    assert declared == SCHEDULES
    assert schedule["occurrences_expected"] == SCHEDULES * WINDOW_S
    assert schedule["missed"] == 0, schedule["first_missed"]
    assert schedule["duplicated"] == schedule["duplicated_in_downtime"] == 0, schedule[
        "first_duplicated"
    ]
    assert schedule["off_the_second"] == 0
    assert sorted(without_occurrence) == []
    assert schedule["lateness_p50_s"] is not None
    assert schedule["lateness_p50_s"] < 1.0
    assert len(kills) >= 15, "too few kills to mean anything"
    assert restarted, "the window ended before the database restart"
    assert schedule["occurrences_in_downtime"] > 0
    assert exit_codes == [0] * len(live)
