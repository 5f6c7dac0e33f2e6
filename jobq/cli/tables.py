"""The CLI's output: aligned tables of one-line cells, and JSON of what JSON does not know.
Times are ISO 8601 in UTC with `Z` (to the second in tables), durations seconds."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

MAX_CELL = 60
"""A table cell longer than this is cut (`--json` gives it whole)."""


def utc(value: datetime) -> str:
    """`value` in ISO 8601 UTC with `Z` (a naive one as it is)."""
    if value.tzinfo is not None:
        value = value.astimezone(UTC)
    return value.isoformat().replace("+00:00", "Z")


def to_json(value: Any) -> Any:
    """The JSON form of a value JSON does not know: a datetime in UTC with `Z`, a duration
    in seconds, a decimal a number, anything else (a UUID, ...) its text."""
    if isinstance(value, datetime):
        return utc(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return float(value)
    return str(value)


def cell(value: Any, width: int = MAX_CELL) -> str:
    """`value` on one line, at most `width` characters: `-` for None, times to the second."""
    if value is None:
        text = "-"
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, datetime):
        text = utc(value.replace(microsecond=0))
    elif isinstance(value, timedelta):
        text = f"{value.total_seconds():g}s"
    elif isinstance(value, dict | list):
        text = json.dumps(value, default=to_json, ensure_ascii=False)
    else:
        text = " ".join(str(value).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """`rows` as an aligned table under a header of `columns` (default: the first row's keys);
    numbers right-aligned."""
    columns = list(columns or (rows[0] if rows else []))
    cells = [[cell(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    numeric = [
        any(number(row.get(c)) for row in rows)
        and all(number(row.get(c)) or row.get(c) is None for row in rows)
        for c in columns
    ]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if n else v.ljust(w) for v, w, n in zip(values, widths, numeric, strict=True)
        ).rstrip()

    return "\n".join([line(columns), *(line(r) for r in cells)])


def number(value: Any) -> bool:
    """Whether `value` is a number (right-aligned in a table); a bool is not."""
    return isinstance(value, int | float | Decimal) and not isinstance(value, bool)
