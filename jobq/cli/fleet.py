"""`python -m jobq workers` and `python -m jobq top`: the fleet from a shell.

`top` is a live terminal view (rich's `Live`): the queues (depth, held, running, jobs/s
enqueued, succeeded and failed), the workers and the dead letter, read in one short read-only
transaction every `--interval` seconds until Ctrl-C (or SIGTERM), like pgqueuer's
`pgq dashboard`. Rates come from the cumulative event counts of the metrics
(`jobq.queue.history.rates`), so they are the whole fleet's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import time
from collections import deque
from datetime import datetime
from typing import TYPE_CHECKING, Any

from jobq import clock, db
from jobq.cli.commands import OK, USAGE, emit
from jobq.cli.tables import table
from jobq.config import Settings
from jobq.dashboard.format import count, rate, span
from jobq.queue import dead, limits, metrics
from jobq.queue.history import MIN_RATE_SPAN_S, RATE_EVENTS, Counts, rates
from jobq.queue.limits import queue_holds

if TYPE_CHECKING:  # rich is imported where `top` draws: every other command starts without it
    from rich.console import Group

RATE_COLUMNS = ("enq/s", "done/s", "fail/s")
"""The headings of the rates of `RATE_EVENTS` (enqueued, succeeded, failed)."""

WORKER_COLUMNS = ("id", "host", "pid", "alive", "heartbeat_at", "started_at", "running_jobs")


async def workers(args: argparse.Namespace, settings: Settings) -> int:
    """The registered workers, as `GET /workers` (`dead.list_workers`)."""
    async with db.transaction(readonly=True) as conn:
        rows = await dead.list_workers(
            conn, now=clock.now(), heartbeat_grace=settings.heartbeat_grace
        )
    text = table(rows, list(WORKER_COLUMNS)) if rows else "no workers registered"
    emit(args, {"workers": rows}, text)
    return OK


async def read(settings: Settings) -> dict[str, Any]:
    """One reading for a frame: `now`, `queues` (`limits.list_queues`, counted up to
    `metrics.LIVE_COUNT_MAX` + 1, with `held` from the depth snapshot), `counts` (cumulative
    events per queue), `workers`, `dead` (counted up to the same cap) and the vacuum figures."""
    now = clock.now()
    cap = metrics.LIVE_COUNT_MAX
    async with db.transaction(readonly=True) as conn:
        queues = await limits.list_queues(conn, now=now, max_count=cap + 1)
        held = {q: h["held"] for q, h in (await queue_holds(conn, now=now)).items()}
        return {
            "now": now,
            "queues": [q | {"held": held.get(q["name"])} for q in queues],
            "counts": await metrics.event_counts(conn),
            "workers": await dead.list_workers(
                conn, now=now, heartbeat_grace=settings.heartbeat_grace
            ),
            "dead": await dead.count(conn, max_count=cap),
            "vacuum": await metrics.vacuum_stats(conn, now=now),
        }


def _depth(value: int | None) -> str:
    cap = metrics.LIVE_COUNT_MAX
    return f"> {count(cap)}" if value is not None and value > cap else count(value)


def frame(reading: dict[str, Any], per_s: dict[str, dict[str, float]], every_s: float) -> Group:
    """The view of one `reading` with the rates `per_s` (empty: not measured yet)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    now: datetime = reading["now"]
    dead_jobs = reading["dead"]
    oldest = reading["vacuum"]["oldest_transaction_s"]
    head = Text.assemble(
        ("jobq top", "bold"),
        f"  {now.strftime('%Y-%m-%d %H:%M:%S')} UTC · every {every_s:g} s · Ctrl-C quits · ",
        (f"dead letter {_depth(dead_jobs)}", "bold red" if dead_jobs else "dim"),
        f" · oldest transaction {span(oldest) if oldest is not None else 'none'}",
    )
    queues = Table(
        title="queues (held: ripe jobs a concurrency limit holds back; rates: jobs/s)",
        title_justify="left",
    )
    for name in ("queue", "state", "ripe", "held", "later", "running", *RATE_COLUMNS):
        queues.add_column(name, justify="left" if name in ("queue", "state") else "right")
    for q in reading["queues"]:
        r = per_s.get(q["name"], {})
        limit = f"/{q['max_running']}" if q["max_running"] else ""
        queues.add_row(
            q["name"],
            Text("paused", "yellow") if q["paused"] else Text("active", "green"),
            _depth(q["ripe"]),
            count(q["held"]),
            _depth(q["scheduled"]),
            f"{count(q['running'])}{limit}",
            *(rate(r.get(event)) for event in RATE_EVENTS),
        )
    fleet = Table(title="workers", title_justify="left")
    for name in ("id", "host", "pid", "state", "heartbeat", "running"):
        fleet.add_column(name, justify="right" if name in ("id", "pid", "running") else "left")
    for w in reading["workers"]:
        fleet.add_row(
            str(w["id"]),
            w["host"],
            str(w["pid"]),
            Text("alive", "green") if w["alive"] else Text("dead", "red"),
            f"{span((now - w['heartbeat_at']).total_seconds())} ago",
            count(w["running_jobs"]),
        )
    if not reading["workers"]:
        fleet.caption = "no workers registered: no job runs until one starts"
    return Group(head, queues, fleet)


def _stop_on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


async def top(args: argparse.Namespace, settings: Settings) -> int:
    """Show the live view every `args.interval` seconds until Ctrl-C or SIGTERM (exit 0); with
    `args.once`, print one frame (its rates over `MIN_RATE_SPAN_S`) and exit."""
    from rich.console import Console
    from rich.live import Live

    if args.interval < 0.2:
        print("jobq: --interval must be at least 0.2 seconds", flush=True)
        return USAGE
    readings: deque[tuple[float, Counts]] = deque()

    async def next_frame() -> Group:
        reading = await read(settings)
        return frame(reading, rates(readings, time.monotonic(), reading["counts"]), args.interval)

    console = Console()
    if args.once:
        await next_frame()
        await asyncio.sleep(MIN_RATE_SPAN_S)
        console.print(await next_frame())
        return OK
    stop = asyncio.Event()
    _stop_on_signals(stop)
    with Live(await next_frame(), console=console, auto_refresh=False) as live:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), args.interval)
            if not stop.is_set():
                live.update(await next_frame(), refresh=True)
    return OK
