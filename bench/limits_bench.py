"""The workloads of queues and limits: `limits_overhead`, `limits_claim_cpu`, `queue_isolation`,
`held_back_claim`, `rate_held_claim`.
Each function is one run and returns its lines' figures. The queues are `bench.queues`'.

What is timed, exactly:

- `limits_overhead`: as `throughput` at concurrency 16 (one worker process, 16 slots, 20,000
  `bench_noop` jobs enqueued in one `enqueue_many` once it is registered, drained until `job`
  and `job_running` are empty), twice in the run: on `bench_free` (no limits), then on
  `bench_limited` (every kind of limit, none binding). The jobs spread over 50 concurrency
  keys in both. `ratio_to_unlimited`: the limited drain's jobs/s over the free one's.
- `limits_io`: as `limits_overhead`, with `bench_sleep` jobs that await 5 ms (I/O) at 64
  slots: what limits that never bind cost jobs that do something.
- `queue_isolation`: one worker process with `JOBQ_QUEUES=bench_slow:2,bench_fast:8`; 10,000
  `bench_sleep` jobs (5 s each) on `bench_slow` keep its 2 slots busy, then 500 `bench_stamp`
  jobs on `bench_fast`, each enqueued in its own transaction, one every 20 ms. Pickup: as
  `pickup_latency` (the handler's first wall-clock reading minus the producer's after COMMIT).
- `limits_claim_cpu`: no worker. 20,000 `bench_noop` jobs over 50 keys on each of `bench_free`
  and `bench_limited`; one connection with the worker's claim session
  (`jobq.queue.listener.CLAIM_SESSION`) runs the worker's cycle on each queue in turn,
  alternating: record the 16 outcomes of the queue's last claim and claim 16
  (`store.record_and_claim`, one statement, its own transaction), until all are drained: for
  `bench_limited` a turn at every claim. `*_cpu_ms`: the mean CPU time of the server's backend
  per cycle (`/proc/<pid>/schedstat`: the server must run on this machine, as the embedded one
  does); `extra_cpu_ms` the limited queue's less the free one's. Alternating in one connection
  puts both under the same load, so this reads steadier than the drains.
- `held_back_claim`: no worker. `bench_held` (at most 1 running job per key) holds 100,000
  ripe jobs of key `hot`, older than everything else, whose one slot is taken (a `job_running`
  row of a worker that does not exist), and 5 ripe jobs of 5 other keys. The claim statement
  (`jobq.queue.sql.job_claim`, 1 free slot) runs 200 times on a connection with the worker's
  claim session (`CLAIM_SESSION`: its plan made once), each in a transaction rolled back;
  then the 100,000 held jobs are deleted (and vacuumed) and the same is timed again: `empty_*`.
  `*_buffers`: the shared buffers (hit + read) of the claim under `EXPLAIN (ANALYZE,
  BUFFERS)`, including those its function `job_claim_turns` reads (PostgreSQL counts the
  buffers of a function's statements in its Function Scan); `*function_buffers`: those of
  `SELECT * FROM job_claim_turns(...)` alone, rolled back.
- `rate_held_claim`: no worker. `bench_rated` (one start a minute) holds 1,000 ripe jobs; one
  claim (`store.record_and_claim`, 16 free slots, on a connection with the worker's claim
  session) takes the minute's one, then `RATED_CLAIMS` more are timed: each finds the rate
  full, claims nothing and tells when its window opens (`job_rate_opens_at`), as the claims of
  a worker held back by a rate do.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from datetime import timedelta
from typing import Any

from bench import queues
from bench.context import Context, Figures
from bench.handlers import NOOP, SLEEP, STAMP
from bench.harness import wait_drained
from bench.loadgen import percentile
from jobq import clock, db
from jobq.db import Connection
from jobq.queue import Job, enqueue, enqueue_many, limits, sql, store
from jobq.queue.listener import CLAIM_SESSION
from jobq.queue.model import Outcome, Verdict
from jobq.queue.registry import registry
from tests.toolkit.procs import Proc, check_running, registered

OVERHEAD_JOBS = 20_000
OVERHEAD_SLOTS = 16
OVERHEAD_KEYS = 50
OVERHEAD_DRAINS = 3
IO_S = 0.005
IO_SLOTS = 64
IO_JOBS = 20_000
SLOW_JOBS = 10_000
SLOW_SLEEP_S = 5.0
FAST_JOBS = 500
FAST_RATE_PER_S = 50.0
HELD_JOBS = 100_000
HELD_FREE_KEYS = 5
HELD_CLAIMS = 200
FAKE_WORKER = 2_000_000_000
"""A worker id that no worker has: the running job that fills `hot`'s slot, and the claims'."""


def _worker(ctx: Context, what: str, served: str, **env: str) -> Proc:
    return ctx.spawn(
        "worker", what, JOBQ_JOB_MODULES="bench.handlers,bench.queues", JOBQ_QUEUES=served, **env
    )


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


# -- limits_overhead ---------------------------------------------------------------------------


async def limits_overhead(ctx: Context) -> list[Figures]:
    """`OVERHEAD_DRAINS` drains of `bench_free`, each followed by one of `bench_limited`, at 16
    slots: the median of each."""
    return await _overhead(ctx, NOOP, {}, OVERHEAD_JOBS, OVERHEAD_SLOTS)


async def limits_io(ctx: Context) -> list[Figures]:
    """As `limits_overhead`, with jobs that await `IO_S` of I/O, at `IO_SLOTS` slots: what limits
    that never bind cost jobs that do something."""
    return await _overhead(ctx, SLEEP, {"seconds": IO_S}, IO_JOBS, IO_SLOTS)


async def _overhead(
    ctx: Context, job_type: str, arguments: dict[str, Any], num_jobs: int, slots: int
) -> list[Figures]:
    drains: dict[str, list[float]] = {queues.FREE: [], queues.LIMITED: []}
    for _ in range(OVERHEAD_DRAINS):
        for queue, speeds in drains.items():
            speeds.append(await _drain(ctx, queue, job_type, arguments, num_jobs, slots))
    free, limited = (statistics.median(speeds) for speeds in drains.values())
    return [
        {
            "concurrency": slots,
            "jobs_per_s": round(limited, 1),
            "unlimited_jobs_per_s": round(free, 1),
            "ratio_to_unlimited": round(limited / free, 3),
        }
    ]


async def _drain(
    ctx: Context,
    queue: str,
    job_type: str,
    arguments: dict[str, Any],
    num_jobs: int,
    slots: int,
) -> float:
    """Enqueue `num_jobs` jobs of `job_type` on `queue` for a registered worker with `slots`;
    return jobs/s from the enqueue's COMMIT until the last outcome is committed."""
    await ctx.database.reset()
    jobs = [
        Job(
            job_type=job_type,
            arguments={**arguments, "i": i},
            queue=queue,
            concurrency_key=f"k{i % OVERHEAD_KEYS}",
        )
        for i in range(num_jobs)
    ]
    proc = _worker(ctx, f"overhead-{queue}", f"{queue}:{slots}")
    try:
        async with ctx.connection() as conn:
            await registered(conn, proc)
            async with ctx.jobq_database():
                ids = await enqueue_many(jobs)
                committed = time.perf_counter()
            assert len(ids) == num_jobs
            drained = await wait_drained(conn, within_s=300, proc=proc)
    finally:
        await proc.stop()
    return num_jobs / (drained - committed)


# -- queue_isolation ---------------------------------------------------------------------------


async def queue_isolation(ctx: Context) -> list[Figures]:
    """Pickup latency of `bench_fast` while `bench_slow` is saturated."""
    await ctx.database.reset()
    proc = _worker(ctx, "isolation", f"{queues.SLOW}:2,{queues.FAST}:8", JOBQ_DRAIN_TIMEOUT_S="1")
    committed_s: dict[int, float] = {}
    try:
        async with ctx.connection() as conn:
            await registered(conn, proc)
            slow = [
                Job(job_type=SLEEP, arguments={"seconds": SLOW_SLEEP_S, "i": i}, queue=queues.SLOW)
                for i in range(SLOW_JOBS)
            ]
            async with ctx.jobq_database():
                await enqueue_many(slow)
                start = time.perf_counter()
                for seq in range(FAST_JOBS):
                    delay = start + seq / FAST_RATE_PER_S - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    job = Job(
                        job_type=STAMP,
                        arguments={"seq": seq, "run": str(ctx.run)},
                        queue=queues.FAST,
                    )
                    enqueued = await enqueue(job)
                    committed_s[enqueued.id] = time.time()
            deadline = time.monotonic() + 30
            while (await conn.fetchval("SELECT count(*) FROM bench_event")) < FAST_JOBS:
                check_running((proc,))
                assert time.monotonic() < deadline, "the fast jobs did not all run in 30 s"
                await asyncio.sleep(0.05)
            slow_running: int = await conn.fetchval(
                "SELECT count(*) FROM job_running WHERE queue = $1", queues.SLOW
            )
            rows = await conn.fetch("SELECT job_id, started_s FROM bench_event")
    finally:
        await proc.stop()
    latencies = [r["started_s"] - committed_s[r["job_id"]] for r in rows]
    return [
        {
            "p50_ms": _ms(percentile(latencies, 50)),
            "p99_ms": _ms(percentile(latencies, 99)),
            "max_ms": _ms(max(latencies)),
            "slow_running": slow_running,
        }
    ]


# -- limits_claim_cpu --------------------------------------------------------------------------

CPU_JOBS = 20_000
CPU_SLOTS = 16

FILL_KEYED = """
INSERT INTO job (job_type, arguments, ripe_at, priority, max_retries, created_at, queue,
                 concurrency_key)
SELECT $1, jsonb_build_object('i', g, 'queue', $3::text), $2, 0, 5, $2, $3, 'k' || g % $4::int
FROM generate_series(1, $5::int) AS g
"""


def _cpu_ns(pid: int) -> int:
    """The CPU time (ns) process `pid` of this machine has run so far (`/proc/<pid>/schedstat`).
    Raises: `RuntimeError` when there is no such process here (a remote server)."""
    try:
        with open(f"/proc/{pid}/schedstat") as stat:
            return int(stat.read().split()[0])
    except FileNotFoundError:
        raise RuntimeError(f"no process {pid} here: the server must run on this machine") from None


async def limits_claim_cpu(ctx: Context) -> list[Figures]:
    """The server's CPU per claim cycle on `bench_free` and on `bench_limited` (a turn at each
    claim), alternated."""
    await ctx.database.reset()
    names = (queues.FREE, queues.LIMITED)
    now = clock.now()
    async with ctx.connection() as conn:
        await limits.declare_queues(conn, [registry.queues()[name] for name in names])
        for name in names:
            await conn.execute(FILL_KEYED, NOOP, now, name, OVERHEAD_KEYS, CPU_JOBS)
        await conn.execute("VACUUM ANALYZE job")
    conn = await db.connect(ctx.dsn, server_settings=CLAIM_SESSION)
    try:
        pid: int = await conn.fetchval("SELECT pg_backend_pid()")
        cpu_ms: dict[str, list[float]] = {name: [] for name in names}
        outcomes: dict[str, list[Outcome]] = {name: [] for name in names}
        left = set(names)
        while left:
            for name in sorted(left):
                now = clock.now()
                before = _cpu_ns(pid)
                claimed = await store.record_and_claim(
                    conn,
                    outcomes[name],
                    worker_id=FAKE_WORKER,
                    max_jobs={name: CPU_SLOTS},
                    now=now,
                    lease_expires_at=now + timedelta(minutes=5),
                )
                cpu_ms[name].append((_cpu_ns(pid) - before) / 1e6)
                outcomes[name] = [Outcome(j.token, Verdict.COMPLETE) for j in claimed.jobs]
                if not claimed.jobs:
                    left.discard(name)
    finally:
        await conn.close()
    free, limited = (statistics.mean(cpu_ms[name]) for name in names)
    return [
        {
            "cycles": len(cpu_ms[queues.LIMITED]),
            "free_cpu_ms": round(free, 3),
            "limited_cpu_ms": round(limited, 3),
            "extra_cpu_ms": round(limited - free, 3),
        }
    ]


# -- held_back_claim ---------------------------------------------------------------------------

FILL = """
INSERT INTO job (job_type, arguments, ripe_at, priority, max_retries, created_at, queue,
                 concurrency_key)
SELECT $1, jsonb_build_object('i', g), $2::timestamptz + g * interval '1 microsecond', 0, 5,
       $2, $3, $4
FROM generate_series(1, $5::int) AS g
"""

HOLD = """
INSERT INTO job_running (id, job_type, arguments, ripe_at, priority, attempts, max_retries,
                         created_at, worker_id, claimed_at, lease_expires_at, token, queue,
                         concurrency_key)
VALUES (0, $1, '{}', $2::timestamptz, 0, 0, 5, $2, $3, $2, $2::timestamptz + interval '1 day',
        nextval('job_fencing_token'), $4, $5)
"""


async def held_back_claim(ctx: Context) -> list[Figures]:
    """Claims of `bench_held` with 100,000 jobs held back by its per-key limit, then without."""
    await ctx.database.reset()
    now = clock.now()
    async with ctx.connection() as conn:
        await limits.declare_queues(conn, [registry.queues()[queues.HELD]])
        await conn.execute(HOLD, NOOP, now - timedelta(hours=2), FAKE_WORKER, queues.HELD, "hot")
        await conn.execute(FILL, NOOP, now - timedelta(hours=1), queues.HELD, "hot", HELD_JOBS)
        for k in range(HELD_FREE_KEYS):
            await conn.execute(
                "INSERT INTO job (job_type, arguments, ripe_at, priority, max_retries, created_at,"
                " queue, concurrency_key)"
                " VALUES ($1, jsonb_build_object('free', $2::int), $3, 0, 5, $3, $4, $5)",
                NOOP,
                k,
                now - timedelta(minutes=1),
                queues.HELD,
                f"free-{k}",
            )
        await conn.execute("VACUUM ANALYZE job")
        for name, value in CLAIM_SESSION.items():  # the worker's claim session
            await conn.execute("SELECT set_config($1, $2, false)", name, value)
        held = await _claims(conn)
        await conn.execute(
            "DELETE FROM job WHERE queue = $1 AND concurrency_key = 'hot'", queues.HELD
        )
        await conn.execute("VACUUM ANALYZE job")
        empty = await _claims(conn)
    return [
        {
            "held_jobs": HELD_JOBS,
            "p50_ms": held["p50_ms"],
            "p99_ms": held["p99_ms"],
            "buffers": held["buffers"],
            "function_buffers": held["function_buffers"],
            "empty_p50_ms": empty["p50_ms"],
            "empty_p99_ms": empty["p99_ms"],
            "empty_buffers": empty["buffers"],
            "empty_function_buffers": empty["function_buffers"],
        }
    ]


async def _claims(conn: Connection) -> dict[str, Any]:
    """Time `HELD_CLAIMS` claims of one job of `bench_held`, each rolled back; and read the
    buffers of one under EXPLAIN (ANALYZE, BUFFERS)."""

    def args() -> list[Any]:
        now = clock.now()
        return sql.job_claim.args(
            completed=[],
            results=[],
            retain=True,
            now=now,
            queues=[queues.HELD],
            slots=[1],
            worker_id=FAKE_WORKER + 1,
            lease_expires_at=now + timedelta(minutes=5),
        )

    took = []
    for _ in range(HELD_CLAIMS):
        transaction = conn.transaction()
        await transaction.start()
        try:
            started = time.perf_counter()
            row = await conn.fetchrow(sql.job_claim.text, *args())
            took.append(time.perf_counter() - started)
            assert row is not None
            assert len(row["jobs"]) == 1, "the claim found no job"
        finally:
            await transaction.rollback()
    transaction = conn.transaction()
    await transaction.start()
    try:
        plan: Any = await conn.fetchval(
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql.job_claim.text}", *args()
        )
    finally:
        await transaction.rollback()
    top = plan[0]["Plan"]  # the connection decodes json
    # the function alone: a Function Scan reads no buffers itself, so these are its statements'
    transaction = conn.transaction()
    await transaction.start()
    try:
        now = clock.now()
        alone: Any = await conn.fetchval(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM job_claim_turns("
            "ARRAY(SELECT jq FROM job_queue AS jq WHERE jq.name = $1), $2, $3, $4, $5)",
            queues.HELD,
            [1],
            FAKE_WORKER + 1,
            now,
            now + timedelta(minutes=5),
        )
    finally:
        await transaction.rollback()
    scan = alone[0]["Plan"]
    return {
        "function_buffers": scan["Shared Hit Blocks"] + scan["Shared Read Blocks"],
        "p50_ms": _ms(percentile(took, 50)),
        "p99_ms": _ms(percentile(took, 99)),
        "buffers": top["Shared Hit Blocks"] + top["Shared Read Blocks"],
    }


# -- rate_held_claim ---------------------------------------------------------------------------

RATED_JOBS = 1_000
RATED_CLAIMS = 200


async def rate_held_claim(ctx: Context) -> list[Figures]:
    """Claims of `bench_rated` while its rate holds back its ripe jobs."""
    await ctx.database.reset()
    async with ctx.connection() as conn:
        await limits.declare_queues(conn, [registry.queues()[queues.RATED]])
        await conn.execute(FILL, NOOP, clock.now(), queues.RATED, None, RATED_JOBS)
        await conn.execute("VACUUM ANALYZE job")
    conn = await db.connect(ctx.dsn, server_settings=CLAIM_SESSION)
    try:
        took = []
        for n in range(RATED_CLAIMS + 1):
            now = clock.now()
            started = time.perf_counter()
            claimed = await store.record_and_claim(
                conn,
                [],
                worker_id=FAKE_WORKER,
                max_jobs={queues.RATED: 16},
                now=now,
                lease_expires_at=now + timedelta(minutes=5),
            )
            took.append(time.perf_counter() - started)
            assert len(claimed.jobs) == (1 if n == 0 else 0), "the rate did not hold"
            # (the first claim's own start row is not in its snapshot: no opening yet)
            assert n == 0 or claimed.next_ripe_at is not None, "no window opening for the timer"
    finally:
        await conn.close()
    return [
        {
            "held_jobs": RATED_JOBS - 1,
            "p50_ms": _ms(percentile(took[1:], 50)),
            "p99_ms": _ms(percentile(took[1:], 99)),
        }
    ]
