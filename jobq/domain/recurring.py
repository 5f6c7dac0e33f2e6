"""A recurring reminder's recurrence: an RFC 5545 RRULE in an IANA time zone, with an end.

Why RRULE rather than cron for reminders: it is the calendar's own standard (the exports are
iCalendar), it says "every other Monday", "the last Friday of the month", a count or an end
date, and its times are local times of the reminder's zone across DST changes
(`jobq.queue.recurrence`, which also says how a time a DST change skips or repeats is read).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Self

from pydantic import AwareDatetime, BaseModel, Field, field_validator, model_validator

from jobq.domain.types import REQUEST
from jobq.queue.recurrence import Rule, zone

MAX_UNTIL = datetime(9000, 1, 1, tzinfo=UTC)
"""`until` must come before this (every zone's wall-clock time of it is a datetime)."""

UPCOMING = 5
"""Occurrences a reminder shows ahead (`Reminder.next_occurrences`)."""


class Recurrence(BaseModel):
    """A reminder's recurrence: an RFC 5545 `rrule` (such as `FREQ=WEEKLY;BYDAY=MO`; without
    DTSTART, UNTIL or COUNT: the first occurrence is the reminder's time, `until` and `count`
    are fields of their own; at most one occurrence a minute), in IANA zone `tz`, ending at
    `until` (aware, before the year 9000) or after `count` occurrences, or never. Its first
    five occurrences (or all, if fewer) must be found within a budget (`jobq.queue.rrules`),
    each within ten years of the one before: else 422."""

    model_config = REQUEST

    rrule: str = Field(min_length=1, max_length=500)
    tz: str = Field(default="UTC", max_length=64)
    until: AwareDatetime | None = None
    count: int | None = Field(default=None, ge=1, le=100_000)

    @field_validator("tz")
    @classmethod
    def _zone(cls, value: str) -> str:
        zone(value)
        return value

    @field_validator("rrule")
    @classmethod
    def _rule(cls, value: str) -> str:
        text = value.strip().upper().removeprefix("RRULE:")
        parts = dict(p.partition("=")[::2] for p in text.split(";") if p)
        given = sorted({"DTSTART", "UNTIL", "COUNT"} & set(parts))
        if given:
            raise ValueError(f"{', '.join(given)} may not be in the rule: use the fields")
        if parts.get("FREQ") == "SECONDLY" or "BYSECOND" in parts:
            raise ValueError("a reminder recurs at most once a minute (no SECONDLY, BYSECOND)")
        Rule(text, UTC_ZONE, datetime(2026, 1, 1, tzinfo=UTC))  # the parser's reason, if any
        return text

    @field_validator("until")
    @classmethod
    def _until(cls, value: datetime | None) -> datetime | None:
        try:
            if value is not None and value.astimezone(UTC) >= MAX_UNTIL:
                raise ValueError("must be before the year 9000")
        except OverflowError:  # past 9999-12-31 in UTC: 9999-12-31T23:59:59-23:59
            raise ValueError("must be before the year 9000") from None
        return value

    @model_validator(mode="after")
    def _end(self) -> Self:
        if self.until is not None and self.count is not None:
            raise ValueError("give until or count, not both")
        return self

    def text(self) -> str:
        """The RRULE with its end: `;COUNT=n`, or `;UNTIL=` in the zone's wall-clock time."""
        if self.count is not None:
            return f"{self.rrule};COUNT={self.count}"
        if self.until is not None:
            local = self.until.astimezone(zone(self.tz))
            return f"{self.rrule};UNTIL={local:%Y%m%dT%H%M%S}"
        return self.rrule


@dataclass(frozen=True)
class Plan:
    """A recurrence worked out from its start: `text`, the rule its schedule keeps
    (`Rule.definite_text`); `upcoming`, its first occurrences (at most `UPCOMING`)."""

    text: str
    upcoming: list[datetime]


def plan(recurrence: Recurrence, starts_at: datetime) -> Plan:
    """Work out `recurrence` from `starts_at` (aware), within one budget (`jobq.queue.rrules`:
    run it off the event loop, with `rrules.off_loop`). Raises: `ValueError` (`OverBudget`)
    when it has no occurrence, or cannot show its first `UPCOMING` (or all, if fewer) within
    the budget: its occurrences are too far apart or too costly to find."""
    rule = Rule(recurrence.text(), zone(recurrence.tz), starts_at)
    upcoming: list[datetime] = []
    for at in rule.walk(starts_at - timedelta(microseconds=1)):
        upcoming.append(at)
        if len(upcoming) == UPCOMING:
            break
    if not upcoming:
        raise ValueError("the recurrence has no occurrence")
    return Plan(rule.definite_text, upcoming)


UTC_ZONE = zone("UTC")
