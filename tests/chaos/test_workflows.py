"""Chaos scenario for workflows, batches and sequences: dependencies hold through repeated
SIGKILLs of workers and a database restart (guarantee 16).

4 real `python -m jobq worker` processes (8 slots each) run, while one of them is SIGKILLed
(and replaced) every 1 to 2 s, or sooner once a fifteenth of the jobs have started since the
last kill (so a fast machine sees as many kills as a slow one), and the suite's PostgreSQL is
restarted once:

- 200 workflows of 10 `recorded` steps: a root; 6 steps after it (the 5th after the 4th); a
  join after 3 of them; a callback after the 8 before it that runs whatever their outcomes; a
  last step after the callback. In every 10th workflow the 4th step fails for good, so the 5th
  is cancelled, and the callback still runs.
- one workflow with a fan-out of 100 steps after a root, and a fan-in callback after them all.
- 50 sequences of 20 jobs, enqueued 5 at a time (each enqueue in its own transaction) while the
  workers run.

Checked from the journal (`tests/chaos/journal.py`) and the execution table, not from the
engine's own counters: `started_before_dependencies` (a job started before a job it waits for
had ended, or before it had succeeded when its failure cancels it: from the first start of the
job, and the commit of the transaction that recorded the other's end), `callbacks_twice` (a
job that waited and entered the queue in more than one transaction that did not take it out of
`job_running`: moved twice), `cancelled_that_ran`, `sequence_out_of_order` (a sequence's job
that started before the one enqueued before it had ended: out of order, or two at once), and
`workflows_unfinished`. Then the suite's invariants (nothing lost, ...) and `python -m jobq
check`; one JSON line.

The issue's sizes, run in under a minute on 2 cores: 2,000 steps in workflows, a fan-out of
100 and 1,000 jobs of sequences, each sleeping 0 to 300 ms (a kill finds jobs mid-run).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import signal
import time
from collections import defaultdict
from datetime import datetime
from typing import Any

import pytest

from jobq import clock, db
from jobq.db import Connection
from jobq.queue import Job, Workflow, enqueue_workflow
from jobq.queue.workflows import WorkflowState, find_workflow
from tests.chaos.helpers import WORKER_ENV, emit, settings_of, verify
from tests.chaos.test_limits import restart
from tests.toolkit.handlers import JOB_TYPE
from tests.toolkit.postgres import PostgresInstance
from tests.toolkit.procs import Procs, check_running, registered, stop_workers

pytestmark = pytest.mark.chaos

WORKFLOWS = 200
FANOUT = 100
SEQUENCES = 50
SEQUENCE_JOBS = 20
SEQUENCE_CHUNK = 5
WORKERS = 4
SLEEP_S = (0.0, 0.3)
KILL_EVERY_S = (1.0, 2.0)
KILL_EVERY_JOBS = (WORKFLOWS * 10 + FANOUT + 2 + SEQUENCES * SEQUENCE_JOBS) // 15
"""A kill comes at the latest once this many executions have started since the last one."""
RESTART_AFTER_S = 8.0
FINISH_WITHIN_S = 110.0

REMAINING = """
SELECT (SELECT count(*) FROM job WHERE job_type = $1)
     + (SELECT count(*) FROM job_running WHERE job_type = $1)
     + (SELECT count(*) FROM job_waiting)
"""


def recorded(rng: random.Random, n: int, *, fail: bool = False) -> Job:
    return Job(
        job_type=JOB_TYPE,
        arguments={"n": n, "sleep_s": rng.uniform(*SLEEP_S), "resleep_s": 0, "fail_first": fail},
        max_retries=0 if fail else 10,
    )


def ten_steps(rng: random.Random, w: int) -> Workflow:
    flow = Workflow(f"chaos-{w}")
    n = w * 100
    root = flow.add(recorded(rng, n), name="root")
    broken = w % 10 == 0  # its s4 fails for good: s5 is cancelled
    mids = [
        flow.add(recorded(rng, n + i, fail=broken and i == 4), name=f"s{i}", after=[root])
        for i in range(1, 5)
    ]
    mids.append(flow.add(recorded(rng, n + 5), name="s5", after=[mids[3]]))
    mids.append(flow.add(recorded(rng, n + 6), name="s6", after=[root]))
    join = flow.add(recorded(rng, n + 7), name="join", after=mids[:3])
    callback = flow.add(
        recorded(rng, n + 8), name="callback", after=[*mids, join], on_dependency_failure="run"
    )
    flow.add(recorded(rng, n + 9), name="last", after=[callback])
    return flow


def fan(rng: random.Random) -> Workflow:
    flow = Workflow("chaos-fan")
    root = flow.add(recorded(rng, 90_000), name="root")
    legs = [flow.add(recorded(rng, 90_001 + i), after=[root]) for i in range(FANOUT)]
    flow.add(recorded(rng, 90_500), name="callback", after=legs, on_dependency_failure="run")
    return flow


async def enqueue_sequences(rng: random.Random, orders: dict[str, list[int]]) -> None:
    """Each sequence's jobs, `SEQUENCE_CHUNK` at a time in an enqueue of their own, the keys
    taking turns, a few milliseconds apart (the workers run meanwhile)."""
    for chunk in range(SEQUENCE_JOBS // SEQUENCE_CHUNK):
        for s in range(SEQUENCES):
            key = f"seq-{s}"
            flow = Workflow()
            for i in range(SEQUENCE_CHUNK):
                n = 100_000 + s * 100 + chunk * SEQUENCE_CHUNK + i
                flow.add(recorded(rng, n), sequence=key)
            made = await enqueue_workflow(flow)
            orders[key] += made.job_ids
            await asyncio.sleep(0.005)


async def ended_at(conn: Connection, ids: list[int]) -> dict[int, datetime]:
    """When each job ended, as the commit of the transaction that put it in job_done or
    job_dead (the journal's last trigger time of that transaction)."""
    rows = await conn.fetch(
        "SELECT job_id, min(committed_at) AS at FROM ("
        "  SELECT job_id, tbl, max(at) OVER (PARTITION BY xid) AS committed_at"
        "  FROM chaos_journal) AS j"
        " WHERE job_id = ANY($1::bigint[]) AND tbl IN ('job_done', 'job_dead')"
        " GROUP BY job_id",
        ids,
    )
    return {r["job_id"]: r["at"] for r in rows}


async def entries(conn: Connection, ids: list[int]) -> dict[int, int]:
    """How many transactions put each job into `job` without taking it out of `job_running`:
    its enqueue, or the move of a job that waited; never more than one."""
    rows = await conn.fetch(
        "SELECT a.job_id, count(*) AS n FROM chaos_journal AS a"
        " WHERE a.tbl = 'job' AND a.job_id = ANY($1::bigint[])"
        "   AND NOT EXISTS (SELECT FROM chaos_journal AS d WHERE d.xid = a.xid"
        "                   AND d.job_id = a.job_id AND d.tbl = 'job_running' AND d.op = 'delete')"
        " GROUP BY a.job_id",
        ids,
    )
    return {r["job_id"]: r["n"] for r in rows}


async def flow_figures(
    conn: Connection, ids: list[int], starts: dict[int, datetime], orders: dict[str, list[int]]
) -> dict[str, Any]:
    ends = await ended_at(conn, ids)
    outcome = {
        r["job_id"]: r["outcome"]
        for r in await conn.fetch(
            "SELECT job_id, outcome FROM job_flow WHERE job_id = ANY($1::bigint[])", ids
        )
    }
    early = []
    for e in await conn.fetch(
        "SELECT depends_on, job_id, cancels FROM job_dependency WHERE job_id = ANY($1::bigint[])",
        ids,
    ):
        start = starts.get(e["job_id"])
        if start is None:
            continue
        end = ends.get(e["depends_on"])
        if (
            end is None
            or start <= end
            or (e["cancels"] and outcome[e["depends_on"]] != "succeeded")
        ):
            early.append((e["depends_on"], e["job_id"]))
    waited = [
        r["job_id"]
        for r in await conn.fetch(
            "SELECT DISTINCT job_id FROM job_dependency WHERE job_id = ANY($1::bigint[])", ids
        )
    ]
    moved = await entries(conn, ids)
    out_of_order = []
    for key, order in orders.items():
        for before, after in itertools.pairwise(order):
            start, end = starts.get(after), ends.get(before)
            if start is None or end is None or start <= end:
                out_of_order.append((key, before, after))
    return {
        "started_before_dependencies": len(early),
        "callbacks_twice": sum(moved.get(j, 0) > 1 for j in waited),
        "entered_queue_twice": sum(n > 1 for n in moved.values()),
        "cancelled_that_ran": sum(outcome.get(j) == "cancelled" and j in starts for j in ids),
        "sequence_out_of_order": len(out_of_order),
        "early_sample": early[:5],
        "out_of_order_sample": out_of_order[:5],
    }


async def until_next_kill(conn: Connection, seconds: float) -> None:
    """Wait `seconds`, or less: until `KILL_EVERY_JOBS` executions have started meanwhile."""
    deadline = time.monotonic() + seconds
    before: int = await conn.fetchval("SELECT count(*) FROM execution")
    while time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        if await conn.fetchval("SELECT count(*) FROM execution") - before >= KILL_EVERY_JOBS:
            return


@pytest.mark.timeout(300)
async def test_workflows_hold_their_dependencies_through_sigkills_and_a_restart(
    procs: Procs,
    chaos_conn: Connection,
    database_url: str,
    postgres: PostgresInstance,
    opened: list[Connection],
) -> None:
    conn = chaos_conn
    env = {**WORKER_ENV, "JOBQ_MAX_CONCURRENT_JOBS": "8"}
    rng = random.Random(30)
    live = [await procs.worker(conn, f"worker-{i}", env) for i in range(WORKERS)]

    started = time.monotonic()
    made = [await enqueue_workflow(ten_steps(rng, w)) for w in range(WORKFLOWS)]
    made.append(await enqueue_workflow(fan(rng)))
    orders: dict[str, list[int]] = defaultdict(list)
    sequences = asyncio.create_task(enqueue_sequences(rng, orders))
    kills: list[tuple[int, datetime]] = []
    restarted: dict[str, Any] = {}
    spawned = WORKERS
    while not sequences.done() or await conn.fetchval(REMAINING, JOB_TYPE) > 0:
        elapsed = time.monotonic() - started
        assert elapsed < FINISH_WITHIN_S, f"the workflows did not end in {FINISH_WITHIN_S:g} s"
        await until_next_kill(conn, rng.uniform(*KILL_EVERY_S))
        check_running(tuple(p for p in live if p.worker_id is not None))
        if not restarted and time.monotonic() - started >= RESTART_AFTER_S:
            for proc in live:
                if proc.worker_id is None:
                    proc.worker_id = await registered(conn, proc)
            restarted = {"at_s": round(time.monotonic() - started, 1), **await restart(postgres)}
            with contextlib.suppress(Exception):
                await conn.close()
            conn = await db.connect(database_url)
            opened.append(conn)
            continue
        for proc in live:
            if proc.worker_id is None:
                proc.worker_id = await conn.fetchval(
                    "SELECT id FROM worker WHERE pid = $1", proc.pid
                )
        victims = [p for p in live if p.worker_id is not None]
        if not victims or await conn.fetchval(REMAINING, JOB_TYPE) == 0:
            continue
        victim = rng.choice(victims)
        assert victim.worker_id is not None
        kills.append((victim.worker_id, victim.send(signal.SIGKILL)))
        assert await victim.exit_code(within=5) == -signal.SIGKILL
        live.remove(victim)
        live.append(procs.start("worker", f"worker-{spawned}", env))
        spawned += 1
    await sequences
    finish_s = time.monotonic() - started

    exit_codes = await stop_workers(conn, live, within=10)

    ids = sorted({i for m in made for i in m.job_ids} | {i for o in orders.values() for i in o})
    analysis, figures, assert_invariants = await verify(conn, database_url, set(ids), dict(kills))
    starts = {
        job_id: min(e.started_at for e in executions)
        for job_id, executions in analysis.executions.items()
        if executions
    }
    flows = await flow_figures(conn, ids, starts, orders)
    unfinished = 0
    for m in made:
        assert m.id is not None
        view = await find_workflow(conn, m.id, now=clock.now(), max_steps=0)
        unfinished += view.state is WorkflowState.RUNNING
    emit(
        {
            "scenario": "workflows_under_sigkill_and_restart",
            **figures,
            **{k: v for k, v in flows.items() if not k.endswith("_sample")},
            "workflows": len(made),
            "workflows_unfinished": unfinished,
            "sequences": len(orders),
            "sequence_jobs": sum(len(o) for o in orders.values()),
            "workers": WORKERS,
            "kills": len(kills),
            "restart": restarted,
            "finish_s": round(finish_s, 1),
            **settings_of(env),
        }
    )
    assert_invariants()
    assert figures["lost"] == 0
    assert flows["started_before_dependencies"] == 0, flows["early_sample"]
    assert flows["callbacks_twice"] == 0
    assert flows["entered_queue_twice"] == 0
    assert flows["cancelled_that_ran"] == 0
    assert flows["sequence_out_of_order"] == 0, flows["out_of_order_sample"]
    assert unfinished == 0
    assert len(kills) >= 10, "too few kills to mean anything: the run was too fast"
    assert restarted, "the run ended before the database restart"
    assert exit_codes == [0] * len(live)
