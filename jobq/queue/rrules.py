"""RFC 5545 recurrence rules (RRULE) with a budget: no evaluation runs long, whatever the rule.

`dateutil.rrule` walks a rule period by period from its start, and checks neither a deadline
nor its own UNTIL while the periods it walks yield nothing: `FREQ=DAILY;BYMONTH=2;BYMONTHDAY=30`
walks to the year 9999 (seconds of CPU), and every search walks from the rule's first period
(a reminder every minute, a year on, walks half a million periods to find its next one).

Here each search has a `Budget`: candidate times (a period's days times the times of each day,
counted as dateutil builds them), CPU time, and a horizon (`MAX_GAP` past where it starts, or
past the last occurrence it found). Past any of them it raises `OverBudget`, a `ValueError`
(the API answers 422). And each search starts at the period it needs rather than at the
rule's first: the rule is first made explicit (`normalized`: the parts dateutil would take
from its start, such as the hour of a daily rule, are written out), so that it yields the same
occurrences from the start of any of its periods (`jobq.queue.recurrence.Rule`); a COUNT is
turned into the UNTIL of its last occurrence, once. Requests run their searches in one thread
of their own (`off_loop`), never on the event loop.

The budget is counted by dateutil's own walk (`_BudgetedInfo`, its per-period helper with a
meter; `_budgeted_iter`, its generator run with that helper): the rule's semantics stay
dateutil's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import threading
import time
import types
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from datetime import datetime, timedelta
from typing import Any, ParamSpec, TypeVar

import dateutil.rrule
from dateutil.rrule import rrule, rrulestr

MAX_GAP = timedelta(days=3660)
"""How far a search looks past where it starts (about ten years, like a reminder's time): a
rule with no occurrence that close is over budget (one that never occurs too)."""

MAX_CANDIDATES = 5_000
"""Candidate times one search may build: a daily rule builds one a day (13 years), a yearly
one 366 a year, an hourly one two an hour (104 days); building them all costs far less than
`MAX_SECONDS` of CPU, which bounds a slower machine."""

MAX_SECONDS = 0.1
"""CPU time one search may take: a safety net on a slow machine (the candidates bound it
first)."""

PAUSE_EVERY = 200
PAUSE_S = 0.0005
"""The rules' thread pauses this long every `PAUSE_EVERY` candidates (see `Budget`)."""

P = ParamSpec("P")
T = TypeVar("T")

FREQS = ("YEARLY", "MONTHLY", "WEEKLY", "DAILY", "HOURLY", "MINUTELY", "SECONDLY")
"""dateutil's frequencies, by their numbers."""
DAYS = ("MO", "TU", "WE", "TH", "FR", "SA", "SU")


class OverBudget(ValueError):
    """The rule needs more than its budget to find an occurrence: none within about ten years,
    or too many candidate times on the way (use a coarser FREQ with BYxxx lists)."""


class Budget:
    """What one search may spend (see the module): `candidates`, and `MAX_SECONDS` of the CPU
    time of its thread; `horizon`, the naive local time past which it stops (`_PastHorizon`).
    In the rules' thread (`off_loop`), it pauses `PAUSE_S` every `PAUSE_EVERY` candidates, so
    that the event loop's thread gets the GIL at once rather than after Python's switch
    interval (5 ms)."""

    def __init__(self, horizon: datetime, candidates: int = MAX_CANDIDATES) -> None:
        self.horizon = horizon
        self.candidates = candidates
        self.deadline = time.thread_time() + MAX_SECONDS
        self._steps = 0
        self._pause_at = candidates - PAUSE_EVERY if getattr(_thread, "pauses", False) else -1

    @property
    def horizon(self) -> datetime:
        return self._horizon

    @horizon.setter
    def horizon(self, value: datetime) -> None:
        self._horizon = value
        self._last_day = (value.year, value.month, value.day)

    def charge(self, count: int, year: int, month: int, day: int) -> None:
        """Spend `count` candidates on the period starting on that day (the clock is read
        every 64 periods). Raises: `OverBudget`; `_PastHorizon` when the period starts after
        the horizon's day."""
        if (year, month, day) > self._last_day:
            raise _PastHorizon()
        self.candidates -= count
        self._steps += 1
        if self.candidates < 0 or (not self._steps % 64 and time.thread_time() > self.deadline):
            raise OverBudget(OverBudget.__doc__)
        if self.candidates < self._pause_at:
            self._pause_at = self.candidates - PAUSE_EVERY
            time.sleep(PAUSE_S)


class _PastHorizon(Exception):
    """The search walked past its horizon without finding what it looks for."""


_budget: ContextVar[Budget] = ContextVar("jobq_rrule_budget")


class _BudgetedInfo(dateutil.rrule._iterinfo):
    """dateutil's per-period helper, charging each period's candidates to the `Budget` of the
    search under way (`_budget`)."""

    def __init__(self, rule: rrule) -> None:
        super().__init__(rule)
        self.budget = _budget.get()
        private: Any = rule
        self.per_day = len(private._timeset or ()) or 1

    def _charged(self, found: Any, year: int, month: int, day: int) -> Any:
        _, start, end = found
        self.budget.charge((end - start) * self.per_day, year, month, day)
        return found

    def ydayset(self, year: int, month: int, day: int) -> Any:
        return self._charged(super().ydayset(year, month, day), year, month, day)

    def mdayset(self, year: int, month: int, day: int) -> Any:
        return self._charged(super().mdayset(year, month, day), year, month, day)

    def wdayset(self, year: int, month: int, day: int) -> Any:
        return self._charged(super().wdayset(year, month, day), year, month, day)

    def ddayset(self, year: int, month: int, day: int) -> Any:
        return self._charged(super().ddayset(year, month, day), year, month, day)

    def _times(self, found: Any) -> Any:
        self.budget.candidates -= len(found)
        return found

    def htimeset(self, hour: int, minute: int, second: int) -> Any:
        return self._times(super().htimeset(hour, minute, second))

    def mtimeset(self, hour: int, minute: int, second: int) -> Any:
        return self._times(super().mtimeset(hour, minute, second))

    def stimeset(self, hour: int, minute: int, second: int) -> Any:
        return self._times(super().stimeset(hour, minute, second))


_rrule: Any = rrule  # what dateutil keeps private is read here, and in `shape`, only
_budgeted_iter = types.FunctionType(
    _rrule._iter.__code__,
    {**vars(dateutil.rrule), "_iterinfo": _BudgetedInfo},
    "_budgeted_iter",
)
"""dateutil's `rrule._iter`, the generator of a rule's occurrences, with `_BudgetedInfo`."""


def occurrences(rule: rrule, budget: Budget) -> Iterator[datetime]:
    """The occurrences (naive) of `rule` in order, each charged to `budget` too, until the
    walk passes its horizon. Raises: `OverBudget`."""
    walk: Iterator[datetime] = _budgeted_iter(rule)
    while True:
        token = _budget.set(budget)  # the walk runs in the caller's context at each step
        try:
            found = next(walk)
            budget.charge(1, found.year, found.month, found.day)
        except (StopIteration, _PastHorizon):
            return
        finally:
            _budget.reset(token)
        yield found


@dataclasses.dataclass(frozen=True)
class Shape:
    """What a parsed rule is made of, which dateutil keeps private: its frequency (a name of
    `FREQS`), INTERVAL, WKST (0 for Monday), UNTIL (naive) and COUNT."""

    freq: str
    interval: int
    wkst: int
    until: datetime | None
    count: int | None


def shape(rule: rrule) -> Shape:
    """The `Shape` of `rule`."""
    private: Any = rule
    return Shape(
        FREQS[private._freq], private._interval, private._wkst, private._until, private._count
    )


def parts(text: str) -> dict[str, str]:
    """The parts of an RRULE (`FREQ=WEEKLY;BYDAY=MO` reads {"FREQ": "WEEKLY", "BYDAY": "MO"})."""
    body = text.strip().upper().removeprefix("RRULE:")
    return {k: v for k, _, v in (p.partition("=") for p in body.split(";") if p)}


def normalized(text: str, start: datetime) -> str:
    """`text` with the parts dateutil would take from `start` (naive local) written out: the
    time of day below the rule's frequency (BYHOUR, BYMINUTE, BYSECOND), and, when the rule
    names no day, the day of a YEARLY (BYMONTH, BYMONTHDAY), MONTHLY (BYMONTHDAY) or WEEKLY
    (BYDAY) rule; WKST=MO when absent (RFC 5545's default). The same occurrences from
    `start`, and now from the start of any of its periods too."""
    found = parts(text)
    if found.get("FREQ") not in FREQS:
        return text  # not a rule: `parse` says why
    freq = FREQS.index(found["FREQ"])
    extra: dict[str, str] = {}
    for name, level, value in (
        ("BYHOUR", 4, start.hour),
        ("BYMINUTE", 5, start.minute),
        ("BYSECOND", 6, start.second),
    ):
        if freq < level and name not in found:
            extra[name] = str(value)
    days = {"BYWEEKNO", "BYYEARDAY", "BYMONTHDAY", "BYDAY", "BYEASTER"}
    if not days & set(found):
        if FREQS[freq] == "YEARLY":
            extra.setdefault("BYMONTH", found.get("BYMONTH", str(start.month)))
            extra["BYMONTHDAY"] = str(start.day)
        elif FREQS[freq] == "MONTHLY":
            extra["BYMONTHDAY"] = str(start.day)
        elif FREQS[freq] == "WEEKLY":
            extra["BYDAY"] = DAYS[start.weekday()]
    extra.setdefault("WKST", found.get("WKST", "MO"))
    return ";".join(f"{k}={v}" for k, v in {**found, **extra}.items())


def period_start(freq: str, t: datetime, wkst: int) -> datetime:
    """The start of the period of frequency `freq` that holds `t` (naive): its year, month,
    week (from day `wkst`, 0 for Monday), day, hour, minute or second."""
    if freq == "YEARLY":
        return datetime(t.year, 1, 1)
    if freq == "MONTHLY":
        return datetime(t.year, t.month, 1)
    if freq == "WEEKLY":
        day = t - timedelta(days=(t.weekday() - wkst) % 7)
        return datetime(day.year, day.month, day.day)
    if freq == "DAILY":
        return datetime(t.year, t.month, t.day)
    if freq == "HOURLY":
        return t.replace(minute=0, second=0, microsecond=0)
    if freq == "MINUTELY":
        return t.replace(second=0, microsecond=0)
    return t.replace(microsecond=0)


_STEP = {
    "WEEKLY": timedelta(weeks=1),
    "DAILY": timedelta(days=1),
    "HOURLY": timedelta(hours=1),
    "MINUTELY": timedelta(minutes=1),
    "SECONDLY": timedelta(seconds=1),
}


def periods_between(freq: str, first: datetime, later: datetime) -> int:
    """How many periods of `freq` from the one starting at `first` to the one at `later`
    (both period starts, naive: wall-clock arithmetic, as dateutil steps)."""
    if freq == "YEARLY":
        return later.year - first.year
    if freq == "MONTHLY":
        return 12 * (later.year - first.year) + later.month - first.month
    return (later - first) // _STEP[freq]


def add_periods(freq: str, first: datetime, count: int) -> datetime:
    """The start of the period `count` periods after the one starting at `first`."""
    if freq == "YEARLY":
        return first.replace(year=first.year + count)
    if freq == "MONTHLY":
        years, month = divmod(first.month - 1 + count, 12)
        return first.replace(year=first.year + years, month=month + 1)
    return first + count * _STEP[freq]


def parse(text: str, start: datetime) -> rrule:
    """The dateutil rule of `text` from `start` (naive local). Raises: `ValueError` saying why
    it is not a rule."""
    try:
        found = rrulestr(text, dtstart=start, ignoretz=True)
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        raise ValueError(f"invalid RRULE {text!r}: {exc}") from None
    if not isinstance(found, rrule):
        raise ValueError(f"invalid RRULE {text!r}: one rule, not a set")
    return found


_thread = threading.local()
"""`pauses`: set in the rules' thread (`Budget`)."""


def _pausing() -> None:
    _thread.pauses = True


_evaluator = ThreadPoolExecutor(
    max_workers=1, thread_name_prefix="jobq-rrule", initializer=_pausing
)
"""The one thread where requests evaluate rules: off the event loop, and one at a time."""


async def off_loop(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`fn(*args, **kwargs)` (a budgeted evaluation) run in the rules' thread."""
    return await asyncio.get_running_loop().run_in_executor(
        _evaluator, functools.partial(fn, *args, **kwargs)
    )
