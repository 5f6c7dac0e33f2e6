"""`python -m bench [workload ...] [--runs N]`: jobq's benchmarks (`make bench`).

On a fresh database (see `bench.harness`), each workload runs `--runs` times (default 3); each
figure is the median of its runs, and a ratio is computed inside each run before its median is
taken. One JSON object per line goes to stdout (and is appended to `.bench/results.jsonl`):
`"bench"` (the workload), its keys (e.g. `"concurrency"`), its figures, `"runs"`,
`"per_run"` (every run's figures) and `"machine"`. Then a table: workload, figure, value,
target, met. Progress and the subprocesses' logs' location go to stderr.

Workloads (what each times: `bench.queue_bench`, `bench.http_bench`, `bench.limits_bench`,
`bench.control_bench`, `bench.schedule_bench`, `bench.dashboard_bench`, `bench.metrics_bench`,
`bench.fleet_bench`, `bench.large_bench`): throughput, pickup_latency, scheduled_lateness,
http_reminders, enqueue_concurrent, memory, limits_overhead, limits_claim_cpu, queue_isolation,
held_back_claim, rate_held_claim, retention_overhead, cancel_latency, wait_wakeup, prune_under_load,
schedule_lateness, fleet, dashboard_pages, large_queue, metrics_scrape.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

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
from bench.harness import BENCH_DIR, bench_database, machine

Workload = Callable[[Context], Awaitable[list[Figures]]]


@dataclass(frozen=True)
class Spec:
    """A workload: its function (one run) and the figures that tell its lines apart."""

    run: Workload
    keys: tuple[str, ...] = ()


WORKLOADS: dict[str, Spec] = {
    "throughput": Spec(queue_bench.throughput, keys=("concurrency",)),
    "pickup_latency": Spec(queue_bench.pickup_latency),
    "scheduled_lateness": Spec(queue_bench.scheduled_lateness),
    "http_reminders": Spec(http_bench.http_reminders, keys=("server",)),
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
    "fleet": Spec(fleet_bench.fleet, keys=("load",)),
    "dashboard_pages": Spec(dashboard_bench.dashboard_pages, keys=("page",)),
    # the last two leave millions of rows behind (each fills the database anew)
    "large_queue": Spec(large_bench.large_queue),
    "metrics_scrape": Spec(metrics_bench.metrics_scrape),
}


@dataclass(frozen=True)
class Target:
    """`figure` `op` `value` for the lines of `bench` whose keys match `where`."""

    bench: str
    figure: str
    op: str
    value: float
    where: tuple[tuple[str, Any], ...] = ()

    def applies(self, line: dict[str, Any]) -> bool:
        return line["bench"] == self.bench and all(line.get(k) == v for k, v in self.where)

    def met(self, actual: float) -> bool:
        if self.op == ">=":
            return actual >= self.value
        if self.op == "<=":
            return actual <= self.value
        return actual == self.value

    def text(self) -> str:
        return f"{self.op} {self.value:g}"


TARGETS = (
    Target("throughput", "jobs_per_s", ">=", 25_000, (("concurrency", 16),)),
    Target("throughput", "ratio_to_raw", ">=", 1.5, (("concurrency", 16),)),
    Target("throughput", "jobs_per_s", ">=", 3_000, (("concurrency", 1),)),
    Target("pickup_latency", "p99_ms", "<=", 3),
    Target("scheduled_lateness", "p99_ms", "<=", 10),
    Target("http_reminders", "ratio_to_bare", ">=", 0.4),
    Target("http_reminders", "errors", "==", 0),
    Target("enqueue_concurrent", "jobs_per_s", ">=", 5_000),
    Target("memory", "peak_rss_mb", "<=", 150),
    Target("memory", "rss_growth", "<=", 1.1),
    Target("limits_overhead", "ratio_to_unlimited", ">=", 0.9),
    Target("queue_isolation", "p99_ms", "<=", 3),
    Target("queue_isolation", "slow_running", "==", 2),
    Target("retention_overhead", "ratio_to_off", ">=", 0.9),
    Target("cancel_latency", "p99_ms", "<=", 50),
    Target("wait_wakeup", "p99_ms", "<=", 5),
    Target("prune_under_load", "drop_pickup_p99_ms", "<=", 3),
    Target("schedule_lateness", "p99_ms", "<=", 10, (("shape", "spread"),)),
    Target("fleet", "commits_per_job_ratio", "<=", 1.5, (("load", "idle"),)),
    Target("fleet", "db_cpu_per_job_ratio", "<=", 1.5, (("load", "idle"),)),
    Target("fleet", "commits_per_job_ratio", "<=", 1.5, (("load", "busy"),)),
    Target("fleet", "db_cpu_per_job_ratio", "<=", 1.5, (("load", "busy"),)),
    Target("fleet", f"pickup_p99_ms_{fleet_bench.FLEET}", "<=", 5, (("load", "idle"),)),
    Target("metrics_scrape", "p99_ms", "<=", 50),
    Target("large_queue", "pickup_p99_ms", "<=", 5),
    Target("large_queue", "stats_ms", "<=", 50),
    Target("large_queue", "check_ms", "<=", 1000),
)
"""The issue's targets (on a 2-core machine). "Flat as the queue grows" is read as: the peak
RSS draining 100,000 jobs at most 10% above the peak draining 10,000."""


def aggregate(
    bench: str, spec: Spec, runs: list[list[Figures]], info: dict[str, Any]
) -> list[dict[str, Any]]:
    """One line per distinct key: each figure's median over the runs, and every run's."""
    lines: dict[tuple[Any, ...], list[Figures]] = {}
    for run in runs:
        for figures in run:
            lines.setdefault(tuple(figures.get(k) for k in spec.keys), []).append(figures)
    out = []
    for key, samples in lines.items():
        line: dict[str, Any] = {"bench": bench, **dict(zip(spec.keys, key, strict=True))}
        per_run: dict[str, list[Any]] = {}
        for name in samples[0]:
            if name in spec.keys:
                continue
            values = [s[name] for s in samples]
            per_run[name] = values
            median = statistics.median(values)
            line[name] = round(median, 3) if isinstance(median, float) else median
        line["runs"] = len(samples)
        line["per_run"] = per_run
        line["machine"] = info
        out.append(line)
    return out


def table(lines: list[dict[str, Any]]) -> str:
    """The table of every figure: workload (and keys), figure, value, target, met."""
    rows = [("workload", "figure", "value", "target", "met?")]
    for line in lines:
        spec = WORKLOADS[line["bench"]]
        name = line["bench"] + "".join(f" {k}={line[k]}" for k in spec.keys if k in line)
        for figure, value in line.items():
            if figure == "error":
                rows.append((name, "error", str(value)[:60], "", "NO"))
                continue
            if figure in ("bench", "runs", "per_run", "machine", "at", *spec.keys):
                continue
            target = next((t for t in TARGETS if t.applies(line) and t.figure == figure), None)
            met = "" if target is None else ("yes" if target.met(value) else "NO")
            rows.append((name, figure, _cell(value), target.text() if target else "", met))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    text = [
        "  ".join(
            cell.ljust(w) if i < 2 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    text.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(t.rstrip() for t in text)


def _cell(value: Any) -> str:
    return f"{value:g}" if isinstance(value, int | float) else str(value)


async def main_async(names: list[str], runs: int) -> int:
    BENCH_DIR.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    log_dir = BENCH_DIR / "logs" / stamp
    print(f"bench: logs in {log_dir}", file=sys.stderr)
    all_lines: list[dict[str, Any]] = []
    failed = False
    async with bench_database() as database:
        info = await machine(database.dsn)
        print(f"bench: database {database.name}; machine {json.dumps(info)}", file=sys.stderr)
        for name in names:
            spec = WORKLOADS[name]
            results = []
            try:
                for run in range(1, runs + 1):
                    started = time.monotonic()
                    figures = await spec.run(Context(database, run, log_dir))
                    took = time.monotonic() - started
                    print(
                        f"bench: {name} run {run}/{runs} ({took:.1f} s): {figures}", file=sys.stderr
                    )
                    results.append(figures)
                lines = aggregate(name, spec, results, info)
            except Exception as exc:  # one workload's failure is reported; the others run
                failed = True
                print(f"bench: {name} failed:", file=sys.stderr)
                traceback.print_exc()
                lines = [
                    {"bench": name, "error": f"{type(exc).__name__}: {exc}"[:500], "machine": info}
                ]
            for line in lines:
                line["at"] = stamp
                text = json.dumps(line)
                print(text, flush=True)
                with (BENCH_DIR / "results.jsonl").open("a") as out:
                    out.write(text + "\n")
                all_lines.append(line)
    print()
    print(table(all_lines))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument(
        "workloads",
        nargs="*",
        metavar="workload",
        help=f"workloads to run, in this order (default: all): {', '.join(WORKLOADS)}",
    )
    parser.add_argument("--runs", type=int, default=3, help="runs of each workload (default 3)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    unknown = [name for name in args.workloads if name not in WORKLOADS]
    if unknown:
        parser.error(
            f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}"
        )
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("pgserver").setLevel(logging.WARNING)
    names = args.workloads or list(WORKLOADS)
    return asyncio.run(main_async(names, args.runs))


if __name__ == "__main__":
    sys.exit(main())
