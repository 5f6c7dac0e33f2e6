"""RRULE evaluation within a budget (`jobq.queue.rrules`, `jobq.queue.recurrence.Rule`): a rule
that never occurs, or is too costly, is `OverBudget` after a bounded walk; a search starts at
the period it needs, and finds what dateutil finds walking from the rule's start."""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime, timedelta

import pytest
from dateutil.rrule import rrulestr

from jobq.queue import rrules
from jobq.queue.recurrence import Rule, wall_time, zone
from jobq.queue.rrules import MAX_CANDIDATES, Budget, OverBudget

START = datetime(2026, 3, 20, 8, 30, 15, tzinfo=UTC)


def reference_after(text: str, tz: str, t: datetime) -> datetime | None:
    """dateutil from the rule's own start, unbudgeted, as `Rule` read rules before budgets."""
    local_start = START.astimezone(zone(tz)).replace(tzinfo=None)
    rule = rrulestr(text, dtstart=local_start, ignoretz=True)
    local = t.astimezone(zone(tz)).replace(tzinfo=None)
    while True:
        step = rule.after(local)
        if step is None:
            return None
        found = wall_time(step, zone(tz))
        if found > t:
            return found
        local = step


def reference_before(text: str, tz: str, t: datetime) -> datetime | None:
    local_start = START.astimezone(zone(tz)).replace(tzinfo=None)
    rule = rrulestr(text, dtstart=local_start, ignoretz=True)
    local = t.astimezone(zone(tz)).replace(tzinfo=None)
    while True:
        step = rule.before(local)
        if step is None:
            return None
        found = wall_time(step, zone(tz))
        if found < t:
            return found
        local = step


RULES = [
    ("FREQ=DAILY", "UTC"),
    ("FREQ=DAILY;INTERVAL=3", "Europe/Paris"),
    ("FREQ=WEEKLY", "America/New_York"),
    ("FREQ=WEEKLY;INTERVAL=2;BYDAY=MO,FR", "Europe/Paris"),
    ("FREQ=WEEKLY;INTERVAL=3;BYDAY=SU,TU;WKST=SU", "Australia/Sydney"),
    ("FREQ=MONTHLY", "UTC"),
    ("FREQ=MONTHLY;BYMONTHDAY=31", "Europe/London"),
    ("FREQ=MONTHLY;INTERVAL=5;BYDAY=-1FR", "Asia/Tokyo"),
    ("FREQ=MONTHLY;BYDAY=MO,TU,WE,TH,FR;BYSETPOS=-1", "UTC"),
    ("FREQ=YEARLY", "Pacific/Kiritimati"),
    ("FREQ=YEARLY;INTERVAL=2;BYMONTH=2;BYMONTHDAY=29", "UTC"),
    ("FREQ=YEARLY;BYWEEKNO=20;BYDAY=MO", "Europe/Paris"),
    ("FREQ=HOURLY;INTERVAL=5", "Europe/Paris"),
    ("FREQ=HOURLY;INTERVAL=7;BYHOUR=1,8,15,22", "UTC"),
    ("FREQ=MINUTELY;INTERVAL=45", "America/Sao_Paulo"),
    ("FREQ=MINUTELY;INTERVAL=7;BYHOUR=9,10", "UTC"),
    ("FREQ=DAILY;BYHOUR=2;BYMINUTE=30", "Europe/Paris"),  # the spring change skips 02:30
    ("FREQ=DAILY;COUNT=40", "Europe/Paris"),
    ("FREQ=WEEKLY;BYDAY=TH;UNTIL=20270101T000000", "UTC"),
]


@pytest.mark.parametrize(("text", "tz"), RULES)
def test_a_search_from_any_period_finds_what_a_walk_from_the_start_finds(
    text: str, tz: str
) -> None:
    rule = Rule(text, zone(tz), START)
    rng = random.Random(text)
    moments = [START - timedelta(days=1), START, START + timedelta(microseconds=1)]
    moments += [START + timedelta(seconds=rng.randrange(3 * 366 * 86400)) for _ in range(15)]
    for t in moments:
        assert rule.after(t) == reference_after(text, tz, t), (text, t)
        assert rule.before(t) == reference_before(text, tz, t), (text, t)


def test_a_count_becomes_the_until_of_its_last_occurrence() -> None:
    rule = Rule("FREQ=WEEKLY;BYDAY=MO;COUNT=4", zone("Europe/Paris"), START)
    assert rule.definite_text == (
        "FREQ=WEEKLY;BYDAY=MO;BYHOUR=9;BYMINUTE=30;BYSECOND=15;WKST=MO;UNTIL=20260413T093015"
    )
    ends = [rule.after(START + timedelta(weeks=w)) for w in range(5)]
    assert [at is None for at in ends] == [False, False, False, False, True]


def test_normalized_writes_out_what_dateutil_takes_from_the_start() -> None:
    start = datetime(2026, 3, 20, 8, 30, 15)  # a Friday
    assert rrules.normalized("FREQ=YEARLY", start) == (
        "FREQ=YEARLY;BYHOUR=8;BYMINUTE=30;BYSECOND=15;BYMONTH=3;BYMONTHDAY=20;WKST=MO"
    )
    assert rrules.normalized("FREQ=WEEKLY;WKST=SU", start) == (
        "FREQ=WEEKLY;WKST=SU;BYHOUR=8;BYMINUTE=30;BYSECOND=15;BYDAY=FR"
    )
    assert rrules.normalized("FREQ=MINUTELY;BYDAY=MO", start) == (
        "FREQ=MINUTELY;BYDAY=MO;BYSECOND=15;WKST=MO"
    )


NEVER = [
    "FREQ=DAILY;BYMONTH=2;BYMONTHDAY=30",  # no 30 February
    "FREQ=MONTHLY;BYMONTH=4;BYMONTHDAY=31",
    "FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO",  # every 28 years or so: too far
    "FREQ=MINUTELY;BYSETPOS=2",  # one candidate a minute: never a second
    "FREQ=HOURLY;BYSETPOS=3",
    "FREQ=WEEKLY;BYDAY=MO;BYMONTHDAY=31;BYMONTH=2",
]


@pytest.mark.parametrize("text", NEVER)
def test_a_rule_that_never_occurs_is_over_budget_after_a_bounded_walk(text: str) -> None:
    rule = Rule(text, zone("UTC"), START)
    started = time.monotonic()
    with pytest.raises(OverBudget):
        rule.after(START)
    assert time.monotonic() - started < 2  # unbudgeted: seconds of CPU, per search
    if text != NEVER[2]:  # 29 February 2044 is a Monday: before 2046, there is one
        with pytest.raises(OverBudget):
            rule.before(START + timedelta(days=3660 * 2))


def test_a_budget_counts_candidates_and_stops_at_its_horizon() -> None:
    rule = rrules.parse("FREQ=DAILY;BYMONTH=2;BYMONTHDAY=30", datetime(2026, 1, 1))
    budget = Budget(horizon=datetime(2027, 1, 1))
    assert list(rrules.occurrences(rule, budget)) == []  # stopped at the horizon
    assert MAX_CANDIDATES - budget.candidates == 366  # a candidate a day, 2026 and 1 Jan 2027
    costly = rrules.parse("FREQ=MINUTELY;BYSETPOS=2", datetime(2026, 1, 1))
    budget = Budget(horizon=datetime.max)
    with pytest.raises(OverBudget):
        list(rrules.occurrences(costly, budget))
    assert budget.candidates < 0


def test_a_search_a_year_on_does_not_walk_the_year() -> None:
    """A reminder every minute, a year after its start: its next occurrence costs a few
    candidates, where a walk from the start builds half a million."""
    rule = Rule("FREQ=MINUTELY", zone("UTC"), START)
    later = START + timedelta(days=365, seconds=7)
    budget = Budget(horizon=datetime.max)
    rule_later = rule._rule.replace(dtstart=rule._rebased(later.replace(tzinfo=None)))
    found = next(rrules.occurrences(rule_later, budget))
    assert found == datetime(2027, 3, 20, 8, 30, 15)
    assert MAX_CANDIDATES - budget.candidates < 10
    assert rule.after(later) == datetime(2027, 3, 20, 8, 31, 15, tzinfo=UTC)


def test_a_sparse_rule_ends_its_walk_where_the_gap_is_over_ten_years() -> None:
    rule = Rule("FREQ=YEARLY;INTERVAL=11", zone("UTC"), START)
    walked = rule.walk(START - timedelta(seconds=1))
    assert next(walked) == START
    with pytest.raises(OverBudget):
        next(walked)
