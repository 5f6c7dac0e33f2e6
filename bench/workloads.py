"""The workloads by name, the figures that tell each one's lines apart, and how many times each
runs by default; `HEADLINE` is what `python -m bench` (`make bench`) runs when given no names.

What each times is in its module's docstring: `bench.queue_bench`, `bench.http_bench`,
`bench.limits_bench`, `bench.control_bench`, `bench.schedule_bench`, `bench.dashboard_bench`,
`bench.metrics_bench`, `bench.fleet_bench`, `bench.large_bench`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from bench import (
    control_bench,
    dashboard_bench,
    fleet_bench,
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


WORKLOADS: dict[str, Spec] = {
    "throughput": Spec(queue_bench.throughput, keys=("concurrency",)),
    "pickup_latency": Spec(queue_bench.pickup_latency),
    "scheduled_lateness": Spec(queue_bench.scheduled_lateness),
    "http_reminders": Spec(http_bench.http_reminders, keys=("server",), runs=1),
    # its figures are ratios within a run; starting 50 worker processes takes a minute or two
    "fleet": Spec(fleet_bench.fleet, keys=("load",), runs=1),
    "throughput_raw": Spec(queue_bench.throughput_raw, keys=("concurrency",)),
    "enqueue_concurrent": Spec(queue_bench.enqueue_concurrent, keys=("producers",)),
    "memory": Spec(queue_bench.memory),
    "limits_overhead": Spec(limits_bench.limits_overhead, keys=("concurrency",)),
    "limits_claim_cpu": Spec(limits_bench.limits_claim_cpu),
    "queue_isolation": Spec(limits_bench.queue_isolation),
    "held_back_claim": Spec(limits_bench.held_back_claim),
    "rate_held_claim": Spec(limits_bench.rate_held_claim),
    "retention_overhead": Spec(control_bench.retention_overhead, keys=("concurrency",)),
    "cancel_latency": Spec(control_bench.cancel_latency),
    "wait_wakeup": Spec(control_bench.wait_wakeup),
    "prune_under_load": Spec(control_bench.prune_under_load),
    "schedule_lateness": Spec(schedule_bench.schedule_lateness, keys=("shape", "concurrency")),
    "dashboard_pages": Spec(dashboard_bench.dashboard_pages, keys=("page",)),
    # the last two leave millions of rows behind (each fills the database anew)
    "large_queue": Spec(large_bench.large_queue),
    "metrics_scrape": Spec(metrics_bench.metrics_scrape),
}

HEADLINE = ("throughput", "pickup_latency", "scheduled_lateness", "http_reminders", "fleet")
"""What `make bench` runs (in at most 10 minutes on the 2-core machine); `make bench-all` runs
every workload."""


def keys_of(bench: str) -> tuple[str, ...]:
    """The keys of workload `bench`'s lines (none for a workload this revision lacks)."""
    spec = WORKLOADS.get(bench)
    return spec.keys if spec is not None else ()
