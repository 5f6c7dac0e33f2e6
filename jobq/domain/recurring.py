"""A recurring reminder's recurrence: an RFC 5545 RRULE in an IANA time zone, with an end.

Why RRULE rather than cron for reminders: it is the calendar's own standard (the exports are
iCalendar), it says "every other Monday", "the last Friday of the month", a count or an end
date, and its times are local times of the reminder's zone across DST changes
(`jobq.queue.recurrence`, which also says how a time a DST change skips or repeats is read).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Self

from pydantic import AwareDatetime, BaseModel, Field, field_validator, model_validator

from jobq.domain.types import REQUEST
from jobq.queue.recurrence import Rule, zone


class Recurrence(BaseModel):
    """A reminder's recurrence: an RFC 5545 `rrule` (such as `FREQ=WEEKLY;BYDAY=MO`; without
    DTSTART, UNTIL or COUNT: the first occurrence is the reminder's time, `until` and `count`
    are fields of their own; at most one occurrence a minute), in IANA zone `tz`, ending at
    `until` (aware) or after `count` occurrences, or never."""

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

    def occurrences(self, starts_at: datetime, after: datetime, n: int) -> list[datetime]:
        """Up to `n` occurrences (aware UTC) strictly after `after`."""
        rule = Rule(self.text(), zone(self.tz), starts_at)
        found: list[datetime] = []
        t: datetime | None = after
        while len(found) < n and t is not None:
            t = rule.after(t)
            if t is not None:
                found.append(t)
        return found


UTC_ZONE = zone("UTC")
