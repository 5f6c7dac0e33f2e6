"""The queue over time, for the operator's views (the dashboard, `python -m jobq top`).

`rates`: jobs per second per queue from two readings of the cumulative event counts
(`metrics.event_counts`), as a view that refreshes itself sees them. `series`: the charts of
the last hour or day, per queue, from the rows the leader writes every minute into
`job_history` (`jobq.queue.leader.history`): jobs/s enqueued, succeeded and failed, and the
percentiles of the pickup lag and the run time, each between two rows.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from jobq.db import Connection
from jobq.queue import sql
from jobq.queue.metrics import BOUNDS

RATE_EVENTS = ("enqueued", "succeeded", "failed")
"""The events whose rates (jobs/s) the views show (from `job_counter`)."""

RATE_WINDOW_S = 60.0
"""Rates are averaged over the readings of the last minute (at least `MIN_RATE_SPAN_S`)."""
MIN_RATE_SPAN_S = 1.0

Counts = dict[str, dict[str, int]]
"""Cumulative event counts: `{queue: {event: count}}` (`metrics.event_counts`)."""


def rates(
    readings: deque[tuple[float, Counts]], now_s: float, counts: Counts
) -> dict[str, dict[str, float]]:
    """Jobs/s per queue and event (`RATE_EVENTS`): the change of the cumulative `counts` since
    the oldest of `readings` (monotonic seconds, counts) within `RATE_WINDOW_S` of `now_s`,
    over that interval; empty until that interval is `MIN_RATE_SPAN_S` long. `readings` is
    updated: older ones dropped, this one kept when `MIN_RATE_SPAN_S` after the last."""
    while readings and now_s - readings[0][0] > RATE_WINDOW_S:
        readings.popleft()
    if not readings or now_s - readings[-1][0] >= MIN_RATE_SPAN_S:
        readings.append((now_s, counts))
    then, old = readings[0]
    if now_s - then < MIN_RATE_SPAN_S:
        return {}
    return {
        queue: {
            event: max(0, events.get(event, 0) - old.get(queue, {}).get(event, 0)) / (now_s - then)
            for event in RATE_EVENTS
        }
        for queue, events in counts.items()
    }


WINDOWS = {"1h": (timedelta(hours=1), 1), "24h": (timedelta(hours=24), 15)}
"""The charts' windows: their span and their step in minutes (60 and 96 points)."""

QUANTILES = {"p50": 0.5, "p95": 0.95}
"""The percentiles of the pickup lag and the run time that the charts draw."""

RATE_SERIES = {"enqueued": "enqueued", "succeeded": "succeeded", "failed": "failed"}


def quantile(q: float, buckets: Sequence[int], bounds: Sequence[float] = BOUNDS) -> float | None:
    """The `q` quantile (0-1) of the observations counted in `buckets` (not cumulative;
    `buckets[i]` in (bounds[i-1], bounds[i]], the last above every bound), interpolated
    linearly within its bucket as Prometheus' `histogram_quantile` does (from 0 in the first
    bucket; the last bound for the one above them all). None when nothing was observed."""
    total = sum(buckets)
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(buckets):
        if n > 0 and seen + n >= rank:
            if i >= len(bounds):
                return bounds[-1]
            lower = bounds[i - 1] if i > 0 else 0.0
            return lower + (bounds[i] - lower) * (rank - seen) / n
        seen += n
    return bounds[-1]


def _increase(now: int, before: int) -> int:
    """A counter's increase; a counter that went down was reset (its rows started afresh)."""
    return now - before if now >= before else now


def _step(row: Any, before: Any) -> dict[str, float | None]:
    """The rates (jobs/s) and percentiles (s) between two history rows of a queue."""
    seconds = (row["at"] - before["at"]).total_seconds()
    point: dict[str, float | None] = {
        name: _increase(row[name], before[name]) / seconds for name in RATE_SERIES
    }
    for metric in ("pickup", "run"):
        now_b, old_b = row[f"{metric}_buckets"], before[f"{metric}_buckets"]
        if len(now_b) == len(old_b) and all(a >= b for a, b in zip(now_b, old_b, strict=True)):
            step = [a - b for a, b in zip(now_b, old_b, strict=True)]
        else:  # new bounds: the row started afresh
            step = list(now_b)
        for name, q in QUANTILES.items():
            point[f"{metric}_{name}"] = quantile(q, step)
    return point


async def series(conn: Connection, *, now: datetime, window: str) -> dict[str, Any]:
    """The charts of `window` (a key of `WINDOWS`) at `now`, from `job_history`: `{"window",
    "step_s", "queues": [{"name", "t": [epoch seconds], "enqueued", "succeeded", "failed":
    [jobs/s], "pickup_p50", "pickup_p95", "run_p50", "run_p95": [seconds or null]}]}`, one
    point per step that has a row before it. Raises: `KeyError` for an unknown window."""
    span, step_min = WINDOWS[window]
    since = now.replace(second=0, microsecond=0) - span - timedelta(minutes=step_min)
    rows = await sql.job_history_read.fetch(conn, since=since, step_min=step_min)
    names = [*RATE_SERIES, *(f"{m}_{q}" for m in ("pickup", "run") for q in QUANTILES)]
    queues: list[dict[str, Any]] = []
    for name, group in itertools.groupby(rows, key=lambda r: r["queue"]):
        chart: dict[str, Any] = {"name": name, "t": []} | {n: [] for n in names}
        for before, row in itertools.pairwise(group):
            point = _step(row, before)
            chart["t"].append(row["at"].timestamp())
            for n in names:
                chart[n].append(point[n])
        queues.append(chart)
    return {"window": window, "step_s": step_min * 60, "queues": queues}
