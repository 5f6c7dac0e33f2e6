"""Chaos scenarios that hit worker processes: SIGKILL, SIGSTOP/SIGCONT, SIGTERM under load.

Each runs real `python -m jobq worker` processes on the suite's own PostgreSQL, records every
execution and every move between the queue tables (`tests/chaos/journal.py`), ends with the
invariants and `python -m jobq check`, and prints one JSON line of figures (also appended to
`.chaos/results.jsonl`).
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from datetime import datetime, timedelta

import pytest

from jobq import clock, db
from jobq.check import check
from jobq.db import Connection
from jobq.errors import Conflict
from jobq.queue import control
from jobq.queue.control import JobState
from tests.chaos.helpers import (
    WORKER_ENV,
    drained,
    emit,
    enqueue_jobs,
    remaining,
    settings_of,
    utcnow,
    verify,
)
from tests.chaos.journal import Analysis, seconds
from tests.toolkit.procs import Procs, eventually, stop_workers

pytestmark = pytest.mark.chaos


async def sample_check(conn: Connection, stop: asyncio.Event, samples: list[list[str]]) -> None:
    """Run `jobq.check` (no job in two places, ...) every 0.25 s while the scenario goes on,
    until `stop`; append the names of the invariants that failed (none: an empty list)."""
    while not stop.is_set():
        report = await check(conn, now=clock.now(), heartbeat_grace=timedelta(seconds=3))
        samples.append([i.name for i in report.invariants if not i.ok])
        try:
            async with asyncio.timeout(0.25):
                await stop.wait()
        except TimeoutError:
            pass


# -- 1. repeated SIGKILL ----------------------------------------------------------------------

KILL_JOBS = 10_000
KILL_WORKERS = 4
KILL_EVERY_S = (1.5, 2.5)
KILL_SLEEP_S = 0.25
"""Each job sleeps 250 ms: with 16 slots per worker, every worker holds jobs mid-run (and
mid-ack) at every instant, and the 10,000 jobs take about a minute: some 25 kills."""
CANCELS_PER_KILL = 8
"""Between two kills, cancels of jobs picked at random (queued, running or finished), and of
`RUNNING_CANCELS_PER_KILL` more picked among those running then."""
RUNNING_CANCELS_PER_KILL = 3


async def cancel_some(
    conn: Connection, ids: list[int], rng: random.Random, cancelled_at: dict[int, datetime]
) -> dict[str, int]:
    """Cancel `CANCELS_PER_KILL` jobs of `ids` at random; note when each cancel that took
    effect had committed (`cancelled_at`); return how many ended cancelled, were told while
    running, or were refused (finished already)."""
    counts = {"cancelled": 0, "running": 0, "refused": 0}
    running = await conn.fetch(
        "SELECT id FROM job_running ORDER BY random() LIMIT $1", RUNNING_CANCELS_PER_KILL
    )
    for job_id in [*rng.sample(ids, CANCELS_PER_KILL), *(r["id"] for r in running)]:
        if job_id in cancelled_at:
            continue
        try:
            state = (await control.cancel(conn, job_id, now=clock.now(), retain=True)).state
        except Conflict:
            counts["refused"] += 1
            continue
        cancelled_at[job_id] = utcnow()  # after the COMMIT (autocommit) returned
        counts["cancelled" if state is JobState.CANCELLED else "running"] += 1
    return counts


@pytest.fixture(params=["direct", "pgbouncer"])
def via(request: pytest.FixtureRequest, database_url: str) -> dict[str, str]:
    """The workers' database settings: straight to the server, or their pools through
    PgBouncer in transaction mode (their sessions still direct)."""
    if request.param == "direct":
        return {}
    pooled: str = request.getfixturevalue("pgbouncer_url")
    return {"DATABASE_URL": pooled, "JOBQ_DIRECT_DATABASE_URL": database_url}


@pytest.mark.timeout(400)
async def test_repeated_sigkill_loses_nothing_and_reruns_only_the_killed_workers_jobs(
    procs: Procs, chaos_conn: Connection, database_url: str, via: dict[str, str]
) -> None:
    conn = chaos_conn
    env = {**WORKER_ENV, **via}
    live = [await procs.worker(conn, f"worker-{i}", env) for i in range(KILL_WORKERS)]
    sampler_conn = await db.connect(database_url)
    stop_sampling = asyncio.Event()
    samples: list[list[str]] = []
    sampler = asyncio.create_task(sample_check(sampler_conn, stop_sampling, samples))

    started = time.monotonic()
    ids = await enqueue_jobs(KILL_JOBS, sleep_s=KILL_SLEEP_S)
    kills: list[tuple[int, datetime]] = []  # (worker id, when)
    spawned = KILL_WORKERS
    rng = random.Random(4)
    cancelled_at: dict[int, datetime] = {}
    cancels: dict[str, int] = {"cancelled": 0, "running": 0, "refused": 0}
    pickable = sorted(ids)
    try:
        while await remaining(conn) > 0:
            assert time.monotonic() - started < 300, "the queue did not drain in 300 s"
            await asyncio.sleep(rng.uniform(*KILL_EVERY_S))
            for outcome, n in (await cancel_some(conn, pickable, rng, cancelled_at)).items():
                cancels[outcome] += n
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
    finally:
        stop_sampling.set()
        await sampler
        await sampler_conn.close()

    exit_codes = await stop_workers(conn, live, within=10)

    died_at = dict(kills)
    analysis, figures, assert_invariants = await verify(conn, database_url, ids, died_at)
    # Every rescue must be of a killed worker's claim, after the kill (its claim may have been
    # made after the kill: a claim statement in flight when the process died).
    rescue_s: list[float] = []
    reclaim_s: list[float] = []
    rescued_from_live = []
    for claim in analysis.rescued():
        killed_at = died_at.get(claim.worker_id)
        assert claim.ended_at is not None
        if killed_at is None or claim.ended_at < killed_at:
            rescued_from_live.append(claim)
            continue
        rescue_s.append((claim.ended_at - killed_at).total_seconds())
        again = analysis.next_claim(claim)
        if again is not None:
            reclaim_s.append((again.claimed_at - killed_at).total_seconds())
    held = sum(len(analysis.claims_held_at(w, at)) for w, at in kills)
    # Only jobs whose worker died mid-run may run twice: every execution but the last one of
    # such a job was the killed worker's.
    run_twice_by_killed = [
        job_id
        for job_id in analysis.run_twice()
        if all(c.worker_id in died_at for c in analysis.claims[job_id][:-1] if c.executions)
    ]
    started_after_cancel = analysis.started_after_cancel(cancelled_at)
    emit(
        {
            "scenario": "repeated_sigkill",
            "via": "pgbouncer" if via else "direct",
            **figures,
            "workers": KILL_WORKERS,
            "kills": len(kills),
            "jobs_held_at_kills": held,
            "cancels": sum(cancels.values()),
            "cancels_took_effect": cancels["cancelled"] + cancels["running"],
            "cancels_of_running_jobs": cancels["running"],
            "cancels_refused": cancels["refused"],
            "ended_cancelled": len(analysis.cancelled),
            "started_after_cancel": len(started_after_cancel),
            "run_twice_by_killed_workers": len(run_twice_by_killed),
            "rescue_p50_s": seconds(rescue_s, 0.5),
            "rescue_max_s": seconds(rescue_s, 1.0),
            "reclaim_p50_s": seconds(reclaim_s, 0.5),
            "reclaim_max_s": seconds(reclaim_s, 1.0),
            "check_samples": len(samples),
            "check_failed_samples": sum(bool(failed) for failed in samples),
            "drain_s": round(drain_s, 1),
            "jobs_per_s": round(KILL_JOBS / drain_s),
            "job_sleep_s": KILL_SLEEP_S,
            **settings_of(env),
        }
    )
    assert_invariants()
    assert [failed for failed in samples if failed] == []
    assert len(samples) > 10
    assert len(kills) >= 10, "too few kills to mean anything: the drain was too fast"
    # every cancel that took effect ended its job cancelled, and none started after it
    assert started_after_cancel == []
    assert analysis.cancelled == set(cancelled_at)
    assert cancels["running"] > 0, "no cancel reached a running job: the scenario proves little"
    assert held > 0
    assert rescued_from_live == []
    assert len(rescue_s) == figures["claims_ended"]["rescue"] >= held
    assert figures["run_twice"] == len(run_twice_by_killed)
    assert exit_codes == [0] * len(live)
    assert max(rescue_s) <= 3.0, f"rescue took up to {max(rescue_s):.2f} s after a kill"
    # A rescued job keeps its place in the queue: it is claimed again at once, not after the
    # backlog that ripened after it.
    assert max(reclaim_s) <= 3.0, f"re-claim took up to {max(reclaim_s):.1f} s after a kill"


# -- 2. hung worker ---------------------------------------------------------------------------

HUNG_JOBS = 8
HUNG_SLEEP_S = 8.0
HUNG_RESLEEP_S = 4.0
"""A's attempts sleep 8 s: it is stopped mid-sleep, once B has started (an interpreter's start
took 2.3 s on a loaded CI machine, longer than the 2 s this was, and A's jobs had ended), and
resumed past their end (a lease, 10 s, after the stop), so they end at once. B's re-runs sleep
4 s, so that A resumes, finishes and tries to record its outcomes while B still runs the same
jobs: only the fencing token tells A's late outcome from B's."""


@pytest.mark.timeout(120)
async def test_hung_worker_loses_its_jobs_after_its_lease_and_its_late_outcomes_are_rejected(
    procs: Procs, chaos_conn: Connection, database_url: str
) -> None:
    conn = chaos_conn
    env = dict(WORKER_ENV)
    a = await procs.worker(conn, "worker-a", env)
    half = HUNG_JOBS // 2
    ids = await enqueue_jobs(half, sleep_s=HUNG_SLEEP_S, resleep_s=HUNG_RESLEEP_S)
    ids |= await enqueue_jobs(
        half, first=half, sleep_s=HUNG_SLEEP_S, resleep_s=HUNG_RESLEEP_S, fail_first=True
    )

    async def executions_by(worker_id: int | None) -> bool:
        count: int = await conn.fetchval(
            "SELECT count(DISTINCT job_id) FROM execution WHERE worker_id = $1", worker_id
        )
        return count == HUNG_JOBS

    await eventually(lambda: executions_by(a.worker_id), within=10, what="A to start the jobs")
    b = await procs.worker(conn, "worker-b", env)
    stopped_at = a.send(signal.SIGSTOP)
    await eventually(
        lambda: executions_by(b.worker_id),
        within=10 + 10,
        what="B to re-run the hung worker's jobs",
        running=(b,),
    )
    resumed_at = a.send(signal.SIGCONT)

    async def a_finished() -> bool:
        count: int = await conn.fetchval(
            "SELECT count(*) FROM execution WHERE worker_id = $1 AND finished_at IS NOT NULL",
            a.worker_id,
        )
        return count == HUNG_JOBS

    await eventually(a_finished, within=5, what="A to finish its stale runs", running=(a, b))
    await drained(conn, within=HUNG_RESLEEP_S + 10, running=(a, b))
    for proc in (a, b):
        proc.send(signal.SIGTERM)
    exit_codes = [await a.exit_code(within=10), await b.exit_code(within=10)]
    a_counts, b_counts = a.final_counts(), b.final_counts()

    assert a.worker_id is not None
    assert b.worker_id is not None
    analysis, figures, assert_invariants = await verify(
        conn, database_url, ids, {a.worker_id: stopped_at}
    )
    rescue_s = [
        (c.ended_at - stopped_at).total_seconds()
        for c in analysis.claims_held_at(a.worker_id, stopped_at)
        if c.ended_at is not None
    ]
    reclaim_s = []
    late = 0  # A's runs that ended while B's claim of the same job was still running
    for job_id in ids:
        first, second = analysis.claims[job_id][:2]
        reclaim_s.append((second.claimed_at - stopped_at).total_seconds())
        (a_run,) = first.executions
        if (
            a_run.finished_at is not None
            and second.ended_at is not None
            and a_run.finished_at < second.ended_at
        ):
            late += 1
    emit(
        {
            "scenario": "hung_worker",
            **figures,
            "hung_s": round((resumed_at - stopped_at).total_seconds(), 3),
            "rescue_p50_s": seconds(rescue_s, 0.5),
            "rescue_max_s": seconds(rescue_s, 1.0),
            "reclaim_p50_s": seconds(reclaim_s, 0.5),
            "reclaim_max_s": seconds(reclaim_s, 1.0),
            "late_acks_rejected": a_counts.get("rejected", 0),
            "late_outcomes_while_rerun_held": late,
            "hung_worker_counts": a_counts,
            **settings_of(env),
        }
    )
    assert_invariants()
    assert exit_codes == [0, 0]
    assert len(rescue_s) == HUNG_JOBS
    lease_s = float(env["JOBQ_LEASE_S"])
    heartbeat_s = float(env["JOBQ_HEARTBEAT_INTERVAL_S"])
    # Rescued when the lease expires: at most a lease after the last heartbeat before the stop,
    # plus a rescue interval (and some slack for a busy machine); not before.
    assert lease_s - heartbeat_s - 0.5 <= min(rescue_s)
    assert max(rescue_s) <= lease_s + 2
    # A's late outcomes: 4 completions and 4 failures, all rejected by the fencing token while
    # B still held the same jobs; B recorded every outcome.
    assert late == HUNG_JOBS
    assert a_counts.get("rejected") == HUNG_JOBS
    assert not {"completed", "retried", "buried"} & set(a_counts)
    assert b_counts.get("completed") == HUNG_JOBS
    for job_id in ids:
        done = analysis.completion(job_id)
        assert done is not None
        assert done.worker_id == b.worker_id
        assert [c.end for c in analysis.claims[job_id]] == ["rescue", "complete"]


# -- 5. graceful stop under load --------------------------------------------------------------

STOP_JOBS = 100
STOP_DRAIN_S = 5
STOP_SHORT_S = (0.5, 3.5)
STOP_LONG_S = 60.0


@pytest.mark.timeout(120)
async def test_sigterm_with_100_jobs_running_acks_the_finished_and_releases_the_rest(
    procs: Procs, chaos_conn: Connection, database_url: str
) -> None:
    conn = chaos_conn
    env = {
        **WORKER_ENV,
        "JOBQ_MAX_CONCURRENT_JOBS": str(STOP_JOBS),
        "JOBQ_DRAIN_TIMEOUT_S": str(STOP_DRAIN_S),
    }
    a = await procs.worker(conn, "worker-a", env)
    rng = random.Random(5)
    short: set[int] = set()
    for n in range(STOP_JOBS // 2):
        short |= await enqueue_jobs(1, first=n, sleep_s=round(rng.uniform(*STOP_SHORT_S), 3))
    long = await enqueue_jobs(
        STOP_JOBS - len(short), first=STOP_JOBS, sleep_s=STOP_LONG_S, resleep_s=0
    )
    ids = short | long

    async def all_running() -> bool:
        count: int = await conn.fetchval("SELECT count(DISTINCT job_id) FROM execution")
        return count == STOP_JOBS

    await eventually(all_running, within=10, what="100 jobs to run", running=(a,))
    term_at = a.send(signal.SIGTERM)
    code = await a.exit_code(within=STOP_DRAIN_S + 5)
    stop_s = (utcnow() - term_at).total_seconds()
    a_counts = a.final_counts()
    assert a.worker_id is not None

    at_stop = await Analysis.load(conn, ids)
    ends = {job_id: [c.end for c in at_stop.claims[job_id]] for job_id in ids}
    queued = await conn.fetch(
        "SELECT id, attempts FROM job WHERE id = ANY($1::bigint[])", sorted(ids)
    )
    b = await procs.worker(conn, "worker-b", WORKER_ENV)
    await drained(conn, within=20, running=(b,))
    b.send(signal.SIGTERM)
    assert await b.exit_code(within=10) == 0

    analysis, figures, assert_invariants = await verify(conn, database_url, ids, {})
    emit(
        {
            "scenario": "graceful_stop",
            **figures,
            "running_at_sigterm": STOP_JOBS,
            "stop_s": round(stop_s, 3),
            "exit_code": code,
            "acked": sum(e == ["complete"] for e in ends.values()),
            "released": sum(e == ["release"] for e in ends.values()),
            "released_attempts_charged": sum(r["attempts"] for r in queued),
            "worker_counts": a_counts,
            **settings_of(env),
        }
    )
    assert_invariants()
    assert code == 0
    assert stop_s <= STOP_DRAIN_S + 1
    assert {job_id: ends[job_id] for job_id in short} == {job_id: ["complete"] for job_id in short}
    assert {job_id: ends[job_id] for job_id in long} == {job_id: ["release"] for job_id in long}
    assert sorted(r["id"] for r in queued) == sorted(long)
    assert all(r["attempts"] == 0 for r in queued)  # a release charges no attempt
    assert a_counts == {"claimed": STOP_JOBS, "completed": len(short), "released": len(long)}
    for job_id in long:  # cancelled mid-sleep, then run again (at once) by B
        first, second = analysis.executions[job_id]
        assert first.finished_at is None
        assert second.outcome == "ok"
        assert (first.attempt, second.attempt) == (1, 1)
