"""The workloads by name, the figures that tell each one's lines apart, and how many times each
runs by default; `HEADLINE` is what `python -m bench` (`make bench`) runs when given no names.

What each times is in its module's docstring: `bench.queue_bench`, `bench.http_bench`,
`bench.limits_bench`, `bench.control_bench`, `bench.schedule_bench`, `bench.dashboard_bench`,
`bench.metrics_bench`, `bench.fleet_bench`, `bench.large_bench`, `bench.flow_bench`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from bench import (
    control_bench,
    dashboard_bench,
    fleet_bench,
    flow_bench,
    http_bench,
    large_bench,
    limits_bench,
    metrics_bench,
    queue_bench,
    schedule_bench,
)
from bench.context import Context, Figures

Workload = Callable[[Context], Awaitable[list[Figures]]]


@dataclass(frozen=True)
class Spec:
    """A workload: its function (one run), the figures that tell its lines apart, and its runs
    unless `--runs` says otherwise."""

    run: Workload
    keys: tuple[str, ...] = ()
    runs: int = 3
    about: str = ""
    """What one run measures, with how many jobs or samples (the report's method)."""


WORKLOADS: dict[str, Spec] = {
    "throughput": Spec(
        queue_bench.throughput,
        keys=("concurrency",),
        about="a worker process drains no-op jobs enqueued at once: 5,000 at concurrency 1,"
        " 20,000 at 16 and at 64; `cpu_ms_worker`, `cpu_ms_db`: the worker's and the database"
        " server's CPU per job during the drain",
    ),
    "pickup_latency": Spec(
        queue_bench.pickup_latency,
        about="500 jobs enqueued one by one at 50 a second to an idle worker: from the"
        " enqueue's commit to the handler's start",
    ),
    "scheduled_lateness": Spec(
        queue_bench.scheduled_lateness,
        about="500 jobs ripe over 10 s: from each one's ripe time to its handler's start",
    ),
    "http_reminders": Spec(
        http_bench.http_reminders,
        keys=("server", "users"),
        runs=1,
        about="32 connections create reminders for 1 user, then for 100, for 30 s each against"
        " `jobq run` (access log on, rate limit and caps lifted) while its workers deliver"
        " them; before each, the bare endpoint (one INSERT) served the same way for 5 s;"
        " `cpu_ms_*`: each role's CPU per reminder (web, worker, supervisor, database server),"
        " `bare_cpu_ms_*` per bare request",
    ),
    # its figures are ratios within a run; starting 50 worker processes takes a minute or two
    "fleet": Spec(
        fleet_bench.fleet,
        keys=("load",),
        runs=1,
        about="1 then 50 worker processes: the server's commits and CPU per job, idle (500"
        " jobs at 50 a second) and busy (10,000 at once), and pickup (500 jobs)",
    ),
    "throughput_raw": Spec(
        queue_bench.throughput_raw,
        keys=("concurrency",),
        about="the worker's drain of 20,000 no-op jobs at concurrency 16 and 128, and plain"
        " connections deleting them one per transaction",
    ),
    "enqueue_concurrent": Spec(
        queue_bench.enqueue_concurrent,
        keys=("producers",),
        about="8 producers enqueue one job per transaction for 5 s; no worker",
    ),
    "memory": Spec(
        queue_bench.memory,
        about="a worker's peak RSS draining 10,000, then 100,000 queued no-op jobs",
    ),
    "limits_overhead": Spec(
        limits_bench.limits_overhead,
        keys=("concurrency",),
        about="drains of 20,000 jobs over 50 keys at concurrency 16: limits that never bind"
        " over none",
    ),
    "limits_io": Spec(
        limits_bench.limits_io,
        keys=("concurrency",),
        about="drains of 20,000 jobs that await 5 ms over 50 keys at concurrency 64: limits that"
        " never bind over none",
    ),
    "limits_claim_cpu": Spec(
        limits_bench.limits_claim_cpu,
        about="the server's CPU per claim of 16, on free and limited queues of 20,000 jobs",
    ),
    "queue_isolation": Spec(
        limits_bench.queue_isolation,
        about="pickup of 500 jobs on a fast queue while slow jobs fill a slow queue's 2 slots",
    ),
    "held_back_claim": Spec(
        limits_bench.held_back_claim,
        about="200 claims beside 100,000 held-back jobs, then beside none: time and buffers",
    ),
    "rate_held_claim": Spec(
        limits_bench.rate_held_claim,
        about="200 claims that find their queue's rate full (1,000 jobs held)",
    ),
    "retention_overhead": Spec(
        control_bench.retention_overhead,
        keys=("concurrency",),
        about="drains of 20,000 jobs at concurrency 16: retention on over off",
    ),
    "cancel_latency": Spec(
        control_bench.cancel_latency,
        about="100 running jobs cancelled: from the cancel's commit to the handler's stop",
    ),
    "wait_wakeup": Spec(
        control_bench.wait_wakeup,
        about="200 awaited jobs: from the outcome to the waiter's wake-up",
    ),
    "prune_under_load": Spec(
        control_bench.prune_under_load,
        about="pickup and ack at 50 jobs a second while 1,000,000 finished jobs are pruned",
    ),
    "schedule_lateness": Spec(
        schedule_bench.schedule_lateness,
        keys=("shape", "concurrency"),
        about="500 occurrences of 100 schedules per shape: from the occurrence to the"
        " handler's start",
    ),
    "dashboard_pages": Spec(
        dashboard_bench.dashboard_pages,
        keys=("page",),
        about="each dashboard page's server time (p50, p99), 40 requests, over 100,000 queued"
        " and 1,000,000 finished jobs, 1,000 dead, 25 h of history for 5 queues",
    ),
    "workflow_fanout": Spec(
        flow_bench.workflow_fanout,
        about="10,000 no-op jobs drained at concurrency 16 as a batch with a callback (fan-out,"
        " fan-in) over the same jobs plain, in the same run",
    ),
    "workflow_chain": Spec(
        flow_bench.workflow_chain,
        keys=("chain",),
        runs=1,
        about="a chain of 1,000 jobs, each waiting for the one before (a workflow), then each"
        " enqueued by the one before: the time from one step's start to the next's",
    ),
    "flow_claim_cpu": Spec(
        flow_bench.flow_claim_cpu,
        keys=("job_flow_rows",),
        about="the server's CPU per claim cycle (record 16, claim 16) of jobs of no workflow,"
        " with the workflows' trigger over without it, alternated; job_flow empty, then"
        " holding 100,000 finished jobs",
    ),
    # the last two leave millions of rows behind (each fills the database anew)
    "large_queue": Spec(
        large_bench.large_queue,
        about="claims, enqueues, pickup, stats and check beside 10,000,000 scheduled jobs",
    ),
    "metrics_scrape": Spec(
        metrics_bench.metrics_scrape,
        about="GET /metrics over 1,000,000 queued and 10,000,000 finished jobs",
    ),
}

HEADLINE = ("throughput", "pickup_latency", "scheduled_lateness", "http_reminders", "fleet")
"""What `make bench` runs (in at most 10 minutes on the 2-core machine); `make bench-all` runs
every workload."""


def keys_of(bench: str) -> tuple[str, ...]:
    """The keys of workload `bench`'s lines (none for a workload this revision lacks)."""
    spec = WORKLOADS.get(bench)
    return spec.keys if spec is not None else ()
