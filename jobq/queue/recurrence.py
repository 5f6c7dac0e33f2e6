"""Recurrences: when a schedule's occurrences are (`jobq.queue.schedule` enqueues them).

A schedule recurs by a cron expression (5 fields, or 6 with seconds first; `croniter`), a fixed
interval (seconds, at least 1), or an RFC 5545 RRULE (`dateutil.rrule`; recurring reminders),
in an IANA time zone (`zoneinfo`). Times are wall-clock times in the schedule's zone (cron,
RRULE), or instants (an interval, on multiples of its length since the Unix epoch). The rule for
the wall-clock times that a DST change skips or repeats (`wall_time`): a time that does not
exist (spring forward) is moved forward by the gap (02:30 becomes 03:30); a time that happens
twice (fall back) fires once, at the first.

Misfires (`due`): an occurrence more than `MISFIRE_GRACE` in the past when the scheduler comes
to it (every worker was down) follows its schedule's policy: `skip` (none of the missed), `one`
(the default: the latest missed, once, at once) or `backfill` (the `backfill` latest).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from dateutil.rrule import rrule

from jobq.queue import rrules
from jobq.queue.rrules import MAX_GAP, Budget, OverBudget

__all__ = ["OverBudget"]

log = logging.getLogger(__name__)

Misfire = Literal["skip", "one", "backfill"]

LOOK_AHEAD = timedelta(seconds=10)
"""How far ahead occurrences are enqueued: each is in the queue that long before its time."""

MISFIRE_GRACE = timedelta(seconds=30)
"""An occurrence older than this when the scheduler comes to it was missed (its misfire policy
decides); a younger one is enqueued, ripe at once."""

MAX_PER_ROUND = 1000
"""Occurrences of one schedule enqueued in one round, at most (a 1 s schedule needs 10)."""


def zone(name: str) -> ZoneInfo:
    """The IANA time zone `name`. Raises: `ValueError` naming it when unknown."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown time zone {name!r}") from exc


def wall_time(naive: datetime, tz: ZoneInfo) -> datetime:
    """The instant (aware, UTC) of wall-clock time `naive` in `tz`. A time that does not exist
    there (spring forward) is moved forward by the gap; one that happens twice (fall back) is
    the first. (Python's `fold=0`: the offset in force before the change.)"""
    return naive.replace(tzinfo=tz, fold=0).astimezone(UTC)


class Recurrence(Protocol):
    """A schedule's occurrences: aware UTC datetimes, strictly after or before a given one."""

    def after(self, t: datetime) -> datetime | None: ...

    def before(self, t: datetime) -> datetime | None: ...


@dataclass(frozen=True)
class Cron:
    """A cron expression (5 fields; or 6, seconds first) in wall-clock time of `tz`."""

    expr: str
    tz: ZoneInfo

    def __post_init__(self) -> None:
        if not croniter.is_valid(self.expr, second_at_beginning=True):
            raise ValueError(f"invalid cron expression {self.expr!r}")

    def _walk(self, t: datetime, forward: bool) -> datetime:
        local = t.astimezone(self.tz).replace(tzinfo=None)
        times = croniter(self.expr, local, second_at_beginning=True)
        while True:
            step = times.get_next(datetime) if forward else times.get_prev(datetime)
            found = wall_time(step, self.tz)
            if (found > t) if forward else (found < t):
                return found

    def after(self, t: datetime) -> datetime:
        return self._walk(t, forward=True)

    def before(self, t: datetime) -> datetime:
        return self._walk(t, forward=False)


@dataclass(frozen=True)
class Interval:
    """Every `every` (at least 1 s), on multiples of it since `anchor` (an instant)."""

    every: timedelta
    anchor: datetime = datetime(1970, 1, 1, tzinfo=UTC)

    def __post_init__(self) -> None:
        if self.every < timedelta(seconds=1):
            raise ValueError(f"an interval must be at least 1 s, not {self.every}")

    def after(self, t: datetime) -> datetime:
        n = math.floor((t - self.anchor) / self.every) + 1
        return self.anchor + n * self.every

    def before(self, t: datetime) -> datetime:
        n = math.ceil((t - self.anchor) / self.every) - 1
        return self.anchor + n * self.every


@dataclass(frozen=True)
class Rule:
    """An RFC 5545 RRULE (with its own COUNT or UNTIL, if any) from `starts_at`, in wall-clock
    time of `tz`. Each search has a budget and starts at the period it needs
    (`jobq.queue.rrules`). Raises: `ValueError` for an invalid rule; `OverBudget` (a
    `ValueError`) for a COUNT whose last occurrence is over budget."""

    text: str
    tz: ZoneInfo
    starts_at: datetime
    _rule: rrule = field(init=False, repr=False, compare=False)
    _shape: rrules.Shape = field(init=False, repr=False, compare=False)
    _start: datetime = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        start = self.starts_at.astimezone(self.tz).replace(tzinfo=None, microsecond=0)
        rule = rrules.parse(rrules.normalized(self.text, start), start)
        if rrules.shape(rule).count is not None:  # made an UNTIL: a search may start anywhere
            found = list(rrules.occurrences(rule, Budget(horizon=datetime.max)))
            last = found[-1] if found else start - timedelta(seconds=1)
            rule = rule.replace(count=None, until=last)
        object.__setattr__(self, "_rule", rule)
        object.__setattr__(self, "_shape", rrules.shape(rule))
        object.__setattr__(self, "_start", start)

    @property
    def definite_text(self) -> str:
        """The rule as it is evaluated: every part written out (`rrules.normalized`), a COUNT
        turned into the UNTIL of its last occurrence (what a schedule stores)."""
        text = rrules.normalized(self.text, self._start)
        kept = [p for p in text.split(";") if not p.startswith(("COUNT=", "UNTIL="))]
        if self._shape.until is not None:
            kept.append(f"UNTIL={self._shape.until:%Y%m%dT%H%M%S}")
        return ";".join(kept)

    def _rebased(self, local: datetime) -> datetime:
        """The latest start, at or before `local` (naive), from which the rule yields the
        occurrences it yields from its own start: the start of the active period (a multiple
        of INTERVAL periods after the first) that holds `local`, or its own start."""
        if local <= self._start:
            return self._start
        freq, every, wkst = self._shape.freq, self._shape.interval, self._shape.wkst
        first = rrules.period_start(freq, self._start, wkst)
        here = rrules.period_start(freq, local, wkst)
        periods = rrules.periods_between(freq, first, here) // every * every
        return self._start if periods <= 0 else rrules.add_periods(freq, first, periods)

    def walk(self, t: datetime) -> Iterator[datetime]:
        """The occurrences (aware UTC) strictly after `t`, in order, within one `Budget`,
        each within `MAX_GAP` of the one before (of `t`, for the first). Raises: `OverBudget`
        when the walk runs out of budget, or finds no occurrence within that gap while the
        rule goes on."""
        local = t.astimezone(self.tz).replace(tzinfo=None)
        until = self._shape.until
        budget = Budget(horizon=self._horizon(local))
        rule = self._rule.replace(dtstart=self._rebased(local))
        for step in rrules.occurrences(rule, budget):
            found = wall_time(step, self.tz)
            if found > t:
                yield found
                budget.horizon = self._horizon(step)
        if until is None or until > budget.horizon:
            raise OverBudget(f"no occurrence within ten years after {t:%Y-%m-%d}")

    def _horizon(self, local: datetime) -> datetime:
        until = self._shape.until
        horizon = local + MAX_GAP
        return horizon if until is None else min(horizon, until)

    def after(self, t: datetime) -> datetime | None:
        """The first occurrence after `t`, or None (the rule has ended). Raises: `OverBudget`."""
        return next(self.walk(t), None)

    def before(self, t: datetime) -> datetime | None:
        """The last occurrence before `t`, or None (none since its start): windows of periods
        searched backwards, within one `Budget`. Raises: `OverBudget`."""
        local = t.astimezone(self.tz).replace(tzinfo=None)
        freq, every = self._shape.freq, self._shape.interval
        budget = Budget(horizon=local)
        end = local
        while end > self._start:
            here = rrules.period_start(freq, end, self._shape.wkst)
            begin = self._rebased(rrules.add_periods(freq, here, -WINDOW[freq] * every))
            budget.horizon = end
            last = None
            for step in rrules.occurrences(self._rule.replace(dtstart=begin), budget):
                found = wall_time(step, self.tz)
                if step >= end or found >= t:
                    break
                last = found
            if last is not None:
                return last
            if local - begin > MAX_GAP:
                raise OverBudget(f"no occurrence within ten years before {t:%Y-%m-%d}")
            end = begin
        return None


WINDOW = {
    "YEARLY": 1,
    "MONTHLY": 12,
    "WEEKLY": 5,
    "DAILY": 31,
    "HOURLY": 24,
    "MINUTELY": 60,
    "SECONDLY": 60,
}
"""Periods (times INTERVAL) of each window `Rule.before` searches, back from its time."""


def after_or_end(recurrence: Recurrence, t: datetime, name: str) -> datetime | None:
    """`recurrence.after(t)`; None, the schedule's end, when that is over budget
    (`jobq.queue.rrules.OverBudget`: the next occurrence is more than ten years away, or too
    costly to find), with a warning naming schedule `name`."""
    try:
        return recurrence.after(t)
    except OverBudget as exc:
        log.warning("schedule %s ends: its next occurrence is over budget (%s)", name, exc)
        return None


def due(
    recurrence: Recurrence,
    next_at: datetime | None,
    *,
    now: datetime,
    horizon: datetime,
    misfire: Misfire,
    backfill: int | None = None,
) -> tuple[list[datetime], datetime | None]:
    """The occurrences to enqueue now, from `next_at` (the first not enqueued yet) up to
    `horizon`, and the next one after them (None: the schedule has ended).

    Occurrences older than `now - MISFIRE_GRACE` were missed: `skip` drops them, `one` keeps
    the latest, `backfill` the `backfill` latest (each its own job, ripe at once). At most
    `MAX_PER_ROUND` are returned; the rest come next round. An occurrence whose next one is
    over budget (`jobq.queue.rrules`) is the last. Raises: `OverBudget` when the first one
    after the misfired ones is.
    """
    found: list[datetime] = []
    t = next_at
    cutoff = now - MISFIRE_GRACE
    if t is not None and t < cutoff:
        keep = {"skip": 0, "one": 1, "backfill": backfill or 1}[misfire]
        missed: list[datetime] = []
        last = recurrence.before(cutoff)
        while last is not None and last >= t and len(missed) < keep:
            missed.append(last)
            last = recurrence.before(last)
        found = missed[::-1]
        t = recurrence.after(cutoff - timedelta(microseconds=1))
    while t is not None and t <= horizon and len(found) < MAX_PER_ROUND:
        found.append(t)
        try:
            t = recurrence.after(t)
        except OverBudget as exc:  # those found are due all the same; then it ends
            log.warning("a schedule ends after %s: its next occurrence is over budget (%s)", t, exc)
            t = None
    return found, t


def recurrence_of(row: Any) -> Recurrence:
    """The recurrence of a `job_schedule` row (or anything with its fields)."""
    if row["cron"] is not None:
        return Cron(row["cron"], zone(row["tz"]))
    if row["every_s"] is not None:
        anchor = row["starts_at"] or datetime(1970, 1, 1, tzinfo=UTC)
        return Interval(timedelta(seconds=row["every_s"]), anchor)
    return Rule(row["rrule"], zone(row["tz"]), row["starts_at"])


@dataclass(frozen=True)
class ScheduleSpec:
    """A schedule declared in code (`Registry.periodic`): `job_type` enqueued with `arguments`
    at each occurrence of `cron` or `every` (seconds) in zone `tz`, following `misfire`.
    Raises: `ValueError` for an invalid expression, an interval under 1 s, an unknown zone, or
    `backfill` without `misfire="backfill"`."""

    name: str
    job_type: str
    cron: str | None = None
    every_s: float | None = None
    tz: str = "UTC"
    arguments: tuple[tuple[str, Any], ...] = ()
    misfire: Misfire = "one"
    backfill: int | None = None
    queue: str | None = None

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every_s is None):
            raise ValueError(f"schedule {self.name!r}: give a cron expression or an interval")
        if (self.backfill is not None) != (self.misfire == "backfill"):
            raise ValueError(f"schedule {self.name!r}: backfill=N goes with misfire='backfill'")
        recurrence_of(self.row())

    def row(self) -> dict[str, Any]:
        """Its fields as `job_schedule` has them."""
        return {
            "name": self.name,
            "job_type": self.job_type,
            "arguments": dict(self.arguments),
            "queue": self.queue,
            "cron": self.cron,
            "every_s": self.every_s,
            "rrule": None,
            "tz": self.tz,
            "starts_at": None,
            "misfire": self.misfire,
            "backfill": self.backfill,
        }

    def text(self) -> str:
        """The declaration as text (`job_schedule.spec`): a schedule whose text changed starts
        again from now."""
        return json.dumps(self.row(), sort_keys=True, default=str)
