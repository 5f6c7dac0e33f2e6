"""Numbers and times as a person reads them on the dashboard (Jinja filters)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from markupsafe import Markup, escape

DASH = "\u2013"
"""What a missing figure shows (an en dash)."""


def count(value: int | float | None) -> str:
    """`1234567` -> `1,234,567`; None -> a dash."""
    if value is None:
        return DASH
    return f"{value:,}" if isinstance(value, int) else f"{value:,.1f}"


def depth(value: int, cap: int) -> Markup:
    """A queue's depth counted up to `cap` + 1: `1,234`, or `> 100,000` past the cap."""
    if value > cap:
        return Markup('<span title="counted up to {} to keep the page fast">&gt; {}</span>').format(
            count(cap), count(cap)
        )
    return escape(count(value))


def nbytes(value: int | None) -> str:
    """A size in bytes in binary units: `8.0 KiB`, `1.5 GiB`."""
    if value is None:
        return DASH
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def span(seconds: float) -> str:
    """A duration in the largest unit that keeps it readable: `42 s`, `3 min`, `5 h`, `2 d`."""
    seconds = abs(seconds)
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 86400 * 2:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:,.0f} d"


def utc(at: datetime) -> str:
    """`2026-11-25 03:04:05 UTC`."""
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def when(at: datetime | None, now: datetime) -> Markup:
    """A `<time>` saying how long ago (or in how long) `at` is from `now`, the exact UTC time
    in its title: `<time datetime=... title="2026-11-25 03:04:05 UTC">3 s ago</time>`."""
    if at is None:
        return escape(DASH)
    delta = (at - now).total_seconds()
    text = f"in {span(delta)}" if delta > 0.5 else f"{span(delta)} ago"
    return Markup('<time datetime="{}" title="{}">{}</time>').format(
        at.astimezone(UTC).isoformat(), utc(at), text
    )


def rate(value: float | None) -> str:
    """Jobs per second: `12.3`, `0.05`, a dash when not measured yet."""
    if value is None:
        return DASH
    return f"{value:,.0f}" if value >= 100 else f"{value:,.2f}".rstrip("0").rstrip(".")


def seconds(value: timedelta | None) -> str:
    """A `timedelta` as `1 s`, `0.5 s`."""
    return DASH if value is None else f"{value.total_seconds():g} s"


def pretty(value: Any) -> Markup:
    """A JSON value, escaped, for a `<pre>`."""
    return escape(json.dumps(value, indent=2, ensure_ascii=False, default=str))


FILTERS = {
    "count": count,
    "depth": depth,
    "nbytes": nbytes,
    "span": span,
    "utc": utc,
    "rate": rate,
    "seconds": seconds,
    "pretty": pretty,
}
