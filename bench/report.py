"""The benchmark's lines and their report: each figure's median over the runs, the targets, the
baseline's figure and the ratio, as a text table (stdout) and a Markdown page
(`docs/benchmarks.md`).

A line is a JSON object: `"bench"` (the workload), its keys (e.g. `"concurrency"`), its figures,
`"runs"`, `"per_run"` (every run's figures) and `"machine"`; with `--baseline`, also
`"baseline_rev"`, `"baseline"` and `"ratio"` (each figure's, where the baseline has it),
`"baseline_runs"` and `"baseline_per_run"`, or `"baseline_missing"` saying why there is none.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from bench.context import Figures
from bench.fleet_bench import FLEET
from bench.workloads import WORKLOADS, keys_of

Line = dict[str, Any]

META = (
    "bench",
    "runs",
    "per_run",
    "machine",
    "at",
    "error",
    "baseline_rev",
    "baseline",
    "ratio",
    "baseline_runs",
    "baseline_per_run",
    "baseline_missing",
)
"""The fields of a line that are not figures (besides its keys)."""


@dataclass(frozen=True)
class Target:
    """`figure` `op` `value` for the lines of `bench` whose keys match `where`."""

    bench: str
    figure: str
    op: str
    value: float
    where: tuple[tuple[str, Any], ...] = ()

    def applies(self, line: Line) -> bool:
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
    Target("throughput_raw", "ratio_to_raw", ">=", 1.5, (("concurrency", 16),)),
    Target("throughput", "jobs_per_s", ">=", 3_000, (("concurrency", 1),)),
    Target("pickup_latency", "p99_ms", "<=", 3),
    Target("scheduled_lateness", "p99_ms", "<=", 10),
    Target("http_reminders", "ratio_to_bare", ">=", 0.6),
    Target("http_reminders", "errors", "==", 0),
    Target("http_reminders", "lost", "==", 0),
    Target("enqueue_concurrent", "jobs_per_s", ">=", 5_000),
    Target("memory", "peak_rss_mb", "<=", 150),
    Target("memory", "rss_growth", "<=", 1.1),
    Target("limits_overhead", "ratio_to_unlimited", ">=", 0.9),
    Target("limits_io", "ratio_to_unlimited", ">=", 0.9),
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
    Target("fleet", f"pickup_p99_ms_{FLEET}", "<=", 5, (("load", "idle"),)),
    Target("metrics_scrape", "p99_ms", "<=", 50),
    Target("large_queue", "pickup_p99_ms", "<=", 5),
    Target("large_queue", "stats_ms", "<=", 50),
    Target("large_queue", "check_ms", "<=", 1000),
    Target("workflow_fanout", "ratio_to_plain", ">=", 0.8),
)
"""The issue's targets (on a 2-core machine). "Flat as the queue grows" is read as: the peak
RSS draining 100,000 jobs at most 10% above the peak draining 10,000."""


def aggregate(
    bench: str, keys: tuple[str, ...], runs: Sequence[list[Figures]], info: dict[str, Any]
) -> list[Line]:
    """One line per distinct key: each figure's median over the runs, and every run's."""
    lines: dict[tuple[Any, ...], list[Figures]] = {}
    for run in runs:
        for figures in run:
            lines.setdefault(tuple(figures.get(k) for k in keys), []).append(figures)
    out = []
    for key, samples in lines.items():
        line: Line = {"bench": bench, **dict(zip(keys, key, strict=True))}
        per_run: dict[str, list[Any]] = {}
        for name in samples[0]:
            if name in keys:
                continue
            values = [s[name] for s in samples if name in s]
            per_run[name] = values
            line[name] = _median(values)
        line["runs"] = len(samples)
        line["per_run"] = per_run
        line["machine"] = info
        out.append(line)
    return out


def _median(values: list[Any]) -> Any:
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return values[-1]
    median = statistics.median(values)
    return round(median, 3) if isinstance(median, float) else median


def compare(line: Line, baseline: Line | None, rev: str, missing: str = "") -> Line:
    """`line` with the figures of `baseline` (the same workload and keys at `rev`) and each
    figure's ratio, current over baseline; or, when there is no baseline line, `missing`
    (why)."""
    out = {**line, "baseline_rev": rev}
    if baseline is None:
        out["baseline_missing"] = missing or "no such line at the baseline"
        return out
    keys = keys_of(line["bench"])
    out["baseline"] = {k: v for k, v in baseline.items() if k not in META and k not in keys}
    out["ratio"] = {
        k: round(line[k] / v, 3)
        for k, v in out["baseline"].items()
        if _number(v) and v != 0 and _number(line.get(k))
    }
    out["baseline_runs"] = baseline.get("runs")
    out["baseline_per_run"] = baseline.get("per_run")
    return out


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


Row = tuple[str, ...]


def rows(lines: list[Line]) -> list[Row]:
    """One row per figure: workload (and keys), figure, value, runs, [baseline, ratio,] target,
    met. The baseline's columns are there when a line has a `baseline_rev`."""
    rev = next((line["baseline_rev"] for line in lines if "baseline_rev" in line), None)
    header: Row = ("workload", "figure", "value", "runs")
    if rev is not None:
        header += (f"baseline ({rev})", "ratio")
    out = [(*header, "target", "met?")]
    for line in lines:
        keys = keys_of(line["bench"])
        name = line["bench"] + "".join(f" {k}={line[k]}" for k in keys if k in line)
        extra: Row = ("", "") if rev is not None else ()
        runs = _cell(line.get("runs", ""))
        if "error" in line:
            out.append((name, "error", str(line["error"])[:60], runs, *extra, "", "NO"))
        if "baseline_missing" in line:
            missing = str(line["baseline_missing"])[:60]
            out.append((name, "baseline", "", runs, missing, "", "", ""))
        baseline = line.get("baseline", {})
        ratio = line.get("ratio", {})
        for figure, value in line.items():
            if figure in META or figure in keys:
                continue
            target = next((t for t in TARGETS if t.applies(line) and t.figure == figure), None)
            met = "" if target is None else ("yes" if target.met(value) else "NO")
            if rev is not None:
                extra = (_cell(baseline.get(figure, "")), _cell(ratio.get(figure, "")))
            text = target.text() if target else ""
            out.append((name, figure, _cell(value), runs, *extra, text, met))
    return out


def _cell(value: Any) -> str:
    return f"{value:g}" if _number(value) else str(value)


def table(lines: list[Line]) -> str:
    """The rows as a text table, numbers aligned right."""
    table_rows = rows(lines)
    width = len(table_rows[0])
    widths = [max(len(row[i]) for row in table_rows) for i in range(width)]
    text = [
        "  ".join(
            cell.ljust(w) if i < 2 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in table_rows
    ]
    text.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(t.rstrip() for t in text)


METHOD = """\
Each workload runs on a fresh database of the server named below, with real worker and web
processes (`python -m jobq worker`, `serve`, `run`); each figure is the median of its runs (the
runs column). What one run of each workload does is below; what each figure times exactly is in
the docstring of its module in `bench/`."""

BASELINE_METHOD = """\
The baseline ran the same workloads at revision `{rev}`, in a git worktree with its own
benchmark code, on the same server, its runs interleaved with these (this revision, the
baseline, this revision, ...); the ratio is this revision's figure over the baseline's."""


def markdown(lines: list[Line], command: str, machine: dict[str, Any]) -> str:
    """`docs/benchmarks.md`: the method, the machine, and the table of `lines`."""
    table_rows = rows(lines)
    rev = next((line["baseline_rev"] for line in lines if "baseline_rev" in line), None)
    parts = [
        "# Benchmarks",
        "",
        f"This page is written by `{command}`; running it again replaces it.",
        "",
        METHOD,
        "",
    ]
    for bench in dict.fromkeys(line["bench"] for line in lines):
        spec = WORKLOADS.get(bench)
        if spec is not None and spec.about:
            parts.append(f"- `{bench}`: {spec.about}.")
    if rev is not None:
        parts += ["", BASELINE_METHOD.format(rev=rev)]
    parts += [
        "",
        "The machine (figures move from one run to the next, by 10% or more when other work"
        " shares it):",
        "",
        f"- CPU: {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores;"
        f" memory: {machine.get('memory_gib', '?')} GiB",
        f"- PostgreSQL {machine.get('postgresql', '?')}, synchronous_commit"
        f" {machine.get('synchronous_commit', '?')}; Python {machine.get('python', '?')}",
        f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "",
        "| " + " | ".join(table_rows[0]) + " |",
        "|" + "|".join("---" if i < 2 else "--:" for i in range(len(table_rows[0]))) + "|",
    ]
    parts += [
        "| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in table_rows[1:]
    ]
    return "\n".join(parts) + "\n"
