"""Chaos scenario for the queues' limits: per-key concurrency and rate limits hold through
repeated SIGKILLs of workers and a database restart.

4 real `python -m jobq worker` processes serve the queue `limited` (`tests/chaos/limited.py`:
at most 2 jobs of one concurrency key running, at most 5 claims of one key in any 1 s). One of
them is SIGKILLed (and replaced) every ~2 s, and the suite's PostgreSQL is restarted once
(`pg_ctl stop -m fast`, then start) during the drain of 10,000 jobs over 500 keys. The limits
are checked from the journal (`tests/chaos/journal.py`), not from the engine's own counters:

- `max_running_per_key`: the most executions of one key that overlapped at any instant. An
  execution runs from its start to its end as the handler recorded them; one without an end
  (its worker was killed mid-run, or its own query failed in the outage) is taken to last until
  its claim left `job_running` (the rescue, or its failure's record): the longest it can have
  run, and what the limit counts.
- `max_claims_per_key`: the same over the claims themselves (a job's stay in `job_running`,
  from the journal's rows of the claim and of its end): what the limit is defined on.
- `max_starts_per_key_window`: the most claims of one key within any window of the rate's
  period (half-open, at the claim times the workers gave, which the rate windows count).

The same workers serve `global` too (at most 40 running of 64 slots, 150 claims in any 1 s;
6,000 jobs without a key), whose limits bind now and then: `global_max_running`,
`global_max_claims` and `global_max_starts_window` are the same figures over the whole queue.

Then the suite's invariants (nothing lost, ...) and `python -m jobq check`; one JSON line.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

import pytest

from jobq import db
from jobq.db import Connection
from jobq.queue import Job, enqueue_many
from tests.chaos import limited
from tests.chaos.helpers import (
    WORKER_ENV,
    emit,
    remaining,
    settings_of,
    verify,
)
from tests.chaos.journal import Analysis
from tests.toolkit.handlers import JOB_TYPE
from tests.toolkit.postgres import PostgresInstance
from tests.toolkit.procs import Procs, check_running, registered, stop_workers

pytestmark = pytest.mark.chaos

LIMITS_JOBS = 10_000
LIMITS_KEYS = 500
LIMITS_WORKERS = 4
LIMITS_SLEEP_S = 0.2
"""Each job sleeps 200 ms: a key with its 2 jobs running could start 10 a second, so its rate
(5 per second) binds as well as its concurrency."""
GLOBAL_JOBS = 6_000
"""Jobs of `global` (no key), drained beside the keyed ones: about 40 s at its limits."""
KILL_EVERY_S = (1.5, 2.5)
RESTART_AFTER_S = 12.0
"""The database restart comes in place of the first kill due after this many seconds."""
DOWN_S = 2.0
DRAIN_WITHIN_S = 150.0


async def enqueue_limited(count: int, keys: int, queue: str = limited.QUEUE) -> set[int]:
    """Enqueue `count` `chaos_run` jobs on `queue`, key by key (`key-0`'s jobs first, so that
    the limits of the first keys bind at once); return their ids."""
    per_key = count // keys
    jobs = [
        Job(
            job_type=JOB_TYPE,
            arguments={"n": n, "sleep_s": LIMITS_SLEEP_S, "queue": queue},
            queue=queue,
            concurrency_key=f"key-{n // per_key}",
        )
        for n in range(count)
    ]
    ids: set[int] = set()
    for start in range(0, count, 5000):
        ids.update(await enqueue_many(jobs[start : start + 5000]))
    assert len(ids) == count
    return ids


def max_overlap(intervals: list[tuple[datetime, datetime]]) -> int:
    """The most intervals (start, end), half-open, that overlap at one instant."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = current = 0
    for _, step in events:  # at equal times an end (-1) sorts before a start
        current += step
        most = max(most, current)
    return most


def max_in_window(times: list[datetime], period: timedelta) -> int:
    """The most of `times` within any half-open window [t, t + period)."""
    ordered = sorted(times)
    most = 0
    last = 0
    for first, start in enumerate(ordered):
        last = max(last, first)
        while last < len(ordered) and ordered[last] < start + period:
            last += 1
        most = max(most, last - first)
    return most


def limit_figures(
    analysis: Analysis, period: timedelta, job_ids: set[int], per_key: bool = True
) -> dict[str, Any]:
    """The per-key figures of the journal (see the module's docstring) for the jobs `job_ids`;
    not `per_key`: the whole queue's, as of one key."""
    executions: dict[str, list[tuple[datetime, datetime]]] = defaultdict(list)
    stays: dict[str, list[tuple[datetime, datetime]]] = defaultdict(list)
    starts: dict[str, list[datetime]] = defaultdict(list)
    unended = 0
    for job_id, claims in analysis.claims.items():
        if job_id not in job_ids:
            continue
        for claim in claims:
            key = claim.concurrency_key if per_key else ""
            assert key is not None, f"claim {claim.token} of job {claim.job_id} has no key"
            assert claim.clock_at is not None
            assert claim.ended_at is not None, f"claim {claim.token} never ended"
            starts[key].append(claim.clock_at)
            stays[key].append((claim.claimed_at, claim.ended_at))
            for execution in claim.executions:
                if execution.finished_at is None:
                    unended += 1
                end = execution.finished_at or claim.ended_at
                executions[key].append((execution.started_at, end))
    running = {key: max_overlap(spans) for key, spans in executions.items()}
    held = {key: max_overlap(spans) for key, spans in stays.items()}
    window = {key: max_in_window(times, period) for key, times in starts.items()}
    rate = limited.RATE_PER_KEY.max_starts
    # the claims of the first key over its rate, to tell what happened: (token, worker, claim
    # time as the worker gave it, as the journal saw it)
    over_rate = [
        (c.token, c.worker_id, str(c.clock_at), str(c.claimed_at))
        for key in sorted(k for k, n in window.items() if n > rate)[:1]
        for claims in analysis.claims.values()
        for c in sorted(claims, key=lambda c: c.claimed_at)
        if c.concurrency_key == key
    ]
    limit = limited.MAX_RUNNING_PER_KEY
    return {
        "keys": len(starts),
        "max_running_per_key": max(running.values()),
        "max_claims_per_key": max(held.values()),
        "max_starts_per_key_window": max(window.values()),
        "keys_over_running_limit": sorted(k for k, n in running.items() if n > limit),
        "keys_over_claims_limit": sorted(k for k, n in held.items() if n > limit),
        "keys_over_rate": sorted(k for k, n in window.items() if n > rate),
        "keys_at_running_limit": sum(n == limit for n in running.values()),
        "keys_at_rate": sum(n == rate for n in window.values()),
        "executions_without_end": unended,
        "over_rate_claims": sorted(over_rate, key=lambda c: c[2]),
    }


async def restart(server: PostgresInstance) -> dict[str, float]:
    """`pg_ctl stop -m fast`, `DOWN_S` down, `pg_ctl start`; return how long each part took."""
    stopping = time.monotonic()
    await asyncio.to_thread(server.stop, "fast")
    down = time.monotonic()
    await asyncio.sleep(DOWN_S)
    starting = time.monotonic()
    await asyncio.to_thread(server.start)
    up = time.monotonic()
    return {
        "stop_s": round(down - stopping, 3),
        "down_s": round(starting - down, 3),
        "start_s": round(up - starting, 3),
    }


@pytest.mark.timeout(300)
async def test_per_key_concurrency_and_rate_limits_hold_through_sigkills_and_a_restart(
    procs: Procs,
    chaos_conn: Connection,
    database_url: str,
    postgres: PostgresInstance,
    opened: list[Connection],
) -> None:
    conn = chaos_conn
    env = {
        **WORKER_ENV,
        "JOBQ_JOB_MODULES": "tests.chaos.limited_worker",
        "JOBQ_QUEUES": f"{limited.QUEUE}:16,{limited.GLOBAL}:16",
    }
    live = [await procs.worker(conn, f"worker-{i}", env) for i in range(LIMITS_WORKERS)]

    started = time.monotonic()
    keyed = await enqueue_limited(LIMITS_JOBS, LIMITS_KEYS)
    global_ = await enqueue_limited(GLOBAL_JOBS, 1, limited.GLOBAL)
    ids = keyed | global_
    kills: list[tuple[int, datetime]] = []  # (worker id, when)
    restarted: dict[str, Any] = {}
    spawned = LIMITS_WORKERS
    rng = random.Random(8)
    while await remaining(conn) > 0:
        elapsed = time.monotonic() - started
        assert elapsed < DRAIN_WITHIN_S, f"the queue did not drain in {DRAIN_WITHIN_S:g} s"
        await asyncio.sleep(rng.uniform(*KILL_EVERY_S))
        check_running(tuple(p for p in live if p.worker_id is not None))
        if not restarted and time.monotonic() - started >= RESTART_AFTER_S:
            for proc in live:  # a worker that starts while the server is down would exit
                if proc.worker_id is None:
                    proc.worker_id = await registered(conn, proc)
            restarted = {"at_s": round(time.monotonic() - started, 1), **await restart(postgres)}
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
        if not victims or await remaining(conn) == 0:
            continue
        victim = rng.choice(victims)
        assert victim.worker_id is not None
        kills.append((victim.worker_id, victim.send(signal.SIGKILL)))
        assert await victim.exit_code(within=5) == -signal.SIGKILL
        live.remove(victim)
        live.append(procs.start("worker", f"worker-{spawned}", env))
        spawned += 1
    drain_s = time.monotonic() - started

    exit_codes = await stop_workers(conn, live, within=10)

    analysis, figures, assert_invariants = await verify(conn, database_url, ids, dict(kills))
    limits = limit_figures(analysis, limited.RATE_PER_KEY.period, keyed)
    whole = limit_figures(analysis, limited.RATE.period, global_, per_key=False)
    rate = limited.RATE_PER_KEY
    emit(
        {
            "scenario": "limits_under_sigkill_and_restart",
            **figures,
            "keys": limits["keys"],
            "max_running_per_key": limits["max_running_per_key"],
            "max_claims_per_key": limits["max_claims_per_key"],
            "max_starts_per_key_window": limits["max_starts_per_key_window"],
            "limit_running_per_key": limited.MAX_RUNNING_PER_KEY,
            "limit_rate_per_key": f"{rate.max_starts}/{rate.period.total_seconds():g}s",
            "keys_at_running_limit": limits["keys_at_running_limit"],
            "keys_at_rate": limits["keys_at_rate"],
            "executions_without_end": limits["executions_without_end"],
            "keys_over_rate": limits["keys_over_rate"][:10],
            "over_rate_claims": limits["over_rate_claims"],
            "global_max_running": whole["max_running_per_key"],
            "global_max_claims": whole["max_claims_per_key"],
            "global_max_starts_window": whole["max_starts_per_key_window"],
            "global_limits": f"{limited.MAX_RUNNING} running, "
            f"{limited.RATE.max_starts}/{limited.RATE.period.total_seconds():g}s",
            "workers": LIMITS_WORKERS,
            "kills": len(kills),
            "restart": restarted,
            "drain_s": round(drain_s, 1),
            "jobs_per_s": round(LIMITS_JOBS / drain_s),
            "job_sleep_s": LIMITS_SLEEP_S,
            **settings_of(env),
        }
    )
    assert_invariants()
    assert figures["lost"] == 0
    assert limits["keys"] == LIMITS_KEYS
    over = {k: limits[k][:10] for k in ("keys_over_running_limit", "keys_over_claims_limit")}
    assert limits["max_running_per_key"] <= limited.MAX_RUNNING_PER_KEY, over
    assert limits["max_claims_per_key"] <= limited.MAX_RUNNING_PER_KEY, over
    assert limits["max_starts_per_key_window"] <= rate.max_starts, (
        limits["keys_over_rate"][:10],
        limits["over_rate_claims"],
    )
    # the limits did bind (else the scenario proves nothing), and the faults happened
    assert limits["max_running_per_key"] == limited.MAX_RUNNING_PER_KEY
    assert limits["max_starts_per_key_window"] == rate.max_starts
    # `global`: its limits held under the faults, and bound
    assert whole["max_running_per_key"] <= limited.MAX_RUNNING, whole
    assert whole["max_claims_per_key"] <= limited.MAX_RUNNING, whole
    assert whole["max_starts_per_key_window"] <= limited.RATE.max_starts, whole
    assert whole["max_running_per_key"] == limited.MAX_RUNNING, whole
    assert len(kills) >= 10, "too few kills to mean anything: the drain was too fast"
    assert restarted, "the drain ended before the database restart"
    assert exit_codes == [0] * len(live)
