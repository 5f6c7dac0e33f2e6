"""Retry policy: capped exponential backoff with jitter, a pure function."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True, slots=True)
class Backoff:
    """A retry delay policy (see `backoff_delay`): `base` and `cap` durations, `jitter` in
    [0, 1]. Raises: `ValueError` for a negative base, a cap below the base, or a jitter
    outside [0, 1]."""

    base: timedelta
    cap: timedelta
    jitter: float

    def __post_init__(self) -> None:
        if self.base < timedelta(0) or self.cap < self.base:
            raise ValueError(f"backoff needs 0 <= base <= cap, not {self.base} and {self.cap}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"backoff jitter must be within [0, 1], not {self.jitter}")

    def next_ripe_at(self, attempts: int, now: datetime) -> datetime:
        """When a job that has failed `attempts` times ripens again (`next_ripe_at`)."""
        return next_ripe_at(attempts, now, base=self.base, cap=self.cap, jitter=self.jitter)


def backoff_delay(
    attempts: int,
    *,
    base: timedelta,
    cap: timedelta,
    jitter: float,
    rand: float | None = None,
) -> timedelta:
    """Return how long to wait before the next attempt, after `attempts` (>= 1) failed ones.

    delay = min(cap, base * 2 ** (attempts - 1)) * (1 - jitter * u),  u uniform in [0, 1)

    So the delay lies in ((1 - jitter) * d, d] for d = min(cap, base * 2 ** (attempts - 1)):
    never above the cap, and with `jitter` > 0 the retries of jobs that failed together spread
    out instead of arriving together. `jitter` = 0.5 is "equal jitter" and 1 is "full jitter"
    in Marc Brooker, "Exponential Backoff And Jitter", AWS Architecture Blog, 2015.
    `rand` fixes u (for tests); otherwise it is drawn from `random`.
    Raises: `ValueError` when `attempts` < 1 or `jitter` is outside [0, 1].
    """
    if attempts < 1:
        raise ValueError("attempts must be >= 1")
    if not 0 <= jitter <= 1:
        raise ValueError("jitter must be within [0, 1]")
    u = random.random() if rand is None else rand
    exponent = min(attempts - 1, 62)  # 2**62 * base is past any cap; avoids huge floats
    ceiling = min(cap.total_seconds(), base.total_seconds() * 2.0**exponent)
    return timedelta(seconds=ceiling * (1 - jitter * u))


def next_ripe_at(
    attempts: int,
    now: datetime,
    *,
    base: timedelta,
    cap: timedelta,
    jitter: float,
    rand: float | None = None,
) -> datetime:
    """Return when a job that has failed `attempts` times ripens again: `now` (aware UTC) plus
    `backoff_delay(attempts, ...)`. Raises as `backoff_delay` does."""
    return now + backoff_delay(attempts, base=base, cap=cap, jitter=jitter, rand=rand)
