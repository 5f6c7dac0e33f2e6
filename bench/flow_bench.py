"""The workloads of workflows: `workflow_fanout`, `workflow_chain` and `flow_claim_cpu`.
Each function is one run and returns its lines' figures.

What is timed, exactly:

- `workflow_fanout`: two drains in the run, their order alternating from run to run, each by a
  fresh worker process (16 slots) registered before the enqueue, from empty tables: 10,000
  `bench_noop` jobs enqueued plain (`enqueue_many`), and the same 10,000 as a batch whose
  callback (`bench_noop` too) waits for all of them (`enqueue_batch`: a fan-out, then a fan-in).
  Each is timed from the moment the enqueue's COMMIT returned to the moment `job`,
  `job_running` and `job_waiting` are all seen empty (the batch's end includes its callback's
  run). `jobs_per_s`: 10,000 / that time; `ratio_to_plain`: the batch's over the plain one's.
  `cpu_ms_per_job`: the CPU time the worker process and every server backend of the database
  used meanwhile (`/proc/<pid>/schedstat`), per job; `cpu_ratio_to_plain`: the plain drain's
  CPU over the batch's (what the ratio of throughputs is on a machine the drain has to itself:
  a steadier figure than the wall clock's on a shared one). `enqueue_s` / `plain_enqueue_s`:
  the enqueue calls with their COMMIT.
- `workflow_chain`: 1,000 `bench_stamp` jobs each waiting for the one before (a workflow, all
  enqueued at once), then 1,000 `bench_chain` jobs each enqueued by the one before in the
  transaction that records its stamp (the way a chain is made without workflows), each run by
  a worker process (16 slots). A step's time: the wall clock at its handler's start minus the
  one before's. `step_ms_p50` / `p99`, and the whole chain's `total_s`.
- `flow_claim_cpu`: no worker. What the trigger on `job_running` (`job_flow_ran`) costs jobs of
  no workflow. 20,000 `bench_noop` jobs; two connections with the worker's claim session, one
  with `session_replication_role = replica` (ordinary triggers do not fire in its session),
  alternate the worker's cycle (record the 16 outcomes of their last claim and claim 16, one
  statement): `*_cpu_ms`, the mean CPU time of each server backend per cycle
  (`/proc/<pid>/schedstat`; the server must run on this machine). Twice: with `job_flow`
  empty, and with 100,000 rows of finished workflows in it (`job_flow_rows`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import statistics
import time
from datetime import timedelta

from bench.context import Context, Figures
from bench.flow_handlers import CHAIN
from bench.handlers import NOOP, STAMP
from bench.limits_bench import _cpu_ns
from bench.loadgen import percentile
from jobq import clock, db
from jobq.db import Connection
from jobq.queue import Job, Workflow, enqueue, enqueue_batch, enqueue_many, enqueue_workflow, store
from jobq.queue.listener import CLAIM_SESSION
from jobq.queue.model import Outcome, Verdict
from tests.toolkit.procs import Proc, check_running, registered

FANOUT_JOBS = 10_000
CHAIN_STEPS = 1_000
CONCURRENCY = 16
CPU_JOBS = 20_000
CPU_SLOTS = 16
FLOW_ROWS = 100_000
MODULES = "bench.handlers,bench.flow_handlers"

EMPTY = """
SELECT (SELECT id FROM job ORDER BY id LIMIT 1) IS NULL
   AND (SELECT token FROM job_running ORDER BY token LIMIT 1) IS NULL
   AND (SELECT job_id FROM job_waiting ORDER BY job_id LIMIT 1) IS NULL
"""
"""Whether nothing is queued, running or waiting (three index probes)."""


async def _wait_empty(conn: Connection, proc: Proc, within_s: float = 300) -> float:
    """Poll `EMPTY` every 2 ms; return the `time.perf_counter()` it was first seen true."""
    deadline = time.perf_counter() + within_s
    while not await conn.fetchval(EMPTY):
        if time.perf_counter() > deadline:
            raise RuntimeError(f"the jobs did not all end within {within_s:g} s")
        check_running((proc,))
        await asyncio.sleep(0.002)
    return time.perf_counter()


BACKENDS = """
SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
"""


async def _cpu_s(conn: Connection, pid: int) -> dict[int, float]:
    """The CPU seconds so far of process `pid` and of every server backend of the database but
    `conn`'s, by pid (the server must run on this machine)."""
    pids = [pid, *(r["pid"] for r in await conn.fetch(BACKENDS))]
    found = {}
    for p in pids:
        with contextlib.suppress(RuntimeError):  # it ended meanwhile
            found[p] = _cpu_ns(p) / 1e9
    return found


async def _drain(ctx: Context, what: str, batch: bool) -> tuple[float, float, float]:
    """One drain of `FANOUT_JOBS` no-op jobs, plain or as a batch with a callback; return
    (enqueue seconds, drain seconds, CPU seconds of the worker and the server meanwhile)."""
    await ctx.database.reset()
    jobs = [Job(job_type=NOOP, arguments={"i": i}) for i in range(FANOUT_JOBS)]
    proc = ctx.spawn(
        "worker", what, JOBQ_MAX_CONCURRENT_JOBS=str(CONCURRENCY), JOBQ_JOB_MODULES=MODULES
    )
    try:
        async with ctx.connection() as conn:
            await registered(conn, proc)
            async with ctx.jobq_database():
                started = time.perf_counter()
                if batch:
                    await enqueue_batch(jobs, callback=Job(job_type=NOOP, arguments={"i": -1}))
                else:
                    await enqueue_many(jobs)
                committed = time.perf_counter()
                before = await _cpu_s(conn, proc.pid)
            ended = await _wait_empty(conn, proc)
            after = await _cpu_s(conn, proc.pid)
    finally:
        await proc.stop()
    cpu = sum(v - before.get(p, 0.0) for p, v in after.items())
    return committed - started, ended - committed, cpu


async def workflow_fanout(ctx: Context) -> list[Figures]:
    """The plain drain and the batch's, in an order that alternates by run."""
    order = (False, True) if ctx.run % 2 else (True, False)
    took = {batch: await _drain(ctx, "fanout" if batch else "plain", batch) for batch in order}
    plain_per_s = FANOUT_JOBS / took[False][1]
    batch_per_s = FANOUT_JOBS / took[True][1]
    return [
        {
            "jobs": FANOUT_JOBS,
            "jobs_per_s": round(batch_per_s, 1),
            "plain_jobs_per_s": round(plain_per_s, 1),
            "ratio_to_plain": round(batch_per_s / plain_per_s, 3),
            "cpu_ms_per_job": round(took[True][2] * 1000 / FANOUT_JOBS, 3),
            "plain_cpu_ms_per_job": round(took[False][2] * 1000 / FANOUT_JOBS, 3),
            "cpu_ratio_to_plain": round(took[False][2] / took[True][2], 3),
            "enqueue_s": round(took[True][0], 3),
            "plain_enqueue_s": round(took[False][0], 3),
        }
    ]


async def _chain(ctx: Context, workflow: bool) -> Figures:
    await ctx.database.reset()
    what = "chain-workflow" if workflow else "chain-enqueue-next"
    proc = ctx.spawn(
        "worker", what, JOBQ_MAX_CONCURRENT_JOBS=str(CONCURRENCY), JOBQ_JOB_MODULES=MODULES
    )
    try:
        async with ctx.connection() as conn:
            await registered(conn, proc)
            async with ctx.jobq_database():
                if workflow:
                    flow = Workflow("chain")
                    step = flow.add(Job(job_type=STAMP, arguments={"seq": 0}))
                    for seq in range(1, CHAIN_STEPS):
                        step = flow.add(Job(job_type=STAMP, arguments={"seq": seq}), after=[step])
                    await enqueue_workflow(flow)
                else:
                    await enqueue(Job(job_type=CHAIN, arguments={"seq": 0, "steps": CHAIN_STEPS}))
            deadline = time.monotonic() + 300
            while await conn.fetchval("SELECT count(*) FROM bench_event") < CHAIN_STEPS:
                if time.monotonic() > deadline:
                    raise RuntimeError("the chain did not end within 300 s")
                check_running((proc,))
                await asyncio.sleep(0.05)
            starts = [
                r["started_s"]
                for r in await conn.fetch("SELECT started_s FROM bench_event ORDER BY seq")
            ]
    finally:
        await proc.stop()
    steps_ms = sorted((b - a) * 1000 for a, b in itertools.pairwise(starts))
    return {
        "chain": "workflow" if workflow else "enqueue_next",
        "steps": CHAIN_STEPS,
        "step_ms_p50": round(percentile(steps_ms, 50), 2),
        "step_ms_p99": round(percentile(steps_ms, 99), 2),
        "total_s": round(starts[-1] - starts[0], 2),
    }


async def workflow_chain(ctx: Context) -> list[Figures]:
    """The workflow's chain, then the reference chain."""
    return [await _chain(ctx, workflow=True), await _chain(ctx, workflow=False)]


FILL = """
INSERT INTO job (job_type, arguments, ripe_at, priority, max_retries, created_at)
SELECT $1, jsonb_build_object('i', g), $2, 0, 5, $2 FROM generate_series(1, $3::int) AS g
"""

FILL_FLOWS = """
INSERT INTO job_flow (job_id, workflow_id, job_type, arguments, ripe_at, priority, max_retries,
                      queue, created_at, outcome)
SELECT -g, g / 100, $1, '{}', $2, 0, 5, 'default', $2, 'succeeded'
FROM generate_series(1, $3::int) AS g
"""
"""Finished workflows' jobs (negative ids: no job of the queue has one)."""


async def _cpu_per_cycle(ctx: Context, flow_rows: int) -> Figures:
    await ctx.database.reset()
    now = clock.now()
    async with ctx.connection() as conn:
        await conn.execute(FILL, NOOP, now, CPU_JOBS)
        if flow_rows:
            await conn.execute(FILL_FLOWS, NOOP, now, flow_rows)
        await conn.execute("VACUUM ANALYZE job, job_flow")
    sessions = {
        "on": await db.connect(ctx.dsn, server_settings=CLAIM_SESSION),
        "off": await db.connect(
            ctx.dsn, server_settings=CLAIM_SESSION | {"session_replication_role": "replica"}
        ),
    }
    try:
        pids = {name: await c.fetchval("SELECT pg_backend_pid()") for name, c in sessions.items()}
        cpu_ms: dict[str, list[float]] = {name: [] for name in sessions}
        outcomes: dict[str, list[Outcome]] = {name: [] for name in sessions}
        left = set(sessions)
        while left:
            for name in sorted(left):
                now = clock.now()
                before = _cpu_ns(pids[name])
                claimed = await store.record_and_claim(
                    sessions[name],
                    outcomes[name],
                    worker_id=0,
                    max_jobs=CPU_SLOTS,
                    now=now,
                    lease_expires_at=now + timedelta(minutes=5),
                )
                cpu_ms[name].append((_cpu_ns(pids[name]) - before) / 1e6)
                outcomes[name] = [Outcome(j.token, Verdict.COMPLETE) for j in claimed.jobs]
                if not claimed.jobs and not outcomes[name]:
                    left.discard(name)
    finally:
        for c in sessions.values():
            await c.close()
    on, off = statistics.mean(cpu_ms["on"]), statistics.mean(cpu_ms["off"])
    return {
        "job_flow_rows": flow_rows,
        "cycles": len(cpu_ms["on"]),
        "trigger_cpu_ms": round(on, 4),
        "no_trigger_cpu_ms": round(off, 4),
        "extra_cpu_ms": round(on - off, 4),
        "ratio": round(on / off, 3),
    }


async def flow_claim_cpu(ctx: Context) -> list[Figures]:
    """The claim cycle's server CPU with the trigger over without, job_flow empty, then full."""
    return [await _cpu_per_cycle(ctx, 0), await _cpu_per_cycle(ctx, FLOW_ROWS)]
