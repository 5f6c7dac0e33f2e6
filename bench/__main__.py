"""`python -m bench [workload ...] [--all] [--runs N] [--baseline REV] [--docs PATH]`: jobq's
benchmarks (`make bench`, `make bench-all`).

With no workload named, the headline ones run (`bench.workloads.HEADLINE`: throughput,
pickup_latency, scheduled_lateness, http_reminders, fleet); with `--all`, every one. On a fresh
database (see `bench.harness`), each workload runs `--runs` times (by default its own count:
3, or 1 for http_reminders and fleet); each figure is the median of its runs, and a ratio is
computed inside each run before its median is taken. One JSON object per line goes to stdout
(and is appended to `.bench/results.jsonl`), see `bench.report`; then a table: workload,
figure, value, target, met. With `--docs PATH`, the same table, the method and the machine are
written to PATH (Markdown). Progress and the subprocesses' logs' location go to stderr.

`--baseline REV` runs the same workloads at git revision REV too, interleaved with this one's
runs, and adds the baseline's figures and the ratios (`bench.baseline`).

Interrupted (Ctrl-C, SIGTERM), it stops every process it started (`bench.children`) and exits
with 130 (SIGINT) or 143 (SIGTERM).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import baseline, children, report
from bench.context import Context
from bench.harness import BENCH_DIR, bench_database, machine, server_dsn
from bench.report import Line
from bench.workloads import HEADLINE, WORKLOADS


def emit(line: Line, stamp: str) -> None:
    """Print `line` (stamped `"at"`) and append it to `.bench/results.jsonl`."""
    line["at"] = stamp
    text = json.dumps(line)
    print(text, flush=True)
    BENCH_DIR.mkdir(exist_ok=True)
    with (BENCH_DIR / "results.jsonl").open("a") as out:
        out.write(text + "\n")


async def run_here(names: list[str], runs: dict[str, int], stamp: str) -> list[Line]:
    """Run each workload of `names` `runs[name]` times in this process, emitting each line as
    it is done; return the lines."""
    log_dir = BENCH_DIR / "logs" / stamp
    print(f"bench: logs in {log_dir}", file=sys.stderr)
    out: list[Line] = []
    async with bench_database() as database:
        info = await machine(database.dsn)
        print(f"bench: database {database.name}; machine {json.dumps(info)}", file=sys.stderr)
        for name in names:
            spec = WORKLOADS[name]
            results = []
            try:
                for run in range(1, runs[name] + 1):
                    started = time.monotonic()
                    figures = await spec.run(Context(database, run, log_dir))
                    took = time.monotonic() - started
                    print(
                        f"bench: {name} run {run}/{runs[name]} ({took:.1f} s): {figures}",
                        file=sys.stderr,
                    )
                    results.append(figures)
                lines = report.aggregate(name, spec.keys, results, info)
            except Exception as exc:  # one workload's failure is reported; the others run
                print(f"bench: {name} failed:", file=sys.stderr)
                traceback.print_exc()
                lines = [
                    {"bench": name, "error": f"{type(exc).__name__}: {exc}"[:500], "machine": info}
                ]
            for line in lines:
                emit(line, stamp)
            out += lines
    return out


async def main_async(
    names: list[str], runs: dict[str, int], rev: str | None, own_venv: bool
) -> list[Line]:
    """Run the workloads (against `rev` too, when given); return the lines."""
    task = asyncio.current_task()
    assert task is not None
    children.cancel_on_signals(task)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    if rev is None:
        return await run_here(names, runs, stamp)
    log_dir = BENCH_DIR / "logs" / f"{stamp}-baseline"
    print(f"bench: each run's log in {log_dir}", file=sys.stderr)
    dsn = await server_dsn()
    with baseline.worktree(rev, own_venv=own_venv) as tree:
        lines = await baseline.compare(names, runs, tree, dsn, log_dir)
    for line in lines:
        emit(line, stamp)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument(
        "workloads",
        nargs="*",
        metavar="workload",
        help=f"workloads to run, in this order (default: {', '.join(HEADLINE)}); all: "
        + ", ".join(WORKLOADS),
    )
    parser.add_argument("--all", action="store_true", help="run every workload")
    parser.add_argument("--runs", type=int, help="runs of each workload (default: its own)")
    parser.add_argument("--baseline", metavar="REV", help="compare with git revision REV")
    parser.add_argument(
        "--baseline-venv",
        action="store_true",
        help="run the baseline in a venv of its own (default: this one, its tree first)",
    )
    parser.add_argument("--docs", type=Path, metavar="PATH", help="write the table to PATH")
    args = parser.parse_args(argv)
    if args.runs is not None and args.runs < 1:
        parser.error("--runs must be at least 1")
    unknown = [name for name in args.workloads if name not in WORKLOADS]
    if unknown:
        parser.error(
            f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}"
        )
    if args.workloads and args.all:
        parser.error("name workloads or --all, not both")
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("pgserver").setLevel(logging.WARNING)
    # Ctrl-C interrupts even where SIGINT came ignored (started in the background)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    children.stop_with_parent()
    names = args.workloads or list(WORKLOADS if args.all else HEADLINE)
    runs = {name: args.runs or WORKLOADS[name].runs for name in names}
    try:
        lines = asyncio.run(main_async(names, runs, args.baseline, args.baseline_venv))
    except KeyboardInterrupt:
        print("bench: interrupted (SIGINT)", file=sys.stderr)
        return 130
    except asyncio.CancelledError:
        print("bench: interrupted (SIGTERM)", file=sys.stderr)
        return 143
    finally:
        children.stop_all()
    print()
    print(report.table(lines))
    if args.docs is not None:
        command = " ".join(["python -m bench", *(sys.argv[1:] if argv is None else argv)])
        info: dict[str, Any] = next((ln["machine"] for ln in lines if ln.get("machine")), {})
        args.docs.parent.mkdir(parents=True, exist_ok=True)
        args.docs.write_text(report.markdown(lines, command, info))
        print(f"bench: wrote {args.docs}", file=sys.stderr)
    return 1 if any("error" in line for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
