"""The queue over time, for the operator's views (the dashboard, `python -m jobq top`).

`rates`: jobs per second per queue from two readings of the cumulative event counts
(`metrics.event_counts`), as a view that refreshes itself sees them.
"""

from __future__ import annotations

from collections import deque

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
